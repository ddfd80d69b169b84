"""Replacing a small file so that a reader never sees half of it: temp file, fsync, rename.

Owns ``write_atomically`` (the one temp-and-rename of the package's small files: the rewritten
Gym config, the Go version memo, the Prometheus target file) and the name of its temp files, so
a writer that holds its own lock can remove those a killed writer left. Must not decide where
files live or who may read them beyond the ``mode`` it is given. (The state database and the
built binary have their own, stricter protocols: ``dbfile`` and ``buildcache``.)
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from pathlib import Path


def temp_prefix(path: Path) -> str:
    """The name every temp file of ``write_atomically(path, ...)`` starts with (a dot file beside
    ``path``, so a glob such as Prometheus' ``*.json`` never picks it up)."""
    return f".{path.name}.tmp-"


def write_atomically(path: str | Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder, fsync and a rename.

    ``mode`` is set whatever the umask; None keeps the temp file's 0o600. A failure removes the
    temp file; one a SIGKILL leaves is for ``remove_stale_temps``.
    """
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=temp_prefix(target), dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def remove_stale_temps(path: Path) -> None:
    """Remove the temp files a killed ``write_atomically(path, ...)`` left. Only for a caller that
    holds the lock every writer of ``path`` takes: then none belongs to a write in progress."""
    for stale in glob.glob(os.path.join(glob.escape(str(path.parent)), glob.escape(temp_prefix(path)) + "*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
