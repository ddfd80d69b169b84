"""Stopping a run from another process: ``sidecar-fsm stop``.

Asks a run's owner (``sidecar-fsm start``, or Gym) to stop as a Ctrl-C would, once its identity
(pid and start time) is proven so a reused pid is never hit, then waits until the run is closed
on record. The owner drains its own children: this never signals a sidecar or writes a row.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sidecar_fsm.base import procs
from sidecar_fsm.observe.runs import RunObservation, observe
from sidecar_fsm.observe.verdicts import Owner, owner_identity, owner_of
from sidecar_fsm.run import crashpoints
from sidecar_fsm.state.store import RunRecord, Store

# How often the wait reads the run row: a stop takes at least one drain, so a tenth of a second
# is fine-grained enough and costs a read each.
POLL_SECONDS = 0.1
# Past the run's shutdown_grace before ``stop`` gives up waiting: the owner kills what outlives
# the grace after its own slack (5 s), then records the end.
WAIT_SLACK_SECONDS = 15.0

Outcome = Literal["closed", "owner-gone", "timeout", "refused"]


@dataclass(frozen=True)
class StopResult:
    """How the wait ended: the run closed (``run`` has its end), its owner exited without
    closing it (``reap`` must), or the timeout passed with the owner still draining; or the
    owner was not asked (``refused``: gone, or not proven the run's; ``observed`` says which)."""

    outcome: Outcome
    run: RunRecord
    waited_seconds: float
    observed: RunObservation | None = None


def stop_run(
    store: Store, run: RunRecord, timeout: float | None, asked: Callable[[float], None]
) -> StopResult:
    """``sidecar-fsm stop``: SIGTERM ``run``'s owner if ``observe`` finds it alive, then wait
    (``timeout``, default the run's recorded grace plus ``WAIT_SLACK_SECONDS``) until the run
    is closed. ``asked(wait)`` is called once the signal is sent, before the wait."""
    from sidecar_fsm.run.reap import recorded_grace_seconds

    observed = observe(store, run)
    if observed.owner != Owner.ALIVE or not ask_owner_to_stop(run):
        return StopResult("refused", run, 0.0, observed)
    wait = timeout if timeout is not None else recorded_grace_seconds(run) + WAIT_SLACK_SECONDS
    asked(wait)
    result = wait_closed(store, run, wait)
    return dataclasses.replace(result, observed=observed)


def ask_owner_to_stop(run: RunRecord) -> bool:
    """SIGTERM the run's owner if it still is the process that started the run; True if sent.

    False when the owner is gone, its pid now belongs to another process, or no start time was
    recorded to prove it. Raises ``SidecarError`` when it is ours but we may not signal it.
    """
    identity = owner_identity(run)
    if identity is None:
        return False
    sent = procs.signal_if_ours(identity, signal.SIGTERM)
    crashpoints.hit("stop-requested")
    return sent


def wait_closed(store: Store, run: RunRecord, timeout: float) -> StopResult:
    """Read ``run``'s row until it has ended, its owner is gone, or ``timeout`` seconds passed.
    Read again once the owner is gone: one that closed the run and exited between two reads
    counts as closed."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        current = store.get_run(run.run_id) or run
        if current.ended_at is not None:
            return StopResult("closed", current, time.monotonic() - started)
        if owner_of(run) != Owner.ALIVE:
            current = store.get_run(run.run_id) or run
            outcome: Outcome = "closed" if current.ended_at is not None else "owner-gone"
            return StopResult(outcome, current, time.monotonic() - started)
        if time.monotonic() >= deadline:
            return StopResult("timeout", current, time.monotonic() - started)
        time.sleep(POLL_SECONDS)
