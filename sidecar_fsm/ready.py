"""The ready-file protocol, launcher side: mirrors ``go/ready.go``.

The sidecar binds its listener first, then writes ``{"pid": <pid>, "listen": "<host:port>"}`` to
a temp file and renames it onto the ready path, so a reader sees either no file or the whole
file. The temp file may be one the launcher prepared (``prepared_temp_path``). This module owns
reading that file, naming the prepared one, and waiting for many sidecars at once.

Waiting is exact, not periodic: inotify (through ctypes) reports the rename into the directory
and a pidfd per child reports its exit, all in one ``poll``. A file counts only when its pid is
the child's pid, so a stale file left by another run is never taken for readiness. Must not
spawn, signal or remove anything: the caller owns the processes and the files.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import select
import struct
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# From <sys/inotify.h>: stable kernel ABI.
_IN_MOVED_TO = 0x00000080
_IN_Q_OVERFLOW = 0x00004000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# A ready file only ever appears by a rename onto its path (the protocol above), so that is the
# one event watched. Creating and closing the temp file, and everything else written in a log
# dir, would each wake the waiter for nothing, on cores its proxies need to start.
_WATCH_MASK = _IN_MOVED_TO
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

# Only when inotify is unavailable (no libc symbol, the per-user instance limit reached, a
# directory that cannot be watched): how often the files are re-read.
_FALLBACK_POLL_SECONDS = 0.01


@dataclass(frozen=True)
class ReadyInfo:
    """The content of a ready file: who wrote it and the address it actually bound."""

    pid: int
    listen: str


@dataclass
class ReadyWait:
    """One child to wait for: its name, the ready path it was told to write, its process."""

    name: str
    ready_path: str
    process: subprocess.Popen[bytes]


@dataclass
class ReadyOutcome:
    """How the wait for one child ended: exactly one of ``info``, ``exit_code``, ``timed_out``."""

    name: str
    info: ReadyInfo | None
    exit_code: int | None
    timed_out: bool


def prepared_temp_path(ready_path: str) -> str:
    """Where a launcher may create, empty, the temporary file the proxy then writes its ready file into.

    Mirrors ``preparedTempName`` in ``go/ready.go``: ``.<ready file name>.tmp`` beside it. The
    proxy renames it onto the ready path once it has written it, so on success nothing is left;
    whoever prepared it removes it if the proxy never got that far. Creating the inode is the
    dearest step of writing the file on some file systems, and the launcher can do it on a core
    that is otherwise idle before the proxy starts.
    """
    directory, base = os.path.split(ready_path)
    return os.path.join(directory, f".{base}.tmp")


def read_ready_file(path: str | os.PathLike[str]) -> ReadyInfo | None:
    """The ready file at ``path``; None when it is missing, partial or not the expected JSON.

    Read-only. A writer that is not atomic can be caught half-way; that reads as None here and
    the caller waits for the next change instead of failing.
    """
    try:
        with open(path, "rb") as file:
            data = json.loads(file.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, listen = data.get("pid"), data.get("listen")
    # bool is an int subclass: {"pid": true} is not a pid.
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if not isinstance(listen, str) or not listen:
        return None
    return ReadyInfo(pid=pid, listen=listen)


@functools.lru_cache(maxsize=1)
def _libc_inotify() -> tuple[Any, Any, Any]:
    """libc's ``inotify_init1``, ``inotify_add_watch`` and ``inotify_rm_watch``, looked up once per process.

    ``CDLL(None)`` searches the symbols already loaded into the interpreter (libc among them);
    ``ctypes.util.find_library`` would run ``ldconfig -p``, 7 ms on every call.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    init1 = libc.inotify_init1
    init1.argtypes = [ctypes.c_int]
    init1.restype = ctypes.c_int
    add_watch = libc.inotify_add_watch
    add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    add_watch.restype = ctypes.c_int
    rm_watch = libc.inotify_rm_watch
    rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    rm_watch.restype = ctypes.c_int
    return init1, add_watch, rm_watch


class _Inotify:
    """A non-blocking inotify instance watching directories for files renamed into them."""

    def __init__(self) -> None:
        init1, self._add_watch, self._rm_watch = _libc_inotify()
        fd = init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.fd: int = fd
        self.dirs: dict[int, str] = {}

    def watch(self, directory: str) -> None:
        wd = self._add_watch(self.fd, os.fsencode(directory), _WATCH_MASK)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), directory)
        self.dirs[wd] = directory

    def read_names(self) -> tuple[set[tuple[str, str]], bool]:
        """Drain pending events: the (directory, name) pairs touched and whether events were lost."""
        touched: set[tuple[str, str]] = set()
        overflow = False
        while True:
            try:
                buffer = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT_HEADER.size <= len(buffer):
                wd, mask, _cookie, length = _EVENT_HEADER.unpack_from(buffer, offset)
                offset += _EVENT_HEADER.size
                raw_name = buffer[offset : offset + length].split(b"\0", 1)[0]
                offset += length
                if mask & _IN_Q_OVERFLOW:
                    overflow = True
                elif wd in self.dirs:
                    touched.add((self.dirs[wd], os.fsdecode(raw_name)))
        return touched, overflow

    def unwatch_all(self) -> None:
        """Remove every watch and drop the events still queued (they name no watched directory now)."""
        for wd in self.dirs:
            self._rm_watch(self.fd, wd)  # fails only for a watch the kernel dropped already
        self.dirs.clear()
        self.read_names()

    def close(self) -> None:
        os.close(self.fd)


# Inotify instances between waits, ready for the next one. Closing an instance tears its watches
# down and waits for an SRCU grace period in the kernel: 10-25 ms measured on a busy 2-core
# machine, twenty times the wait for the event itself, and a thread to close it in the
# background cost 0.2-0.5 ms on a start's serial tail. Removing a watch costs 3 us. So an
# instance is kept for the process's next wait: at most one per concurrent wait is ever made.
_idle_inotify: list[_Inotify] = []
_idle_inotify_lock = threading.Lock()


def _forget_idle_inotify() -> None:
    # A forked child shares the parent's instances: its waits would read the parent's events.
    for inotify in _idle_inotify:
        inotify.close()  # the child's copy of the descriptor; the parent keeps its instance
    _idle_inotify.clear()


os.register_at_fork(after_in_child=_forget_idle_inotify)


def _open_inotify(directories: Iterable[str]) -> tuple[_Inotify | None, set[str]]:
    """An inotify watching ``directories``, and those it could not watch (they fall back to polling).

    Give it back with ``_release_inotify`` once the wait is over.
    """
    wanted = set(directories)
    with _idle_inotify_lock:
        inotify = _idle_inotify.pop() if _idle_inotify else None
    if inotify is None:
        try:
            inotify = _Inotify()
        except (OSError, AttributeError):  # AttributeError: a libc without inotify symbols
            return None, wanted
    unwatched: set[str] = set()
    for directory in sorted(wanted):
        try:
            inotify.watch(directory)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ENOSPC):
                _release_inotify(inotify)
                raise
            unwatched.add(directory)
    return inotify, unwatched


def _release_inotify(inotify: _Inotify) -> None:
    """Keep ``inotify``, without watches, for the next wait (see ``_idle_inotify``)."""
    try:
        inotify.unwatch_all()
    except OSError:
        inotify.close()  # not fit for reuse: pay for the close rather than keep a broken one
        return
    with _idle_inotify_lock:
        _idle_inotify.append(inotify)


def wait_all_ready(waits: list[ReadyWait], timeout: float) -> dict[str, ReadyOutcome]:
    """Wait for every child at once until each is ready, has exited, or ``timeout`` seconds passed.

    Returns one outcome per name. A child is ready when its ready file parses and names the
    child's own pid: a file left by another run (another pid) is ignored until the child
    replaces it. A child that exits first is reaped here and its exit code reported (the file is
    not consulted any more: a dead child is not ready). N children take as long as the slowest
    one, not the sum. Read-only apart from reaping children that exited.

    Exact: the watches are armed before the files are first read, so a rename that happens
    before the watch exists is seen by that first read and one that happens after it produces an
    event; a child's exit wakes the poll through its pidfd. Raises ``ValueError`` for duplicate
    names (the outcomes are keyed by name).
    """
    names = [wait.name for wait in waits]
    if len(set(names)) != len(names):
        raise ValueError(f"wait_all_ready: duplicate names in {names}; names must be unique")
    deadline = time.monotonic() + timeout
    outcomes: dict[str, ReadyOutcome] = {}
    pending: dict[str, ReadyWait] = {wait.name: wait for wait in waits}
    by_file: dict[tuple[str, str], list[str]] = {}
    for wait in waits:
        directory, base = os.path.split(os.path.abspath(wait.ready_path))
        by_file.setdefault((directory, base), []).append(wait.name)

    def check_file(name: str) -> None:
        wait = pending[name]
        info = read_ready_file(wait.ready_path)
        if info is not None and info.pid == wait.process.pid:
            outcomes[name] = ReadyOutcome(name, info, None, False)
            del pending[name]

    def check_exit(name: str) -> None:
        code = pending[name].process.poll()
        if code is not None:
            outcomes[name] = ReadyOutcome(name, None, code, False)
            del pending[name]

    inotify, unwatched = _open_inotify(directory for directory, _ in by_file)
    pidfds: dict[int, str] = {}
    poller = select.poll()
    try:
        if inotify is not None:
            poller.register(inotify.fd, select.POLLIN)
        for wait in waits:
            if wait.process.returncode is not None:
                continue  # reaped already: its pid may name another process by now
            try:
                pidfd = os.pidfd_open(wait.process.pid)
            except ProcessLookupError:  # already reaped: poll() below returns its code
                continue
            pidfds[pidfd] = wait.name
            poller.register(pidfd, select.POLLIN)
        # First look after arming: closes the window in which the file appeared before the watch.
        for name in list(pending):
            check_exit(name)
        for name in list(pending):
            check_file(name)
        fallback = any(directory in unwatched for directory, _ in by_file)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if fallback:
                remaining = min(remaining, _FALLBACK_POLL_SECONDS)
            events = poller.poll(max(1, int(remaining * 1000 + 0.999)))
            recheck: set[str] = set()
            for fd, _mask in events:
                if inotify is not None and fd == inotify.fd:
                    touched, overflow = inotify.read_names()
                    if overflow:
                        recheck.update(pending)
                    for key in touched:
                        recheck.update(by_file.get(key, ()))
                elif fd in pidfds:
                    name = pidfds.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    if name in pending:
                        # The pidfd is readable: the child has exited, so wait() returns at once.
                        code = pending[name].process.wait()
                        outcomes[name] = ReadyOutcome(name, None, code, False)
                        del pending[name]
            if fallback:
                recheck.update(
                    name
                    for (directory, _), file_names in by_file.items()
                    if directory in unwatched
                    for name in file_names
                )
            for name in recheck:
                if name in pending:
                    check_file(name)
        for name in pending:
            outcomes[name] = ReadyOutcome(name, None, None, True)
    finally:
        for pidfd in pidfds:
            os.close(pidfd)
        if inotify is not None:
            _release_inotify(inotify)
    return {name: outcomes[name] for name in names}
