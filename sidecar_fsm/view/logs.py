"""The proxies' logs of a run: the last lines of each, and following them as they grow.

Owns reading the log files a run's instances write (paths from their rows): the last N lines
of each, and a follower that returns the complete lines appended since its last read. Must not
open the database (the caller says when the run has ended), judge processes or print.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

# Read in blocks: a proxy's log is small, but a week-long run's may not be.
_BLOCK = 1 << 16


def prefixed(name: str, line: str, width: int) -> str:
    """``policy | line``: the instance's name padded to ``width`` (0: no prefix)."""
    return f"{name.ljust(width)} | {line}" if width else line


def tail(path: str, count: int | None) -> tuple[list[str], int]:
    """The last ``count`` lines of ``path`` (None: all) and the offset read up to.

    A missing file (never created, or pruned) has no lines. A last line with no newline yet
    (the proxy is writing it) is left for a follower to read whole; its offset is where it
    starts.
    """
    lines: deque[str] = deque(maxlen=count) if count is not None else deque()
    offset = 0
    try:
        with open(path, "rb") as handle:
            pending = b""
            while block := handle.read(_BLOCK):
                pending += block
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    lines.append(raw.decode(errors="replace"))
                    offset += len(raw) + 1
    except FileNotFoundError:
        return [], 0
    if count == 0:
        lines.clear()
    return list(lines), offset


@dataclass
class Follower:
    """New complete lines of several logs, read from where the last read stopped."""

    paths: Sequence[str]
    offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.offsets:
            self.offsets = [0] * len(self.paths)

    def read(self) -> list[tuple[int, str]]:
        """``(index of the log, line)`` for every line completed since the last read."""
        found: list[tuple[int, str]] = []
        for index, path in enumerate(self.paths):
            try:
                with open(path, "rb") as handle:
                    if os.fstat(handle.fileno()).st_size < self.offsets[index]:
                        self.offsets[index] = 0  # truncated: read it again from the start
                    handle.seek(self.offsets[index])
                    data = handle.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            for raw in data[:end].split(b"\n"):
                found.append((index, raw.decode(errors="replace")))
            self.offsets[index] += end + 1
        return found
