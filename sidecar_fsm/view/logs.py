"""The proxies' logs of a run: the last lines of each, and following them as they grow.

Must not open the database (the caller says when the run has ended), judge processes or print.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

# Read in blocks: a proxy's log is small, but a week-long run's may not be.
_BLOCK = 1 << 16
# The most backups a proxy keeps (go/outputs.go, maxLogBackups): where a follow stops looking.
_MAX_BACKUPS = 1000


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
    """New complete lines of several logs, read from where the last read stopped.

    The proxy rotates its log by size (``-log-max-bytes``): it renames PATH to PATH.1 and starts
    a new PATH, or, with no backups kept, cuts PATH in place. A follower knows which file its
    offset belongs to (device and inode, taken when it is made: the offsets come from a ``tail``
    just before), so after a rename it first reads the rest of the old file, now PATH.1 (the
    last lines written before the rotation), then the new PATH from its start. A cut PATH
    (shorter than the offset, same file) is read again from the start. Several rotations between
    two reads are followed through the backups; only lines rotated past ``log_backups`` (or
    cut with none kept) before a read are lost to the follow.
    """

    paths: Sequence[str]
    offsets: list[int] = field(default_factory=list)
    files: list[tuple[int, int] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.offsets:
            self.offsets = [0] * len(self.paths)
        if not self.files:
            self.files = [_identity(path) for path in self.paths]

    def read(self) -> list[tuple[int, str]]:
        """``(index of the log, line)`` for every line completed since the last read."""
        found: list[tuple[int, str]] = []
        for index, path in enumerate(self.paths):
            try:
                with open(path, "rb") as handle:
                    stat = os.fstat(handle.fileno())
                    now = (stat.st_dev, stat.st_ino)
                    if self.files[index] not in (None, now):
                        found += [(index, line) for line in self._rotated_lines(index, path)]
                        self.offsets[index] = 0
                    elif stat.st_size < self.offsets[index]:
                        self.offsets[index] = 0  # cut in place: read it again from the start
                    self.files[index] = now
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

    def _rotated_lines(self, index: int, path: str) -> list[str]:
        """The lines written since the last read to files the proxy has since rotated away.

        The offset's file is one of PATH.1, PATH.2, ... (renamed once per rotation since): its
        rest from the offset, then every newer backup whole, oldest first. Backups are finished
        (the proxy writes only to PATH), so a last line without a newline is whole as it is.
        Nothing when the offset's file is gone (rotated past ``log_backups``, or cut).
        """
        newer: list[str] = []
        for number in range(1, _MAX_BACKUPS + 1):
            backup = f"{path}.{number}"
            try:
                with open(backup, "rb") as handle:
                    stat = os.fstat(handle.fileno())
                    if (stat.st_dev, stat.st_ino) != self.files[index]:
                        newer.append(backup)
                        continue
                    handle.seek(self.offsets[index])
                    lines = _lines(handle.read())
            except FileNotFoundError:
                return []
            for finished in reversed(newer):
                try:
                    with open(finished, "rb") as handle:
                        lines += _lines(handle.read())
                except FileNotFoundError:
                    continue  # rotated away while we read: its lines are lost to this follow
            return lines
        return []


def _lines(data: bytes) -> list[str]:
    """A finished file's lines (the last may lack its newline)."""
    return [raw.decode(errors="replace") for raw in data.removesuffix(b"\n").split(b"\n")] if data else []


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path`` now; None when there is no such file yet."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino
