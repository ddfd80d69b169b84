"""Child processes of a benchmark, and what /proc says about them.

Owns starting every child in its own session (so killing its process group ends anything it
forked) and ending all of them, whatever happened: ``Children`` is a context manager and its
``close`` is safe to call more than once. Also the /proc readings the figures are made of (CPU
seconds, VmRSS/VmHWM, run-queue wait). Must not signal a process it did not start: a group is
never signalled after its leader was reaped (the pid may then be someone else's).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.harness.waits import BenchError


@dataclass
class Children:
    """Every process the benchmark starts. Each runs in its own session, so killing its
    process group also ends anything it forked; `close` is safe to call more than once."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(list(argv), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen[bytes], grace: float = 3.0) -> int | None:
        """SIGTERM the group, SIGKILL it after `grace`; returns the exit code (None if lost)."""
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(grace)
        # No killpg after the leader is reaped: its pid (the group id) may then be reused by a
        # process that is not ours. None of the children forks, so nothing is left behind.
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return p.returncode

    def close(self) -> None:
        for p in reversed(self.procs):
            self.stop(p, grace=2.0)
        self.procs.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` (from /proc/<pid>/stat), in seconds."""
    data = Path(f"/proc/{pid}/stat").read_text()
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mem_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise BenchError(f"/proc/{pid}/status: no {key}")


def free_port() -> int:
    # Only for HAProxy, which cannot report a port it chose; the window between this close and
    # HAProxy's bind is the one race the benchmark accepts (loopback, nobody else binding).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def schedstat(pid: int) -> tuple[float, float]:
    """Seconds the threads of `pid` alive now have spent on a CPU and waiting in a run queue
    (/proc/<pid>/task/*/schedstat). On a machine shared with other jobs the wait is the part of
    a start-up time that is not the program's doing."""
    on_cpu = queued = 0
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                a, b, _ = (task / "schedstat").read_text().split()
                on_cpu += int(a)
                queued += int(b)
    return on_cpu / 1e9, queued / 1e9
