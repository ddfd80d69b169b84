"""Busy loops: the starved machine of a GPU node (data loaders, servers, a trainer), on demand.

Owns ``busy_loops(n)``: n processes that spin on the CPU for as long as the block runs, each in
its own session (``Children``), all ended when it ends, even when the block raises. Used by
bench/starvation.py, bench/interrupt_hunt.py and bench/suite_under_load.py. Must not do anything
but burn CPU: no files, no sockets.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from bench.harness.children import Children


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[list[int]]:
    """Run ``n`` CPU-bound processes for the block; their pids."""
    with Children() as kids:
        yield [kids.start([sys.executable, "-c", "while True: pass"]).pid for _ in range(n)]
