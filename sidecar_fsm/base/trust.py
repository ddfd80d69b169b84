"""Who can write a path: the ownership and mode checks behind "trust only what only you can write".

The log dir (its database, logs and ready files) decides which process is signalled and where
requests go, and the binary decides what runs, so each is used only when no other user can
write it, as OpenSSH's ``StrictModes`` judges a home folder: owned by this user or root, and not
writable by group or others. A sticky folder (``/tmp``) above a binary is fine, since no one
else can rename or delete what is in it; a sticky log dir is not, since anyone may still plant
a new file there (a ready file before the proxy writes its own, a database before ours).
A group that holds no other user is no other user (Debian's OpenSSH ``user-group-modes`` rule):
what only this user's private group can write is trusted, so a tree made under umask 002, the
default of Debian and Ubuntu for users with a private group, works unchanged.

Owns those judgements and making folders writable by their owner only whatever the umask
(``make_dirs``). Read-only otherwise: it never changes a mode or an owner (the fix is the
user's call, so the message names it), never opens a file, and raises only ``SidecarError``
subclasses with one line naming the path, its owner and mode, and the fix.
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
# file_sd file; other users may run the cached binary), writable by their owner only. mkdir
# applies the umask on top, which can only take bits away.
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

    Debian's OpenSSH rule (``secure_permissions``, its user-group-modes patch): the group must
    exist and have exactly one member, this user, counting both its listed members and every
    account whose primary group it is. A group with no member at all is not private (set-gid
    programs use those), nor is one NSS does not know. Accounts are read as ``getpwent`` lists
    them (a directory service that does not enumerate shows only its local ones, as it does to
    OpenSSH). Read-only; called only for a group-writable entry, so a start pays nothing else.
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
    """None when ``path`` is missing or cannot be looked at (a file in the way, no permission):
    nothing is there to trust or distrust, and the caller reports what it cannot use."""
    try:
        return os.lstat(path)
    except OSError:
        return None


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the folder at ``path`` must not hold our state, in words; None if it may or is missing.

    Read-only. A symlink in its place must be ours or root's (another user could point it
    elsewhere later); the folder it names is then judged. Sticky or not, a folder others may
    write is refused: they could plant an entry under a name we are about to use. A file in the
    way is not judged here (the caller reports it as unusable).
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
    """Why a file we are about to trust (a database) could have been written by another user;
    None if it could not or does not exist. Read-only."""
    text = os.path.abspath(path)
    st = _lstat(text)
    return None if st is None else _entry_problem(text, st, sticky_ok=False)


def log_dir_problem(log_dir: str | os.PathLike[str], state_dir: str | None = None) -> str | None:
    """One line on why ``log_dir`` (and ``state_dir`` inside it, if given) cannot be trusted, with
    the fix; None when it can or does not exist yet. Read-only: for refusing (writers) and for
    warning (``status``, ``history``, ``top``, ``query``)."""
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

    ``os.makedirs``/``Path.mkdir(parents=True)`` give the parents ``0o777`` minus the umask,
    which under a umask of 0 is a folder anyone may write. A folder made concurrently by another
    process is taken as it is (callers that trust it judge it after). Raises ``OSError``.
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


def _chain(path: Path, root: Path) -> list[Path]:
    """``root``, each folder below it and ``path`` itself, top down (``path`` must be under ``root``)."""
    relative = path.relative_to(root)
    chain = [root]
    for part in relative.parts:
        chain.append(chain[-1] / part)
    return chain


def _chain_problem(path: Path, root: Path) -> str | None:
    for entry in _chain(path, root):
        st = _lstat(str(entry))
        if st is None:
            return None  # the caller reports a missing binary in its own words
        problem = _entry_problem(str(entry), st, sticky_ok=entry != path)
        if problem is not None:
            return problem
    return None


def binary_problem(binary: str | os.PathLike[str], root: str | os.PathLike[str] = "/") -> str | None:
    """The first path that another user could change to swap ``binary``, in words; None if none.

    Judged from ``root`` (the build cache's folder, or ``/``) down to the binary itself: each
    must be owned by us or root and not writable by group or others, except that a sticky
    folder above the binary is fine. Symlinks on the way are judged by their owner, then the
    resolved path is judged the same way from ``/`` (or from the resolved root, when it is
    under it). Read-only.
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
