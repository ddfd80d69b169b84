"""The wording of a run's failures: one first line naming the instance and what to do, then its log tail.

Owns the messages ``supervise`` raises and records (exit before ready, unexpected exit, a port
already in use and by whom, a log that cannot be created) and reading the end of a log for them.
Must not change state or signal anything; the one database read (who holds a port) is a
diagnosis and never fails the caller.
"""

from __future__ import annotations

import os

from sidecar_fsm.base import procs
from sidecar_fsm.base.exitstatus import signal_name
from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.config import is_loopback_host
from sidecar_fsm.state.fsm import NON_TERMINAL
from sidecar_fsm.state.store import InstanceRecord, Store

LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 16384


def log_tail(log_path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a child's log, for error messages; never raises.

    Reads only the end of the file: a sidecar that ran for days has a long log.
    """
    try:
        with open(log_path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - _LOG_TAIL_BYTES))
            data = log.read()
    except OSError as exc:
        return f"(log {log_path} unreadable: {exc.strerror or exc})"
    text = data.decode(errors="replace").splitlines()
    if size > _LOG_TAIL_BYTES and text:
        text = text[1:]  # the first line is probably cut
    return "\n".join(text[-lines:]) or "(empty log)"


def with_log_tail(first_line: str, log_path: str) -> str:
    """``first_line`` (our diagnosis: which port, taken by whom) then the log's tail (the proxy's
    own words, "cannot bind ...: address already in use" among them).

    The tail is kept whole, even where it repeats that a port is taken: it is the evidence the
    first line rests on, and NeMo Gym's callers and tests read it there.
    """
    tail = log_tail(log_path)
    return f"{first_line}\n{tail}" if tail else first_line


def where(name: str, run_id: str, host: str) -> str:
    """How every message names an instance: which sidecar, which run, which host."""
    return f"h2-ping-sidecar '{name}' (run {run_id} on {host})"


def exit_message(
    place: str,
    exit_code: int,
    before_ready: bool,
    log_path: str,
    port_clash: str | None,
    metrics_clash: tuple[str, str] | None = None,
) -> str:
    """The first line for a process that exited; a port clash replaces it when the log says so.

    ``metrics_clash`` is (the fixed metrics address, its message): when the proxy's own "address
    already in use" line names that address, the metrics port is the one taken, not the listen.
    """
    clash_lines = [line for line in log_tail(log_path).splitlines() if "address already in use" in line]
    if metrics_clash is not None and any(metrics_clash[0] in line for line in clash_lines):
        return metrics_clash[1]
    if port_clash is not None and clash_lines:
        return port_clash
    when = "before it was ready" if before_ready else "unexpectedly"
    return f"{place}: {exit_words(exit_code)} {when}; see {log_path}"


def exit_words(exit_code: int) -> str:
    """``exited with code 1``, or ``exited with code 137 (killed by SIGKILL)`` for a signal.

    128 + N is how a shell, Docker and Kubernetes report a death by signal N, never Python's -N;
    the words "exited with code ..." are also what the instance_summary view's reason reads
    ("exited while ready", "drain failed"), in every database already written.
    """
    name = signal_name(exit_code)
    if name is None:
        return f"exited with code {exit_code}"
    return f"exited with code {128 - exit_code} (killed by {name})"


def port_clash_message(index: int, listen: str, store: Store | None, run_id: str) -> str:
    """``sidecar.instances[i].listen`` is taken: by which run and instance if the database knows."""
    place = f"sidecar.instances[{index}].listen: '{listen}'"
    holder = _listen_holder(listen, store, run_id)
    if holder is None:
        return f"{place} is already in use by another process; stop it or choose another port (or port 0)"
    pid = f"pid {holder.pid}" if holder.pid else "no pid yet"
    log_dir = store.path.parent.parent if store is not None else None
    return (
        f"{place} is already in use by run {holder.run_id} instance '{holder.name}' ({pid}); "
        f"stop that run ({command_hint('stop ' + holder.run_id[:8], log_dir)}, or "
        f"{command_hint('reap', log_dir)} if its launcher is gone) or choose another port"
    )


def metrics_clash_message(index: int, metrics_listen: str) -> str:
    """``sidecar.instances[i].metrics_listen`` is taken (by a process the database cannot name)."""
    return (
        f"sidecar.instances[{index}].metrics_listen: '{metrics_listen}' is already in use by another "
        "process; stop it or choose another port (or port 0)"
    )


def log_failure_message(path: str, error: OSError) -> str:
    """A log (or the log dir) that cannot be created: the path, the reason, what to do."""
    reason = (error.strerror or str(error)).lower()
    return f"sidecar.log_dir: cannot create '{path}' ({reason}); set sidecar.log_dir to a writable folder"


def _listen_holder(listen: str, store: Store | None, run_id: str) -> InstanceRecord | None:
    """The live instance of another run on ``listen`` according to the database, if any."""
    if store is None:
        return None
    try:
        candidates = store.instances_in_states(NON_TERMINAL)
    except Exception:
        return None  # a diagnosis; never let it hide the failure it explains
    # Newest first; a record left non-terminal by a crashed run names the holder only when
    # its process is provably still that sidecar (pid and start time), else it is skipped.
    fallback: InstanceRecord | None = None
    for record in reversed(candidates):
        if record.run_id == run_id or not same_address(record.listen, listen):
            continue
        if record.pid is not None and record.pid_start_time is not None:
            if procs.is_ours(procs.ProcessIdentity(record.pid, record.pid_start_time, None)):
                return record
        elif fallback is None:
            fallback = record
    return fallback


def same_address(a: str, b: str) -> bool:
    """Whether two ``host:port`` listens name the same socket, loopback spellings included."""
    if a == b:
        return True
    host_a, _, port_a = a.rpartition(":")
    host_b, _, port_b = b.rpartition(":")
    if port_a != port_b or port_a == "0":
        return False
    unbracket = str.maketrans("", "", "[]")
    return is_loopback_host(host_a.translate(unbracket)) and is_loopback_host(host_b.translate(unbracket))
