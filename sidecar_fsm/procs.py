"""Process identity and signals: the only code in sidecar-fsm that starts or signals a process.

Owns spawning a sidecar in its own session, reading a process's identity (pid, start time,
executable) with psutil, deciding whether a recorded identity is still that process
(:func:`is_ours`), and every signal sent to a sidecar, always through a pidfd.

Must not open the database, change any state or trust a pid alone: a crashed run leaves pids in
the database for days, long enough for the kernel to hand the number to an unrelated process.
Waiting is done by polling a pidfd (readable once the process has exited), never by sleep loops.
Linux only (``os.pidfd_open`` needs Linux 5.3, ``signal.pidfd_send_signal`` 5.1).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from .errors import SidecarError

# psutil derives the start time from clock ticks since boot (USER_HZ, 100 per second), so the
# same process always reads the same value while two processes that reuse a pid differ by at
# least one tick. Half a tick absorbs float rounding in whatever stored the record.
_START_TIME_TOLERANCE = 0.005

# After SIGKILL a process normally vanishes within milliseconds; one stuck in uninterruptible
# sleep (NFS, a dying disk) can take longer, and waiting forever for it would hang stop/reap.
_KILL_WAIT_SECONDS = 5.0

TerminateOutcome = Literal["exited", "killed", "not-ours", "gone"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessIdentity:
    """What makes a process the one we started: pid, start time (unix seconds) and executable.

    ``exe`` is the resolved path of the running executable, or None when it was not recorded or
    could not be read; a record with ``exe`` set only matches a process running that file.
    """

    pid: int
    start_time: float
    exe: str | None


def identity_of(pid: int) -> ProcessIdentity | None:
    """The identity of the live process at ``pid``; None when there is none or it is a zombie.

    Read-only. A zombie has exited (only its exit status is left to collect), so it has no
    identity worth matching: it can neither be drained nor be harmed. ``exe`` is None when the
    process belongs to another user and its executable cannot be read.
    """
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            start_time = process.create_time()
            try:
                exe: str | None = process.exe() or None
            except psutil.AccessDenied:
                exe = None
    except psutil.NoSuchProcess:  # ZombieProcess is a subclass: raised by exe() of a zombie too
        return None
    return ProcessIdentity(pid=pid, start_time=start_time, exe=exe)


def start_time_of(pid: int) -> float | None:
    """The start time of the process at ``pid``, as ``identity_of`` reports it; None when there is none.

    For a child this process spawned and has not reaped (its pid cannot have been reused): one
    read of ``/proc/<pid>/stat``, where ``identity_of`` makes three (status, start time,
    executable) through psutil's much larger code path, all while the new proxies start on the
    same cores. The arithmetic is psutil's (clock ticks since boot / ticks per second + boot
    time), so ``is_ours`` compares like with like; a test holds the two to equality.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces and ")".
    fields = data[data.rindex(b")") + 2 :].split()
    return float(fields[19]) / _CLOCK_TICKS + _recent_boot_time()


# (monotonic time it was read, psutil.boot_time()) for start_time_of.
_boot_time_read: tuple[float, float] | None = None
_BOOT_TIME_REUSE_SECONDS = 1.0


def _recent_boot_time() -> float:
    """``psutil.boot_time()``, re-read at most once a second.

    It reads all of /proc/stat (30 us, more with the proxies of a start on the cores), and a
    start reads the start time of each of its children in a row. The value only moves when the
    wall clock is stepped; a start time computed with the value from before a step then
    differs from psutil's reading after it, which ``is_ours`` answers with "not ours", as it
    would for a start time read just before the step.
    """
    global _boot_time_read
    now = time.monotonic()
    if _boot_time_read is None or now - _boot_time_read[0] > _BOOT_TIME_REUSE_SECONDS:
        _boot_time_read = (now, psutil.boot_time())
    return _boot_time_read[1]


def _same_exe(recorded: str, current: str | None) -> bool:
    if current is None:
        # Unreadable executable: identity cannot be proven, so the answer is "not ours".
        return False
    # The record may hold the path the binary was started by (the cache path, maybe through a
    # symlink); /proc holds the resolved file.
    return recorded == current or os.path.realpath(recorded) == current


def is_ours(record: ProcessIdentity) -> bool:
    """True if the process at ``record.pid`` is the one ``record`` describes (start time, exe).

    This is the one function that decides identity. A crashed run leaves pids in the database
    for days, long enough for the number to be reused; a different start time (or a different
    executable, when one was recorded) means another process now holds the pid. A vanished or
    zombie process is not an error: the answer is False. Callers that act on the answer open a
    pidfd first, call this, then signal through the pidfd (see :func:`signal_if_ours`), so a
    pid reused between the check and the signal is never hit. The limit: two processes with
    one pid, one executable and one 10 ms start tick cannot be told apart, which needs the
    whole pid space to wrap within those 10 ms.
    """
    current = identity_of(record.pid)
    if current is None:
        return False
    if abs(current.start_time - record.start_time) >= _START_TIME_TOLERANCE:
        return False
    return record.exe is None or _same_exe(record.exe, current.exe)


def open_log(path: str) -> int:
    """Open (creating it) a sidecar's log for appending: the descriptor ``spawn`` takes as ``log``.

    Append mode, so restarts and concurrent writers never overwrite earlier output; CLOEXEC, so
    no other child inherits it. The caller closes it once the children that write it exist.
    """
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)


class ChildProcess:
    """A child started by :func:`spawn`: its pid and, once reaped, its exit code.

    The part of ``subprocess.Popen``'s interface sidecar-fsm and its tests use (``pid``,
    ``args``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``terminate``), with
    the same meaning: ``returncode`` is negative when a signal ended the child, ``wait(timeout)``
    raises ``subprocess.TimeoutExpired``. Until it is reaped the child's pid cannot be reused,
    so signalling it by pid is safe; once reaped, signals are not sent at all. Thread-safe like
    ``Popen``: one thread reaps, a ``poll`` racing it answers None.

    A handle dropped without ``wait`` leaves a zombie until this process exits (``Popen`` would
    reap it later); the supervisor always waits for its children.
    """

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._waitpid_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChildProcess(pid={self.pid}, returncode={self.returncode})"

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        """The exit code if the child has exited (reaping it), else None. Never blocks."""
        if self.returncode is not None or not self._waitpid_lock.acquire(blocking=False):
            return self.returncode
        try:
            if self.returncode is not None:
                return self.returncode
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped behind our back (SIGCHLD ignored by the host program): the code is
                # lost; Popen reports 0 in this case and so do we.
                self.returncode = 0
                return 0
            return self._reaped(status) if pid == self.pid else None
        finally:
            self._waitpid_lock.release()

    def wait(self, timeout: float | None = None) -> int:
        """Reap the child and return its exit code, waiting up to ``timeout`` seconds (None: forever).

        Blocks on a pidfd, not a sleep loop, so it returns the moment the child exits. Raises
        ``subprocess.TimeoutExpired`` when the child still runs after ``timeout``.
        """
        if self.returncode is not None:
            return self.returncode
        if timeout is not None:
            pidfd = _open_pidfd(self.pid)
            if pidfd is not None:
                try:
                    if not _wait_pidfd(pidfd, timeout):
                        raise subprocess.TimeoutExpired(self.args, timeout)
                finally:
                    os.close(pidfd)
        with self._waitpid_lock:
            if self.returncode is not None:
                return self.returncode
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.returncode = 0
                return 0
            return self._reaped(status)

    def send_signal(self, sig: int) -> None:
        """Signal the child unless it has been reaped (its pid may then be someone else's).

        Through a pidfd, like every signal this module sends: the pidfd names this process even
        if a thread reaps it between the check and the signal.
        """
        self.poll()
        if self.returncode is not None:
            return
        pidfd = _open_pidfd(self.pid)
        if pidfd is None:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, sig)
        finally:
            os.close(pidfd)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def inheritable_fds() -> list[int]:
    """This process's descriptors above 2 that a child would inherit (no close-on-exec flag).

    Python opens everything close-on-exec (PEP 446), but a host program or a library may have
    made a descriptor inheritable; ``spawn`` closes these in the child. Read-only; 60 us.
    """
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                if os.get_inheritable(fd):
                    found.append(fd)
    return found


def spawn(
    argv: list[str], env: dict[str, str], log: str | int, inheritable: Sequence[int] | None = None
) -> ChildProcess:
    """Start ``argv`` in a new session, stdin from /dev/null, stdout and stderr appended to ``log``.

    ``argv[0]`` is the executable's path (no PATH search). ``log`` is a path, or a descriptor
    from ``open_log`` that stays the caller's to close. ``inheritable`` is ``inheritable_fds()``
    read by a caller that starts several children in a row; None reads it here. A new session
    keeps a terminal's Ctrl-C (sent to the foreground process group) away from the sidecar, so
    it drains only when the launcher tells it to. The child inherits no descriptor but its
    three standard ones (the log is close-on-exec, any inheritable descriptor is closed in the
    child): a leaked listening socket or lock would outlive the launcher inside the sidecar.
    It starts with no signal blocked and SIGPIPE, SIGXFSZ, SIGINT and SIGTERM at their
    defaults (Python ignores the first two; a host program may ignore or block the others, and
    a Go program started with SIGTERM blocked or ignored would never drain).

    ``os.posix_spawn`` rather than ``subprocess.Popen``: glibc's vfork-style spawn took 0.12 ms
    less of the launcher's time per child, and 0.5 ms less of a warm start of 4 (60 paired
    starts), where the children are launched one after another while the first ones already
    compete for the cores. When this returns the child's exec of ``argv[0]`` is past its point
    of no return (glibc waits for it and reports its error), so :func:`identity_of` on its pid
    reads the sidecar's executable, not a copy of the launcher; the kernel may still be closing
    the close-on-exec descriptors for a moment, before any of the new program's code runs.
    Raises ``OSError`` when the executable cannot be started.
    """
    log_fd = log if isinstance(log, int) else open_log(log)
    try:
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ]
        if inheritable is None:
            inheritable = inheritable_fds()
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inheritable]
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=actions,
            setsid=True,
            setsigmask=(),
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM),
        )
    finally:
        if not isinstance(log, int):
            os.close(log_fd)
    return ChildProcess(pid, list(argv))


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def _wait_pidfd(pidfd: int, timeout: float | None) -> bool:
    """True once the process behind ``pidfd`` has exited; False when ``timeout`` passed first.

    A pidfd polls readable when its process exits, whether or not it has been reaped yet.
    """
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    timeout_ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return bool(poller.poll(timeout_ms))


def _send(pidfd: int, sig: int, record: ProcessIdentity) -> bool:
    """Signal through the pidfd; False when the process is already gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    except PermissionError as error:
        raise SidecarError(
            f"signal: pid {record.pid} matches its record but cannot be signalled ({error.strerror}); "
            "run sidecar-fsm as the user that started it"
        ) from error
    return True


def signal_if_ours(record: ProcessIdentity, sig: int) -> bool:
    """Send ``sig`` to the process of ``record`` if it still is that process; True if sent.

    The pidfd is opened before the identity check and the signal goes through it: a pidfd
    names one process, not a number, so if the process exits and its pid is reused after the
    check, the signal fails with "no such process" instead of hitting the newcomer. False when
    the process is gone or the pid belongs to another process. Raises ``SidecarError`` when the
    process matches but we are not allowed to signal it.
    """
    pidfd = _open_pidfd(record.pid)
    if pidfd is None:
        return False
    try:
        return is_ours(record) and _send(pidfd, sig, record)
    finally:
        os.close(pidfd)


def terminate(record: ProcessIdentity, grace: float, *, send_sigterm: bool = True) -> TerminateOutcome:
    """End the process of ``record``: SIGTERM, wait up to ``grace`` seconds, then SIGKILL and wait.

    ``send_sigterm=False`` is for a process already draining on its own (a sidecar whose
    ``-exit-with-pid`` owner died): the proxy takes a second SIGTERM as "stop draining now", so
    the caller only waits out the grace and SIGKILLs what is left.

    Returns ``"exited"`` (it ended within the grace), ``"killed"`` (SIGKILL was needed),
    ``"not-ours"`` (another live process holds the pid: nothing was sent) or ``"gone"`` (no live
    process at the pid, or it exited before we signalled it). Waiting polls the pidfd, so the
    call returns the moment the process exits. For our own child the exit leaves a zombie: the
    caller still reaps it with ``ChildProcess.wait()`` (which then returns at once with the code).
    """
    pidfd = _open_pidfd(record.pid)
    if pidfd is None:
        return "gone"
    try:
        if not is_ours(record):
            # identity_of is None for a zombie or a vanished process: nothing left to end.
            return "gone" if identity_of(record.pid) is None else "not-ours"
        if send_sigterm and not _send(pidfd, signal.SIGTERM, record):
            return "gone"
        if _wait_pidfd(pidfd, grace):
            return "exited"
        if not _send(pidfd, signal.SIGKILL, record):
            return "exited"
        _wait_pidfd(pidfd, _KILL_WAIT_SECONDS)
        return "killed"
    finally:
        os.close(pidfd)


def wait_exit(child_or_pid: ChildProcess | int, timeout: float | None) -> int | None:
    """Wait up to ``timeout`` seconds (None: forever) for a process to exit; None if it still runs.

    For a ``ChildProcess`` the child is reaped and its return code returned (negative: killed
    by that signal); the wait blocks on a pidfd, so it returns the moment the child exits. For
    a bare pid, the code is returned only when that pid is our own child; for any other process
    the code is unknowable and -1 means "it exited".
    """
    if not isinstance(child_or_pid, int):
        try:
            return child_or_pid.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    pid = child_or_pid
    pidfd = _open_pidfd(pid)  # None: already gone
    if pidfd is not None:
        try:
            if not _wait_pidfd(pidfd, timeout):
                return None
        finally:
            os.close(pidfd)
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if reaped else -1
