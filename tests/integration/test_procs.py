"""procs on real processes: spawn, identity, and signals that never hit a process that is not ours."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers import kill_and_reap, wait_until

from sidecar_fsm.base import procs, ready
from sidecar_fsm.base.procs import ProcessIdentity

SLEEP = shutil.which("sleep") or "/bin/sleep"
# Ignores SIGTERM, and says so on stdout once the handler is installed.
IGNORE_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('armed', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; all killed and reaped afterwards, pass or fail."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    kill_and_reap(processes)


def _spawn(started: list[subprocess.Popen[bytes]], argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    process = procs.spawn(argv, dict(os.environ), str(log))
    started.append(process)
    return process


def _running_identity(process: subprocess.Popen[bytes]) -> ProcessIdentity:
    """The identity of a child that must still run: ``None`` is the test's set-up failing."""
    identity = procs.identity_of(process.pid)
    assert identity is not None, f"pid {process.pid} is not running"
    return identity


Sleeper = Callable[[], tuple[subprocess.Popen[bytes], ProcessIdentity]]


@pytest.fixture
def sleeper(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> Sleeper:
    """``sleeper()``: a ``sleep 30`` started by ``procs.spawn``, and its identity taken while it
    surely runs (the record a test later holds against whatever has that pid)."""

    def spawn() -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
        process = _spawn(started, [SLEEP, "30"], tmp_path / "log")
        return process, _running_identity(process)

    return spawn


def _wait_for_text(path: Path, text: str, timeout: float = 10.0) -> None:
    wait_until(lambda: text in path.read_text(errors="replace"), timeout, f"{text!r} in {path}")


def test_spawn_new_session_devnull_stdin_log_appended_and_no_inherited_fds(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "child.log"
    log.write_text("earlier run\n")
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)  # a descriptor the child must still not inherit
    try:
        child = _spawn(started, [SLEEP, "30"], log)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert os.getsid(child.pid) == child.pid
    assert os.getpgid(child.pid) == child.pid

    # Popen returns once the exec succeeded; the kernel may still be closing the close-on-exec
    # descriptors for a moment, before any of the new program's code runs.
    def child_fds() -> list[int]:
        return sorted(int(fd) for fd in os.listdir(f"/proc/{child.pid}/fd"))

    wait_until(lambda: child_fds() == [0, 1, 2], 10, "the child's descriptors to be exactly 0, 1 and 2")
    assert os.readlink(f"/proc/{child.pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{child.pid}/fd/1") == str(log)
    assert os.readlink(f"/proc/{child.pid}/fd/2") == str(log)
    flags = Path(f"/proc/{child.pid}/fdinfo/1").read_text().split("flags:")[1].split()[0]
    assert int(flags, 8) & os.O_APPEND

    echo = _spawn(
        started, [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], log
    )
    assert procs.wait_exit(echo, 10) == 0
    assert log.read_text().splitlines() == ["earlier run", "out", "err"]


def _signal_set(status: str, field: str) -> set[int]:
    """The signal numbers of a /proc/<pid>/status mask line (SigBlk, SigIgn)."""
    line = next(line for line in status.splitlines() if line.startswith(f"{field}:"))
    mask = int(line.split()[1], 16)
    return {number for number in range(1, 65) if mask & (1 << (number - 1))}


def test_proxy_drains_on_sigterm_even_when_the_host_blocks_or_ignores_it(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], sidecar_binary: Path
) -> None:
    """A host that blocks SIGTERM or ignores SIGINT/SIGTERM hands that on to its children.

    The Go runtime unblocks both and installs its handlers at start, so the proxy still drains
    on the launcher's SIGTERM; Python's ignored SIGPIPE is put back to its default by spawn.
    """
    ready_path = tmp_path / "proxy.ready"
    argv = [str(sidecar_binary), "-listen", "127.0.0.1:0", "-upstream", "https://127.0.0.1:9"]
    argv += ["-ready-file", str(ready_path)]
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        child = _spawn(started, argv, tmp_path / "log")
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    wait_until(lambda: ready.read_ready_file(ready_path, child.pid), 10, "the proxy's ready file")
    status = Path(f"/proc/{child.pid}/status").read_text()
    assert _signal_set(status, "SigBlk") & {signal.SIGINT, signal.SIGTERM} == set()
    assert _signal_set(status, "SigIgn") & {signal.SIGINT, signal.SIGTERM, signal.SIGPIPE} == set()
    record = _running_identity(child)
    assert procs.signal_if_ours(record, signal.SIGTERM)
    assert procs.wait_exit(child, 10) == 0


def test_spawn_failure_raises_oserror_and_leaves_no_child(tmp_path: Path) -> None:
    not_executable = tmp_path / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    before = {child.pid for child in psutil.Process().children()}
    for argv, error in (
        ([str(tmp_path / "missing")], FileNotFoundError),
        ([str(not_executable)], PermissionError),
    ):
        with pytest.raises(error):
            procs.spawn(argv, dict(os.environ), str(tmp_path / "log"))
    # Popen reaps a child whose exec failed before it raises: no zombie is left.
    assert {child.pid for child in psutil.Process().children()} == before


def test_identity_of_a_live_process_and_none_once_it_exits(sleeper: Sleeper) -> None:
    child, identity = sleeper()
    assert identity.pid == child.pid
    assert identity.exe == os.path.realpath(SLEEP)  # the exec'd program, not a copy of python
    assert abs(identity.start_time - time.time()) < 30
    assert procs.is_ours(identity)
    assert procs.is_ours(ProcessIdentity(child.pid, identity.start_time, None))
    assert procs.is_ours(ProcessIdentity(child.pid, identity.start_time, SLEEP))  # unresolved path

    child.kill()
    pidfd = os.pidfd_open(child.pid)
    try:
        procs._wait_pidfd(pidfd, 10)  # exited, not reaped yet: a zombie
    finally:
        os.close(pidfd)
    assert procs.identity_of(child.pid) is None
    assert not procs.is_ours(identity)
    assert procs.terminate(identity, 1) == "gone"
    child.wait()
    assert procs.identity_of(child.pid) is None
    assert not procs.signal_if_ours(identity, signal.SIGTERM)
    assert procs.terminate(identity, 1) == "gone"


def test_record_with_other_start_time_or_exe_is_never_signalled(sleeper: Sleeper) -> None:
    """A record whose pid now belongs to an unrelated process: nothing is sent, it survives."""
    unrelated, actual = sleeper()
    records = [
        ProcessIdentity(unrelated.pid, actual.start_time - 3600, actual.exe),
        ProcessIdentity(unrelated.pid, actual.start_time + 0.01, None),
        ProcessIdentity(unrelated.pid, actual.start_time, "/opt/other/h2-ping-sidecar"),
    ]
    for record in records:
        assert not procs.is_ours(record)
        assert not procs.signal_if_ours(record, signal.SIGKILL)
        assert procs.terminate(record, 0.1) == "not-ours"
    assert procs.wait_exit(unrelated, 0.2) is None
    assert procs.identity_of(unrelated.pid) == actual


def _spawn_at_pid(
    started: list[subprocess.Popen[bytes]], pid: int, log: Path
) -> subprocess.Popen[bytes] | None:
    """Start `sleep` so the kernel hands it ``pid`` (needs a writable ns_last_pid); None if it did not."""
    for _ in range(20):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        process = _spawn(started, [SLEEP, "30"], log)
        if process.pid == pid:
            return process
        process.kill()  # another process on the machine took the pid first: try again
        process.wait()
    return None


def test_real_pid_reuse_is_never_signalled(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], sleeper: Sleeper
) -> None:
    """The recorded process exits and the kernel gives its pid to a newcomer: the newcomer survives."""
    first, record = sleeper()
    first.kill()
    first.wait()
    # Start times are boot time + clock ticks (10 ms) since boot: let a few ticks pass, on that
    # clock, so the two forks differ (wall-clock time can be a second off psutil's values).
    wait_until(
        lambda: psutil.boot_time() + time.clock_gettime(time.CLOCK_BOOTTIME) >= record.start_time + 0.05,
        5,
        "a few clock ticks past the first process's start",
        poll=0.01,
    )
    newcomer = _spawn_at_pid(started, record.pid, tmp_path / "log")
    if newcomer is None:
        pytest.skip("cannot steer pid allocation here (/proc/sys/kernel/ns_last_pid not writable)")
    assert not procs.is_ours(record)
    assert not procs.signal_if_ours(record, signal.SIGKILL)
    assert procs.terminate(record, 0.1) == "not-ours"
    assert procs.wait_exit(newcomer, 0.2) is None


def test_terminate_cooperative_process_returns_as_soon_as_it_exits(sleeper: Sleeper) -> None:
    child, record = sleeper()
    began = time.monotonic()
    assert procs.terminate(record, 10) == "exited"
    elapsed = time.monotonic() - began
    assert elapsed < 1.0, f"terminate took {elapsed:.3f}s for a process that exits on SIGTERM"
    assert procs.wait_exit(child, 1) == -signal.SIGTERM


def test_process_ignoring_sigterm_is_killed_after_grace(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "log"
    child = _spawn(started, [sys.executable, "-c", IGNORE_TERM], log)
    _wait_for_text(log, "armed")
    record = _running_identity(child)
    grace = 0.3
    began = time.monotonic()
    assert procs.terminate(record, grace) == "killed"
    elapsed = time.monotonic() - began
    assert grace <= elapsed < grace + 2.0
    assert procs.wait_exit(child, 1) == -signal.SIGKILL


def test_signal_if_ours_reaches_our_process(sleeper: Sleeper) -> None:
    child, record = sleeper()
    assert procs.signal_if_ours(record, signal.SIGUSR1)
    assert procs.wait_exit(child, 10) == -signal.SIGUSR1


def test_wait_exit_times_out_then_returns_code(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    child = _spawn(
        started, [sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(7)"], tmp_path / "l"
    )
    assert procs.wait_exit(child, 0.01) is None
    assert procs.wait_exit(child, 10) == 7
    assert procs.wait_exit(child, 0) == 7  # already reaped: the remembered code

    other = _spawn(started, [SLEEP, "30"], tmp_path / "log")
    assert procs.wait_exit(other.pid, 0.01) is None
    other.kill()
    assert procs.wait_exit(other.pid, 10) == -signal.SIGKILL  # our child by pid: reaped, code known


def test_wait_exit_on_a_process_that_is_not_our_child(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """Its exit is seen through the pidfd; its code belongs to its parent, so -1 says "exited"."""
    shell = _spawn(started, ["/bin/sh", "-c", f"{SLEEP} 0.5 & echo $!"], tmp_path / "log")
    assert procs.wait_exit(shell, 10) == 0
    orphan = int((tmp_path / "log").read_text().split()[0])
    assert procs.wait_exit(orphan, 0.01) is None
    assert procs.wait_exit(orphan, 10) == -1


def test_find_ours_proves_an_unrecorded_process_by_exe_ready_path_and_start(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """What reap relies on when a launcher died between a spawn and its commit: no pid on record."""
    ready_path = str(tmp_path / "h2ping-policy-node7-4c1e9a.ready")
    body = "import time; time.sleep(60)"
    ours = _spawn(started, [sys.executable, "-c", body, "-ready-file", ready_path], tmp_path / "ours.log")
    other_path = _spawn(
        started, [sys.executable, "-c", body, "-ready-file", ready_path + "x"], tmp_path / "other.log"
    )
    flag_elsewhere = _spawn(started, [sys.executable, "-c", body, ready_path], tmp_path / "bare.log")
    exe = os.path.realpath(sys.executable)
    identity = wait_until(lambda: procs.identity_of(ours.pid), 10, "the child's identity")

    (found,) = procs.find_ours([procs.Claim(exe, ready_path, time.time() - 60)])[ready_path]
    assert (found.pid, found.start_time, found.ready_path) == (ours.pid, identity.start_time, ready_path)
    assert procs.is_ours(found)
    assert all(process.pid != found.pid for process in (other_path, flag_elsewhere))
    # Another executable, or a process older than the run (by more than the clock's slack): not ours.
    assert procs.find_ours([procs.Claim("/opt/other/h2-ping-sidecar", ready_path, 0.0)]) == {ready_path: []}
    later = procs.find_ours([procs.Claim(exe, ready_path, identity.start_time + 60)])
    assert later == {ready_path: []}
    # The identity found is checked again at signal time: a different path in argv is refused.
    assert not procs.is_ours(ProcessIdentity(ours.pid, identity.start_time, exe, ready_path + "x"))
    assert procs.signal_if_ours(found, signal.SIGKILL)
    assert procs.wait_exit(ours, 5) == -signal.SIGKILL
    assert procs.find_ours([procs.Claim(exe, ready_path, 0.0)]) == {ready_path: []}


def test_a_tied_helper_started_from_a_threaded_parent_dies_with_its_thread(tmp_path: Path) -> None:
    """``start_tied`` from a process with busy threads (as under Gym or a Ray actor): the helper
    runs what it was given, in its own session, and the kernel kills it when the thread that
    started it ends, with nothing run between fork and exec but the exec itself."""
    import threading

    stop = threading.Event()
    lock = threading.Lock()

    def busy() -> None:  # holds a lock on and off, as a logging or import lock would be
        while not stop.is_set():
            with lock:
                time.sleep(0.001)

    spinners = [threading.Thread(target=busy, daemon=True) for _ in range(4)]
    for spinner in spinners:
        spinner.start()
    started: list[subprocess.Popen[bytes]] = []
    try:

        def start() -> None:
            child = procs.start_tied(["/bin/sh", "-c", "echo tied; exec sleep 60"], cwd=tmp_path, env={})
            started.append(child)
            assert child.stdout is not None and child.stdout.readline() == b"tied\n"

        starter = threading.Thread(target=start)
        starter.start()
        starter.join(30)
        (child,) = started
        assert os.getsid(child.pid) == child.pid or child.poll() is not None
        wait_until(lambda: child.poll() is not None, 10, "the helper to die with its thread")
        assert child.returncode == -signal.SIGKILL
    finally:
        stop.set()
        for child in started:
            procs.kill_session(child)


def test_a_tied_helper_that_cannot_start_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        procs.start_tied([str(tmp_path / "missing")], cwd=tmp_path, env={})
    (tmp_path / "plain").write_text("")
    with pytest.raises(PermissionError):
        procs.start_tied([str(tmp_path / "plain")], cwd=tmp_path, env={})
