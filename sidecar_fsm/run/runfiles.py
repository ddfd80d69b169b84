"""A run's files in the log dir: their names, creating its logs, removing them and its ready files.

Owns the naming ``h2ping-<instance>-<host>-<run id>.<suffix>``: the run id keeps runs that share
a log dir from ever touching one another's files, and an instance's files share one stem.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from sidecar_fsm.base import trust
from sidecar_fsm.base.ready import temp_files
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run.messages import log_failure_message

# The suffixes of an instance's files. The proxy writes the traffic file (``-traffic-file``) and
# the access log (``-access-log``), and rotates the log and the access log to ``<path>.1`` ...
LOG = ".log"
READY = ".ready"
TRAFFIC = ".traffic.json"
ACCESS_LOG = ".access.log"

_ROTATED = re.compile(r"\.[0-9]+")


def run_file(log_dir: str, instance: str, host: str, run_id: str, suffix: str) -> str:
    """The path of one instance's file with ``suffix`` (``LOG``, ``READY``...) in ``log_dir``. Pure."""
    return os.path.join(log_dir, f"h2ping-{instance}-{host}-{run_id}{suffix}")


def sibling(path: str, suffix: str) -> str:
    """The instance's file with ``suffix`` beside ``path``, its ``.log`` or ``.ready`` file. Pure.
    A path with neither (a caller's own ready path) gets ``suffix`` appended: still one stem."""
    for known in (READY, LOG):
        if path.endswith(known):
            return path[: -len(known)] + suffix
    return path + suffix


def instance_files(log_path: str | None, ready_path: str | None) -> list[str]:
    """Every file of one instance that exists: log, ready and traffic files, the access log, the
    rotations of both logs (``.log.1`` ...) and the temp files a proxy killed mid-write left.

    Read-only. Rotations are found by name, whatever ``log_backups`` the run had.
    """
    stems = [path for path in (log_path, ready_path) if path]
    if not stems:
        return []
    log = log_path or sibling(stems[0], LOG)
    traffic, access = sibling(log, TRAFFIC), sibling(log, ACCESS_LOG)
    candidates = [log, traffic, access, *temp_files(traffic)]
    if ready_path:
        candidates += [ready_path, *temp_files(ready_path)]
    for rotating in (log, access):
        prefix = glob.escape(rotating)
        candidates += [
            path for path in sorted(glob.glob(f"{prefix}.*")) if _ROTATED.fullmatch(path[len(rotating) :])
        ]
    return [path for path in dict.fromkeys(candidates) if os.path.lexists(path)]


def create_logs(log_dir: str, paths: list[str]) -> list[int]:
    """Create (O_EXCL) and open for appending every log in ``paths``: all, or none and ``SidecarError``.

    The error is one line naming the path and the reason; a log dir another user can write
    raises ``UnusableStateError`` first. O_EXCL: the names carry the run id, so a file already
    there is not ours and is neither written nor removed. The descriptors are the caller's.
    """
    opened: list[tuple[str, int]] = []
    path = log_dir
    try:
        trust.make_dirs(log_dir)
        # A caller may hand ``NodeSidecars`` an open store of another folder: judge this one too.
        trust.check_log_dir(log_dir)
        for path in paths:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            # FILE_MODE whatever the umask: a log others could write could be made to lie.
            opened.append((path, os.open(path, flags, trust.FILE_MODE)))
    except OSError as exc:
        for made, fd in opened:
            os.close(fd)
            os.unlink(made)
        raise SidecarError(log_failure_message(path, exc)) from exc
    return [fd for _, fd in opened]


def remove_files(paths: list[str]) -> None:
    """Remove each of ``paths`` that exists. Idempotent."""
    for path in paths:
        Path(path).unlink(missing_ok=True)


def remove_ready_files(ready_paths: list[str]) -> None:
    """Remove each ready file and any temp file a proxy that died mid-write left beside it. Idempotent."""
    for ready_path in ready_paths:
        for path in [ready_path, *temp_files(ready_path)]:
            Path(path).unlink(missing_ok=True)
