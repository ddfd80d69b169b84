"""Busy loops: the starved machine of a GPU node (data loaders, servers, a trainer), on demand.

Owns ``busy_loops(n)``: n processes that spin on the CPU for as long as the block runs, each in
its own session, all ended (SIGKILL, then reaped) when it ends, even when the block raises. Used
by bench/starvation.py, bench/interrupt_hunt.py and bench/suite_under_load.py. Must not do
anything but burn CPU: no files, no sockets.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

_SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[list[int]]:
    """Run ``n`` CPU-bound processes for the block; their pids."""
    loops: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            loops.append(subprocess.Popen([sys.executable, "-c", _SPIN], start_new_session=True))
        yield [loop.pid for loop in loops]
    finally:
        for loop in loops:
            with contextlib.suppress(ProcessLookupError):
                loop.kill()
        for loop in loops:
            loop.wait()
