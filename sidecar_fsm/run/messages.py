"""The wording of a run's failures: one first line naming the instance and what to do, then its log tail.

Owns the messages the run raises and records, and reading the end of a log for them. Who holds
a port is ``observe``'s judgement, asked as a diagnosis that never fails the caller.
"""

from __future__ import annotations

import errno
import os
import socket

from sidecar_fsm.base.addresses import split_listen
from sidecar_fsm.base.exitstatus import signal_name
from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.observe.runs import listen_holder
from sidecar_fsm.state.store import Store

LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 16384


def log_tail(log_path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a child's log, for error messages; never raises. Reads only
    the end of the file: a sidecar that ran for days has a long log."""
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
    """``first_line`` (our diagnosis) then the log's tail, kept whole: the proxy's own words,
    which NeMo Gym's callers and tests read there."""
    tail = log_tail(log_path)
    return f"{first_line}\n{tail}" if tail else first_line


def where(name: str, run_id: str, host: str) -> str:
    """How every message names an instance: which sidecar, which run, which host."""
    return f"h2-ping-sidecar '{name}' (run {run_id} on {host})"


# go/main.go's exit codes for a start refused because an address is taken (nothing was bound).
EXIT_LISTEN_IN_USE, EXIT_METRICS_IN_USE = 3, 4


def address_taken(exit_code: int, before_ready: bool, listen: str, codes_known: bool) -> str | None:
    """Which address a proxy that exited found taken: ``"listen"``, ``"metrics"`` or None.

    Only before ready: a proxy binds before it writes its ready file, so a later exit, whatever
    its code, is not a clash (a user-named binary's 3 is its own). Then by its exit code when
    ``codes_known`` (ours, or one that describes itself); else (NeMo Gym's exits 1 on any
    failure) by whether its listen address still refuses a bind.
    """
    if not before_ready:
        return None
    if codes_known:
        return {EXIT_LISTEN_IN_USE: "listen", EXIT_METRICS_IN_USE: "metrics"}.get(exit_code)
    return "listen" if exit_code != 0 and _bind_refused(listen) else None


def _bind_refused(listen: str) -> bool:
    try:
        host, port = split_listen(listen)
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go binds: TIME_WAIT is no holder
            probe.bind(address)
    except OSError as error:
        return error.errno == errno.EADDRINUSE
    except ValueError:
        return False
    return False


def exit_message(place: str, exit_code: int, before_ready: bool, log_path: str) -> str:
    """The first line for a process that exited."""
    when = "before it was ready" if before_ready else "unexpectedly"
    return f"{place}: {exit_words(exit_code)} {when}; see {log_path}"


def exit_words(exit_code: int) -> str:
    """``exited with code 1``, or ``exited with code 137 (killed by SIGKILL)`` for a signal:
    128 + N as a shell, Docker and Kubernetes say it, never Python's -N. The instance_summary
    view reads these words in every database already written: keep them."""
    name = signal_name(exit_code)
    if name is None:
        return f"exited with code {exit_code}"
    return f"exited with code {128 - exit_code} (killed by {name})"


def port_clash_message(index: int, listen: str, store: Store | None, run_id: str) -> str:
    """``sidecar.instances[i].listen`` is taken: by which run and instance if the database knows."""
    place = f"sidecar.instances[{index}].listen: '{listen}'"
    try:
        holder = None if store is None else listen_holder(store, listen, run_id)
    except Exception:
        holder = None  # a diagnosis; never let it hide the failure it explains
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
