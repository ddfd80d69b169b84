"""A state database that fails under a live run: noticing it, who holds its lock, the one line.

Owns whether the file at the database path is still the one a run writes (``RecordWatch``), which
processes hold its write lock (``lock_holders``), the line a launcher gives when it stopped a
run's sidecars because their state could no longer be recorded (``stopped_message``), and which
SQLite result codes are about the file rather than a statement (``is_storage_error``). Stopping
is decided in ``run.watch.failures``. Must not signal, stop or record anything, and reads only
``/proc`` and ``stat``: it runs on the error path of a write that already failed.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import psutil

from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.errors import SidecarError

__all__ = [
    "STORAGE_CODES",
    "RecordLostError",
    "RecordWatch",
    "describe_lock_holders",
    "is_storage_error",
    "lock_holders",
    "stopped_message",
]

# SQLite's WAL write lock: one byte of the -shm file, at 120 (WALINDEX_LOCK_OFFSET) + 0
# (WAL_WRITE_LOCK), taken exclusively by BEGIN IMMEDIATE and kept until COMMIT or ROLLBACK.
_WAL_WRITE_LOCK_BYTE = 120

# SQLite's primary result codes for "the file or its filesystem cannot be used".
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY = 3, 5, 6, 8
SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 10, 11, 13, 14, 26
STORAGE_CODES = frozenset(
    {
        SQLITE_PERM,
        SQLITE_BUSY,
        SQLITE_LOCKED,
        SQLITE_READONLY,
        SQLITE_IOERR,
        SQLITE_CORRUPT,
        SQLITE_FULL,
        SQLITE_CANTOPEN,
        SQLITE_NOTADB,
    }
)


class RecordLostError(SidecarError):
    """The database file a live run writes was deleted or replaced at its path."""


@dataclass(frozen=True)
class RecordWatch:
    """The identity (device, inode) of a run's database file when the run started writing it.

    A connection keeps writing the inode it opened, so a file deleted or replaced at the path
    (a log dir cleaned while a job runs, a backup copied back) makes no write fail: it only
    makes the run invisible. ``lost()`` compares the path with the inode; one ``stat``.
    """

    path: Path
    identity: tuple[int, int] | None

    @classmethod
    def of(cls, path: Path) -> RecordWatch:
        return cls(path, _file_identity(path))

    def lost(self) -> str | None:
        """``"deleted"`` or ``"replaced by another file"`` if the path no longer holds the file, else None."""
        if self.identity is None:
            return None  # never seen (a store on a filesystem without inodes): nothing to compare
        now = _file_identity(self.path)
        if now is None:
            return "deleted"
        return None if now == self.identity else "replaced by another file"

    def check(self, run_id: str) -> None:
        """Raise ``RecordLostError`` (one line naming the path) if ``lost()``."""
        how = self.lost()
        if how is not None:
            raise RecordLostError(
                f"{self.path}: {how} while run {run_id} was live; its sidecars were stopped, since a "
                "run that is not on record cannot be inspected or reaped; keep a live run's log dir"
            )


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def stopped_message(path: Path, run_id: str, error: BaseException) -> str:
    """The one line for a run whose sidecars were stopped because ``error`` kept a transition
    unrecorded; a full filesystem gets its own (the fix is the user's), else the store's line."""
    if isinstance(error, RecordLostError):
        return str(error)
    if _is_no_space(error):
        return (
            f"{path}: no space left on device to record run {run_id}; its sidecars were stopped, "
            "since what they do could no longer be recorded; free some space, then run "
            f"'{command_hint('reap', path.parent.parent)}' to close the run"
        )
    first = str(error).split("\n", 1)[0]
    return f"run {run_id}: its sidecars were stopped, since their state could not be recorded: {first}"


def _is_no_space(error: BaseException) -> bool:
    """True if ``error`` or what it was raised from is SQLite's SQLITE_FULL or an ENOSPC/EDQUOT."""
    seen: BaseException | None = error
    for _ in range(8):  # a cause chain is short; bounded against a cycle
        if seen is None:
            return False
        if isinstance(seen, sqlite3.Error):
            code = getattr(seen, "sqlite_errorcode", None)
            if code is not None and code & 0xFF == SQLITE_FULL:
                return True
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_storage_error(exc: sqlite3.Error) -> bool:
    """True if ``exc`` is about the database file or its filesystem, not a statement or constraint."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in STORAGE_CODES


def lock_holders(path: Path) -> list[int]:
    """Pids (not ours) holding the write lock of the database at ``path``; [] when none can be found.

    Read from ``/proc/locks``: SQLite takes POSIX record locks, which the kernel lists with the
    owner's pid. In WAL mode a writer holds one byte of ``<db>-shm`` exclusively; a lock on the
    database file itself is a rollback-journal writer or a checkpoint. Processes that merely
    have the file open (readers, idle launchers) are not holders and are not named.
    """
    targets: set[tuple[int, int]] = set()
    for candidate in (path, Path(f"{path}-shm")):
        identity = _file_identity(candidate)
        if identity is not None:
            targets.add(identity)
    if not targets:
        return []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return []
    shm = _file_identity(Path(f"{path}-shm"))
    holders: list[int] = []
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 4242 00:2d:1234 120 120"; blocked waiters carry "->".
        if len(fields) < 8 or fields[1] not in ("POSIX", "FLOCK") or fields[3] != "WRITE":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            identity = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            start = int(fields[6])
        except ValueError:
            continue
        if identity not in targets or pid == os.getpid() or pid in holders:
            continue
        if identity == shm and start > _WAL_WRITE_LOCK_BYTE:
            continue  # a reader-mark or checkpoint byte, held briefly: not what blocks a writer
        holders.append(pid)
    return holders


def describe_lock_holders(path: Path) -> str | None:
    """``pid 4242 (python3, stopped)`` for each write-lock holder, joined; None if none is known."""
    described = []
    for pid in lock_holders(path):
        try:
            process = psutil.Process(pid)
            described.append(f"pid {pid} ({process.name()}, {process.status()})")
        except psutil.Error:
            described.append(f"pid {pid}")
    return ", ".join(described) or None
