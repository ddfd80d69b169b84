"""Crash points: every place of a start, a stop or a reap where the process may die, by name.

Owns the one list of points (``POINTS``) and ``hit(point)``, which the lifecycle modules call
right after each commit, spawn or signal whose aftermath a crash could leave half done. A point
is inert unless a test enables it. TEST ONLY: the environment variable
``SIDECAR_FSM_CRASH_AT=<point>[:<n>]`` (read once, at the first ``hit``) makes the n-th hit of
that point (default the first) SIGKILL this process, so the test can check that ``status``
tells the truth and ``reap`` leaves nothing behind from exactly there. SIGKILL, not an
exception: a real crash runs no ``finally`` and no ``atexit``. Must not decide or record
anything; a test (``test_crash_points``) fails when a commit, spawn or signal site of the
lifecycle modules is not followed by a point, or a point is listed but never hit.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "SIDECAR_FSM_CRASH_AT"

# Point -> where it sits. Grouped as a start, a supervision, a stop and a reap go.
POINTS: dict[str, str] = {
    "run-recorded": "the run and its instances are on record (configured), no process yet",
    "launched": "a process was started (start or restart), its pid not yet on record",
    "spawn-recorded": "an instance's build+spawn with its pid committed, before the next launch",
    "launch-failed-recorded": "a process could not be started and its build is on record",
    "ready-recorded": "the run's ready transitions committed, before the addresses are used",
    "rewritten": "the caller's config was rewritten with the bound addresses",
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

_enabled: tuple[str, int] | None = None
_read = False
_hits: dict[str, int] = {}


def _parse(value: str) -> tuple[str, int] | None:
    point, _, nth = value.partition(":")
    if point not in POINTS:
        # A typo would make the test silently pass without crashing anywhere.
        raise ValueError(f"{ENV_VAR}: '{value}' is not a crash point; points are {sorted(POINTS)}")
    if nth and not (nth.isdigit() and int(nth) > 0):
        raise ValueError(f"{ENV_VAR}: '{value}' must end in ':N' with N >= 1, or name the point alone")
    return point, int(nth or 1)


def hit(point: str) -> None:
    """Pass ``point``; SIGKILL this process when it is the enabled one's n-th hit. Test only."""
    global _enabled, _read
    if not _read:
        value = os.environ.get(ENV_VAR)
        _enabled = _parse(value) if value else None
        _read = True
    if point not in POINTS:
        raise ValueError(f"crashpoints.hit: '{point}' is not in POINTS; add it there")
    if _enabled is None or _enabled[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] == _enabled[1]:
        os.kill(os.getpid(), signal.SIGKILL)
