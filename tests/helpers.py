"""Helpers the tests import directly (``from helpers import wait_until``); fixtures live in conftest.

Owns waiting on a condition with a deadline (never a bare sleep to order events), the registry of
processes a test started (so they are ended pass or fail, whole process tree included), ending
what a fixture started (a server, children with nothing to drain), a tiny HTTP/1.1 client for
talking to a sidecar, and the CLI's words a test checks in more than one file. Must not start
anything itself.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, Union

import psutil

T = TypeVar("T")

_POLL_SECONDS = 0.02
_AnyPopen = Union["subprocess.Popen[bytes]", "subprocess.Popen[str]"]


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    message: str | Callable[[], str] = "condition",
    poll: float = _POLL_SECONDS,
) -> T:
    """Poll ``predicate`` every ``poll`` seconds until it returns something truthy; return that value.

    Raises ``AssertionError`` naming ``message`` and the timeout when the deadline passes;
    ``message`` may be a callable, asked at the deadline (to show what was seen by then). An
    exception from ``predicate`` propagates at once (a broken probe is a bug, not a wait).
    The last call happens after the deadline, so a condition that became true just in time wins.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


@dataclass(frozen=True)
class _PidRecord:
    pid: int
    create_time: float


class ProcessRegistry:
    """Processes a test started; ``end_all()`` ends each that still runs, and its descendants.

    Popen objects are reaped by ``wait``; bare pids (a grandchild whose pid a
    test learned from a ready file) are recorded with their start time so a pid reused by an
    unrelated process after ours exited is never signalled. Thread-safe. Registries nest: a
    test's registry also records into the session's, which is the safety net for session-scoped
    fixtures.
    """

    def __init__(self, parent: ProcessRegistry | None = None) -> None:
        self._parent = parent
        self._lock = threading.Lock()
        self._popens: list[_AnyPopen] = []
        self._pids: list[_PidRecord] = []

    def add(self, proc: _AnyPopen) -> _AnyPopen:
        with self._lock:
            self._popens.append(proc)
        if self._parent is not None:
            self._parent.add(proc)
        return proc

    def append(self, proc: _AnyPopen) -> None:
        """Same as ``add``: a registry reads like the list of processes it is."""
        self.add(proc)

    def add_pid(self, pid: int) -> None:
        try:
            record = _PidRecord(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return
        with self._lock:
            self._pids.append(record)
        if self._parent is not None:
            self._parent.add_pid(pid)

    def end_all(self, grace: float = 5.0) -> list[str]:
        """SIGTERM every live process and its descendants, SIGKILL what is left after ``grace``.

        Returns a description of each process that was still running. Idempotent.
        """
        with self._lock:
            popens, pids = list(self._popens), list(self._pids)
        targets: dict[int, psutil.Process] = {}
        ended: list[str] = []
        for proc in popens:
            if proc.poll() is None:
                ended.append(f"pid {proc.pid}: {_describe(proc.args)}")
                _collect(proc.pid, None, targets)
        for record in pids:
            if _collect(record.pid, record.create_time, targets):
                ended.append(f"pid {record.pid}")
        # Descendants were collected before anything was signalled: once a parent dies its
        # children are re-parented and could no longer be found through it.
        for process in targets.values():
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(list(targets.values()), timeout=grace)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=grace)
        for proc in popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        return ended


def kill_and_reap(processes: Iterable[_AnyPopen], timeout: float = 30.0) -> None:
    """SIGKILL each of ``processes`` that still runs, reap every one and close its pipes: the
    teardown of a test whose children hold nothing to drain (``ProcessRegistry`` gives a SIGTERM
    first, and a grace, to those that do)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def terminate_and_reap(process: _AnyPopen, grace: float) -> None:
    """SIGTERM ``process`` (a server a fixture started), reap it, SIGKILL it if it still runs after
    ``grace`` seconds: a fixture's teardown waits for its server's own shutdown, but never hangs."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)


def _collect(pid: int, create_time: float | None, targets: dict[int, psutil.Process]) -> bool:
    try:
        process = psutil.Process(pid)
        if create_time is not None and abs(process.create_time() - create_time) > 0.01:
            return False
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            return False
        targets[pid] = process
        for child in process.children(recursive=True):
            targets[child.pid] = child
    except psutil.Error:
        return False
    return True


def _describe(args: object) -> str:
    if isinstance(args, (list, tuple)):
        return " ".join(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args)[:200]
    return str(args)[:200]


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def http11_request(
    host: str,
    port: int,
    path: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: Sequence[tuple[str, str]] = (),
    timeout: float = 30.0,
) -> HttpResponse:
    """One plain HTTP/1.1 request (``http.client``), as NeMo Gym's aiohttp sends to a sidecar."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return HttpResponse(response.status, response.getheaders(), response.read())
    finally:
        connection.close()


# The installed console script, as a user runs it (the venv's bin/ beside this interpreter).
SIDECAR_FSM = Path(sys.executable).with_name("sidecar-fsm")


def sidecar_cli(
    log_dir: os.PathLike[str] | str,
    *args: str,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``sidecar-fsm --log-dir LOG_DIR ARGS...`` as a user runs it: a real process, its exit
    code and its two outputs as text (``env`` replaces the environment when given)."""
    return subprocess.run(
        [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(log_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def missing_log_dir_line(command: str, log_dir: os.PathLike[str] | str) -> str:
    """The whole of stderr from ``sidecar-fsm COMMAND`` given a log dir that does not exist (it
    exits 1): every reader and upkeep command says it in these words, never "no runs"."""
    return (
        f"sidecar-fsm {command}: log dir '{log_dir}' does not exist; "
        "give the --log-dir (or SIDECAR_FSM_LOG_DIR) the run was started with\n"
    )


def fill_filesystem(point: Path) -> Path:
    """Write a file under ``point`` until its filesystem is full (ENOSPC); returns the file, so a
    test can free the space later. Meant for a small tmpfs (``make_tmpfs``): the loop is bounded."""
    filler = point / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                for _ in range(200_000):  # bounded: far above any tmpfs made here
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    assert os.statvfs(point).f_bavail == 0
    return filler
