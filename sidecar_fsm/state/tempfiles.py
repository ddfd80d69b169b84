"""Temp files a database creation left behind: finding and removing them.

Owns recognising ``dbfile._create``'s temp name (``.<host>.db.<pid>.<8 hex>.tmp`` and SQLite's
``-wal``/``-shm``/``-journal`` beside it) and judging whether its creator is gone. ``_create``
removes them on every way out but SIGKILL (or a power cut), so ``reap`` and ``prune`` call
this. Must not open a database or touch any other file; only this host's temp files are judged,
since another host's pids mean nothing here.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import psutil

from sidecar_fsm.state.dbfile import DB_DIR_NAME

# ``_create``'s temp name: ``.<host>.db.<pid>.<8 hex>.tmp``, and SQLite's -wal/-shm/-journal.
_TEMP_NAME = re.compile(r"\.(?P<host>.+)\.db\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp(-wal|-shm|-journal)?")


def abandoned_temp_files(log_dir: str | Path, host: str) -> list[Path]:
    """The temp files of a database creation ``host``'s process never finished: only when no
    process runs at their pid (a live one may still be creating, or be a reused pid, which costs
    only keeping a few KiB)."""
    directory = Path(log_dir) / DB_DIR_NAME
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        match = _TEMP_NAME.fullmatch(name)
        if match and match["host"] == host and not psutil.pid_exists(int(match["pid"])):
            found.append(directory / name)
    return found


def remove_abandoned_temp_files(log_dir: str | Path, host: str) -> list[Path]:
    """Remove ``abandoned_temp_files``; the paths removed (one gone meanwhile is not an error)."""
    removed = []
    for path in abandoned_temp_files(log_dir, host):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed
