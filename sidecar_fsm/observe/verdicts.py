"""The verdicts on one record: is its owner alive, what runs at its pid, may its metrics be asked.

Owns the closed sets ``Owner`` and ``Process``, each decided through ``procs``, the identity a
signal to a recorded process must match, and the proof of a metrics address. Another host's pids
mean nothing here (``OTHER_HOST``). Read-only; must not signal, open the database or word a
verdict for people (``view`` does).
"""

from __future__ import annotations

from enum import Enum

from sidecar_fsm.base import procs
from sidecar_fsm.state.fsm import SERVING_METRICS, WITH_PROCESS
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.records import InstanceRecord, RunRecord


class _Verdict(str, Enum):
    """A verdict that reads as its value in text, JSON and comparisons (``StrEnum`` is 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Owner(_Verdict):
    """What became of a run's owner (the launcher that started it). The values are ``--json``'s."""

    ALIVE = "alive"
    DEAD = "dead"
    # The pid now belongs to another process (its start time or executable differ).
    REUSED = "reused"
    # A process lives at the pid but no start time proves it the owner (it may still be one):
    # ``stop`` does not signal it, ``reap`` does not reap it.
    UNPROVEN = "unproven"
    OTHER_HOST = "other host"


class Process(_Verdict):
    """What runs at an instance's recorded pid now. The values are ``--json``'s ``process``."""

    RUNNING = "running"
    # Ours, but stopped by a signal (SIGSTOP, a debugger): it answers nothing until SIGCONT.
    STOPPED = "stopped"
    GONE = "gone"
    REUSED = "reused"
    # A process lives at the pid, but no start time or executable proves it ours: never
    # signalled, and not taken for gone.
    UNPROVEN = "unproven"
    OTHER_HOST = "other host"


# The verdicts of a process proven ours and alive: what a signal may reach and reap ends.
OURS = frozenset({Process.RUNNING, Process.STOPPED})

# The owners whose run is nobody's until ``reap`` closes it.
OWNER_GONE = frozenset({Owner.DEAD, Owner.REUSED})

_OWNER = {"alive": Owner.ALIVE, "dead": Owner.DEAD, "reused": Owner.REUSED, "unproven": Owner.UNPROVEN}
_PROCESS = {
    "alive": Process.RUNNING,
    "dead": Process.GONE,
    "reused": Process.REUSED,
    "unproven": Process.UNPROVEN,
}


def owner_of(run: RunRecord) -> Owner:
    """The verdict on ``run``'s owner now (``procs.pid_status`` of its pid and start time)."""
    if run.host != host_name():
        return Owner.OTHER_HOST
    return _OWNER[procs.pid_status(run.owner_pid, run.owner_start_time)]


def owner_identity(run: RunRecord) -> procs.ProcessIdentity | None:
    """What a signal to ``run``'s owner must match; None when no start time proves it."""
    if run.owner_start_time is None:
        return None
    return procs.ProcessIdentity(pid=run.owner_pid, start_time=run.owner_start_time, exe=None)


def process_of(host: str, inst: InstanceRecord) -> Process | None:
    """What runs at ``inst``'s recorded pid now; None when its state has no process
    (``WITH_PROCESS``) or no pid was recorded. ``host`` is the run's."""
    if inst.state not in WITH_PROCESS or inst.pid is None:
        return None
    if host != host_name():
        return Process.OTHER_HOST
    # Without the executable only half the identity is on record: not enough to signal, so
    # not enough to call the process ours either.
    start_time = inst.pid_start_time if inst.binary else None
    process = _PROCESS[procs.pid_status(inst.pid, start_time, inst.binary or None)]
    return Process.STOPPED if process == Process.RUNNING and procs.is_stopped(inst.pid) else process


def instance_identity(inst: InstanceRecord) -> procs.ProcessIdentity | None:
    """What a signal to ``inst``'s recorded process must match (pid, start time, executable);
    None when the record cannot prove one, and then nothing is signalled."""
    if inst.pid is None or inst.pid_start_time is None or not inst.binary:
        return None
    return procs.ProcessIdentity(pid=inst.pid, start_time=inst.pid_start_time, exe=inst.binary)


def metrics_claimed(inst: InstanceRecord, process: Process | None) -> str | None:
    """The metrics address ``inst`` should be serving now: recorded, in a state that serves
    (``SERVING_METRICS``), its recorded process ours and running; else None."""
    if inst.metrics and inst.state in SERVING_METRICS and process in OURS:
        return inst.metrics
    return None


def metrics_proven(inst: InstanceRecord) -> bool:
    """True when ``inst``'s recorded process itself listens on its recorded metrics address: a dead
    sidecar's port may be another process's by now, whose figures would pass for the proxy's."""
    return bool(inst.pid and inst.metrics and procs.listens_on(inst.pid, inst.metrics))
