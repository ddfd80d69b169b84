"""Who can write a path: the ownership and mode checks behind "trust only what only you can write".

The log dir decides which process is signalled and where requests go, and the binary what
runs, so each is used only when no other user can write it, as OpenSSH's ``StrictModes`` judges:
owned by this user or root, not writable by group or others. A sticky folder (``/tmp``) above a
binary is fine (no one else can rename what is in it); a sticky log dir is not (anyone may plant
a new file). A group that holds no other user is no other user (Debian's ``user-group-modes``),
so a tree made under umask 002, Debian's and Ubuntu's default, works unchanged.

Owns those judgements and ``make_dirs`` (owner-writable whatever the umask). Never changes a
mode or an owner (the message names the fix), never opens a file, and raises only
``SidecarError`` subclasses with one line naming the path, its owner and mode, and the fix.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from pathlib import Path

from sidecar_fsm.errors import ConfigError, UnusableStateError

# Folders this package makes: readable by all (a Prometheus server of its own user reads the
# file_sd file; other users may run the cached binary), writable by their owner only.
DIR_MODE = 0o755
# Files this package makes (logs); the database and its -wal/-shm get SQLite's 0644.
FILE_MODE = 0o644
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def trusted_uids() -> frozenset[int]:
    """The owners whose files we trust: this user (effective uid) and root, who can write anything."""
    return frozenset({os.geteuid(), 0})


def owner_name(uid: int) -> str:
    """``nobody`` for 65534, the number when the user has no name. Read-only."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def describe(st: os.stat_result) -> str:
    """``owner nobody, mode 0777``: what a refusal names about a path."""
    return f"owner {owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def other_group_members(gid: int) -> list[str] | None:
    """The users of group ``gid`` other than this one; None when it is this user's private group.

    Debian's OpenSSH rule (``secure_permissions``): exactly one member, this user, counting
    listed members and accounts whose primary group it is (as ``getpwent`` lists them). A group
    with no member (set-gid programs use those) or unknown to NSS is not private.
    """
    try:
        group = grp.getgrgid(gid)
        me = pwd.getpwuid(os.geteuid())
    except KeyError:
        return [f"group {gid} unknown"]
    others = {name for name in group.gr_mem if name != me.pw_name}
    primary = [account for account in pwd.getpwall() if account.pw_gid == gid]
    others.update(account.pw_name for account in primary if account.pw_uid != me.pw_uid)
    if others:
        return sorted(others)
    if me.pw_name not in group.gr_mem and not primary:
        return ["no member at all"]
    return None


def _entry_problem(path: str, st: os.stat_result, *, sticky_ok: bool) -> str | None:
    """Why another user could change ``path`` (its stat ``st``); None when only we or root can."""
    if st.st_uid not in trusted_uids():
        return f"'{path}' ({describe(st)}) belongs to another user"
    if stat.S_ISLNK(st.st_mode):
        return None  # a symlink's own mode means nothing; its owner and its folder decide
    if not st.st_mode & _GROUP_OTHER_WRITE or (
        sticky_ok and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    ):
        return None
    if st.st_mode & stat.S_IWOTH:
        return f"'{path}' ({describe(st)}) is writable by group or others"
    others = other_group_members(st.st_gid)
    if others is None:
        return None  # only this user's private group can write it: no other user can
    group = _group_name(st.st_gid)
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (
        f"'{path}' (owner {owner_name(st.st_uid)}, group {group}, mode {stat.S_IMODE(st.st_mode):04o}) "
        f"is writable by group {group}, which is not yours alone ({shown})"
    )


def _lstat(path: str) -> os.stat_result | None:
    """None when ``path`` is missing or cannot be looked at: the caller reports what it cannot use."""
    try:
        return os.lstat(path)
    except OSError:
        return None


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the folder at ``path`` must not hold our state, in words; None if it may or is missing.

    A symlink in its place must be ours or root's, then the folder it names is judged. Sticky or
    not, a folder others may write is refused. A file in the way is the caller's to report.
    """
    text = os.path.abspath(path)
    st = _lstat(text)
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        problem = _entry_problem(text, st, sticky_ok=False)
        if problem is not None:
            return problem
        try:
            st = os.stat(text)
        except OSError:
            return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return _entry_problem(text, st, sticky_ok=False)


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a file we are about to trust (a database) could have been written by another user."""
    text = os.path.abspath(path)
    st = _lstat(text)
    return None if st is None else _entry_problem(text, st, sticky_ok=False)


def log_dir_problem(log_dir: str | os.PathLike[str], state_dir: str | None = None) -> str | None:
    """One line on why ``log_dir`` (and ``state_dir`` inside it) cannot be trusted, with the fix;
    None when it can or does not exist yet. Writers refuse on it, readers warn."""
    for folder in (log_dir, state_dir):
        if folder is None:
            continue
        problem = folder_problem(folder)
        if problem is not None:
            where = os.path.abspath(log_dir)
            # The log dir itself is named once; a folder inside it after the log dir's name.
            text = problem if problem.startswith(f"'{where}' ") else f"'{where}': {problem}"
            return (
                f"log dir {text}, who could plant or replace its database and ready files; use a "
                "log dir only you can write (sidecar.log_dir, --log-dir) or fix it with chown and chmod go-w"
            )
    return None


def check_log_dir(log_dir: str | os.PathLike[str], state_dir: str | None = None) -> None:
    """Raise ``UnusableStateError`` (one line, see ``log_dir_problem``) for a log dir others can write."""
    problem = log_dir_problem(log_dir, state_dir)
    if problem is not None:
        raise UnusableStateError(problem)


def make_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """Make ``path`` and its missing parents with ``DIR_MODE`` (minus the umask); the ones made.

    ``os.makedirs`` gives the parents ``0o777`` minus the umask: anyone's under a umask of 0. A
    folder made concurrently is taken as it is (callers that trust it judge it after).
    """
    target = Path(os.path.abspath(path))
    missing: list[Path] = []
    current = target
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    made: list[Path] = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            continue
        made.append(folder)
    if not target.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
    return made


def _chain_problem(path: Path, root: Path) -> str | None:
    """The first problem from ``root`` down to ``path`` (which must be under it)."""
    for entry in [*(root / above for above in reversed(path.relative_to(root).parents)), path]:
        st = _lstat(str(entry))
        if st is None:
            return None  # the caller reports a missing binary in its own words
        problem = _entry_problem(str(entry), st, sticky_ok=entry != path)
        if problem is not None:
            return problem
    return None


def binary_problem(binary: str | os.PathLike[str], root: str | os.PathLike[str] = "/") -> str | None:
    """The first path that another user could change to swap ``binary``, in words; None if none.

    Judged from ``root`` (the build cache's folder, or ``/``) down to the binary; symlinks on the
    way by their owner, then the resolved path from ``/`` (or the resolved root, if under it).
    """
    path = Path(os.path.abspath(binary))
    top = Path(os.path.abspath(root))
    if not path.is_relative_to(top):
        top = Path("/")
    problem = _chain_problem(path, top)
    if problem is not None:
        return problem
    real, real_top = Path(os.path.realpath(path)), Path(os.path.realpath(top))
    if real == path and real_top == top:
        return None
    return _chain_problem(real, real_top if real.is_relative_to(real_top) else Path("/"))


def check_binary(field: str, binary: str | os.PathLike[str], root: str | os.PathLike[str] = "/") -> None:
    """Raise ``ConfigError`` naming the first untrusted path above ``binary`` and the fix (one line)."""
    problem = binary_problem(binary, root)
    if problem is not None:
        raise ConfigError(
            f"{field}: '{binary}': {problem}, who could replace what runs; refusing to run it: "
            "chown it and its folders to you or root and chmod go-w them, or move the binary"
        )
