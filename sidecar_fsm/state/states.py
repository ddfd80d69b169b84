"""An instance's states and the groups every layer names (``TERMINAL``, ``WITH_PROCESS``...).

A leaf: ``fsm`` (which moves an instance between them) and ``store`` (which selects rows by
them) both import it, and it imports nothing, so neither needs the other to name a state.
"""

from __future__ import annotations

__all__ = ["BEFORE_PROCESS", "NON_TERMINAL", "SERVING_METRICS", "STATES", "TERMINAL", "WITH_PROCESS"]

STATES = ("configured", "building", "spawned", "ready", "draining", "stopped", "failed")
TERMINAL = frozenset({"stopped", "failed"})
# The live states: everything not yet terminal (a live instance of an ended run is a record a
# killed launcher left, which ``reap`` closes).
NON_TERMINAL = tuple(state for state in STATES if state not in TERMINAL)
# No process was spawned yet (configured, building): a stop needs no drain.
BEFORE_PROCESS = frozenset({"configured", "building"})
# A process may run (spawned, ready, draining): the states whose recorded pid is judged.
WITH_PROCESS = frozenset({"spawned", "ready", "draining"})
# The proxy serves ``/metrics``: ready, and draining, when an operator watches the requests in
# flight go down (``status``, ``top``, the Prometheus target file).
SERVING_METRICS = frozenset({"ready", "draining"})
