"""Crash points: every place of a start, a stop or a reap where the process may die, by name.

The lifecycle modules call ``hit(point)`` right after each commit, spawn or signal whose
aftermath a crash could leave half done (``test_crash_points`` checks every site). Inert unless
a test sets ``SIDECAR_FSM_CRASH_AT=<point>[:<n>][@SIGNAL][,...]`` (read at the first ``hit``): the
n-th hit (default the first) sends SIGNAL (default SIGKILL: a real crash runs no ``finally``) to
this process. Any other signal is announced on stderr with its CLOCK_MONOTONIC time, so a test
can time the answer; ``@MARK`` only announces the point.
"""

from __future__ import annotations

import os
import signal
import sys
import time

ENV_VAR = "SIDECAR_FSM_CRASH_AT"

# Point -> where it sits. Grouped as a start, a supervision, a stop and a reap go.
POINTS: dict[str, str] = {
    "binary-resolved": "the config is valid and the binary found (or built); nothing recorded or started",
    "store-opened": "the state database is open (migrated), no run recorded",
    "logs-created": "the run's logs exist, the run not yet recorded",
    "run-recorded": "the run and its instances are on record (configured), no process yet",
    "launched": "a process was started (start or restart), its pid not yet on record",
    "spawn-recorded": "an instance's build+spawn with its pid committed, before the next launch",
    "launch-failed-recorded": "a process could not be started and its build is on record",
    "ready-recorded": "the run's ready transitions committed, before the addresses are used",
    "targets-written": "the Prometheus target file names the ready proxies",
    "upstreams-checked": "every proxy's first upstream check is in (or upstream_check is off)",
    "rewritten": "the caller's config was rewritten with the bound addresses",
    "started": "start_h2_ping_sidecar printed what it changed, about to return the manager",
    "restart-recorded": "a restarted process's pid is committed, before it is awaited",
    "fail-recorded": "an instance's failure committed",
    "stop-recorded": "an instance without a process committed as stopped",
    "drain-recorded": "an instance's drain committed, before its SIGTERM",
    "sigterm-sent": "a SIGTERM of a stop went out (the n-th of n is the last), the drain not yet awaited",
    "sigkill-sent": "a process that outlived its grace (or never got ready) was SIGKILLed",
    "stopped-recorded": "a drained instance committed as stopped",
    "run-ended": "the run row's end committed",
    "traffic-recorded": "proxies' traffic figures committed (an import repeated after it changes nothing)",
    "reap-drain-recorded": "reap committed an instance's drain, before its signal",
    "reap-ended": "reap ended (or found gone) an instance's processes, before it records that",
    "reap-failed-recorded": "reap committed an instance as failed",
    "reap-run-ended": "reap committed its run as reaped",
    "stop-requested": "sidecar-fsm stop sent SIGTERM to a run's owner, before awaiting the run's end",
}

# The signals a point may send: a crash, a Ctrl-C, a process manager's stop; or only a mark.
SIGNALS = ("SIGKILL", "SIGINT", "SIGTERM", "MARK")

_Enabled = tuple[str, int, "signal.Signals | None"]

_enabled: list[_Enabled] = []
_read = False
_hits: dict[str, int] = {}


def _parse(value: str) -> _Enabled:
    where, _, name = value.partition("@")
    point, _, nth = where.partition(":")
    if point not in POINTS:
        # A typo would make the test silently pass without crashing anywhere.
        raise ValueError(f"{ENV_VAR}: '{value}' is not a crash point; points are {sorted(POINTS)}")
    if nth and not (nth.isdigit() and int(nth) > 0):
        raise ValueError(f"{ENV_VAR}: '{value}' must end in ':N' with N >= 1, or name the point alone")
    if name and name not in SIGNALS:
        raise ValueError(f"{ENV_VAR}: '{value}': '@{name}' is not one of {', '.join(SIGNALS)}")
    return point, int(nth or 1), None if name == "MARK" else signal.Signals[name or "SIGKILL"]


def hit(point: str) -> None:
    """Pass ``point``; signal this process when it is an enabled one's n-th hit. Test only."""
    global _enabled, _read
    if not _read:
        value = os.environ.get(ENV_VAR)
        _enabled = [_parse(one) for one in value.split(",")] if value else []
        _read = True
    if point not in POINTS:
        raise ValueError(f"crashpoints.hit: '{point}' is not in POINTS; add it there")
    if not _enabled:
        return
    _hits[point] = _hits.get(point, 0) + 1
    for enabled, nth, sig in _enabled:
        if enabled != point or _hits[point] != nth:
            continue
        if sig != signal.SIGKILL:
            name = sig.name if sig else "MARK"
            sys.stderr.write(f"{ENV_VAR}: {name} at {point} t={time.monotonic():.6f}\n")
            sys.stderr.flush()
        if sig is not None:
            os.kill(os.getpid(), sig)
