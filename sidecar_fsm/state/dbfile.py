"""The state database as a file: where it lives, whether it can be used, creating and migrating it.

Owns ``<log_dir>/sidecar-fsm/<host>.db`` until a connection is handed to ``store``: making its
directory, refusing what cannot be used (a path through a file, no permission, a read-only or
full filesystem, a foreign, corrupt or newer file, a folder or file others can write: ``trust``)
with one line naming the path and the reason (``storage_error``, also ``store``'s for later
failures), creating it and having ``schema`` migrate it. Must not read or write rows, and never
overwrites, truncates or deletes a file it did not create.

A new database is built under a private temp name and hard-linked into place, so a failure (a
full disk half-way through the schema) leaves nothing behind, and of two processes creating it at
once the second's link fails and it opens the first's.

Past 400 lines because each way a file can be unusable needs its own check and its own line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
import threading
from pathlib import Path

from sidecar_fsm.base import trust
from sidecar_fsm.errors import SidecarError, UnusableStateError
from sidecar_fsm.state import schema, storagefault
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.storagefault import (
    SQLITE_BUSY,
    SQLITE_CANTOPEN,
    SQLITE_CORRUPT,
    SQLITE_FULL,
    SQLITE_LOCKED,
    SQLITE_NOTADB,
    SQLITE_PERM,
    SQLITE_READONLY,
)

DB_DIR_NAME = "sidecar-fsm"

# SQLite's own busy handler: how long a statement waits for another process's lock before it
# fails. Writes hold the lock for a fraction of a millisecond, a migration for well under a
# second; a minute is only reached when a process is stuck (stopped, or hung on a dead disk).
BUSY_TIMEOUT_SECONDS = 60.0

# A writer is refused below this much free space: every commit appends to the WAL, and a launcher
# that cannot record a transition must stop its sidecars, so failing before anything starts is
# kinder than failing mid-run. About 250 commits' worth; the WAL is reused after each checkpoint.
MIN_FREE_BYTES = 1024 * 1024

_SQLITE_MAGIC = b"SQLite format 3\x00"
# Where a hard link cannot be made: the new database is then created in place (see _create).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK})

# (device, inode) of the database files this process has open through SQLite, with a count.
# Closing any descriptor of a file drops every POSIX lock the process holds on it, SQLite's
# included (its locks on the main file keep other processes from deleting a WAL in use), so the
# raw header read below is skipped for a file SQLite already holds open here: it was checked
# when it was opened, and SQLite re-reads the version through its own locks anyway.
_open_files: dict[tuple[int, int], int] = {}
_holders: dict[int, tuple[int, int]] = {}  # id(connection) -> the file it holds
_open_files_lock = threading.Lock()


def database_path(log_dir: str | Path, host: str | None = None) -> Path:
    """``<log_dir>/sidecar-fsm/<host>.db``: one file per host, so hosts never share a SQLite file;
    ``host`` defaults to ``hostname.host_name()``, so every command agrees on "this host's" file."""
    return Path(log_dir) / DB_DIR_NAME / f"{host or host_name()}.db"


# -- opening -----------------------------------------------------------------------------------


def open_for_writing(log_dir: str | Path, host: str) -> tuple[Path, sqlite3.Connection]:
    """This host's database under ``log_dir``, created and migrated as needed, and a connection.

    Raises ``UnusableStateError`` (``SchemaTooNewError`` for a newer schema) with one line naming
    the database and the reason. Everything is checked before anything is created; on failure
    the directories this call made are removed again, and an existing file is left as it was.
    """
    path = database_path(log_dir, host)
    # Judged before anything is made in it, and again after (a folder made meanwhile by another
    # process is taken as found): a folder others can write could hand us any database.
    trust.check_log_dir(log_dir, str(path.parent))
    made = _make_directories(path)
    try:
        trust.check_log_dir(log_dir, str(path.parent))
        foreign = trust.file_problem(path)
        if foreign is not None:
            raise UnusableStateError(
                f"{path}: {foreign}, who could rewrite its records; "
                "remove it or use a log dir only you can write"
            )
        _check_writable(path)
        if not os.path.lexists(path):
            _create(path)
        return path, _connect(path)
    except BaseException:
        _remove_made(made)
        raise


def open_for_reading(path: Path) -> sqlite3.Connection:
    """A connection to an existing database (any host's), migrated if older; raises like writing.

    Migrations only add, so an older launcher still writing the file keeps working. On a
    read-only filesystem (a log dir mounted read-only to inspect a crashed job) a database at
    the current schema is read as it is: nothing there can change it.
    """
    if not path.is_file():
        if os.path.lexists(path):
            raise UnusableStateError(f"{path}: not a regular file; move it away or use another --log-dir")
        raise UnusableStateError(f"{path}: no such state database; check --log-dir")
    if _on_read_only_fs(path):
        return _connect(path, immutable=True)
    return _connect(path)


def migrate_if_below(path: Path, step: int) -> None:
    """Migrate the existing database at ``path`` if its schema is below ``step``, as readers do;
    a newer one is not refused here (its caller reads only what every later schema keeps)."""
    # 0 for a file this process already holds open: open_for_reading then finds it current.
    if _header_schema_version(path) < step:
        close(open_for_reading(path))


def database_files(log_dir: str | Path) -> list[Path]:
    """Every host's database file under ``<log_dir>/sidecar-fsm/``, sorted; [] if there is none yet.
    A log dir that cannot be listed (a file in the way, no permission) raises ``UnusableStateError``."""
    directory = Path(log_dir) / DB_DIR_NAME
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if entry.name.endswith(".db"))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UnusableStateError(f"{directory}: {_directory_reason(directory, exc)}") from None
    # Temp files of a database being created are hidden (``.<host>.db.<id>.tmp``), never listed.
    return [directory / name for name in names if not name.startswith(".")]


def close(conn: sqlite3.Connection) -> None:
    """Close a connection ``open_for_writing``/``open_for_reading`` returned (the last connection
    to a database checkpoints its WAL into the file and removes the -wal/-shm files)."""
    try:
        conn.close()
    finally:
        _release(id(conn))


def _hold(path: Path, conn_id: int) -> None:
    """Record that this process holds ``path`` open through SQLite (connection ``conn_id``)."""
    stat = os.stat(path)
    key = (stat.st_dev, stat.st_ino)
    with _open_files_lock:
        _open_files[key] = _open_files.get(key, 0) + 1
        _holders[conn_id] = key


def _release(conn_id: int) -> None:
    with _open_files_lock:
        key = _holders.pop(conn_id, None)
        if key is None:
            return
        count = _open_files.pop(key) - 1
        if count:
            _open_files[key] = count


def _make_directories(path: Path) -> list[Path]:
    """Make the missing directories above ``path``, top down; the ones this call made."""
    missing: list[Path] = []
    directory = path.parent
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    made: list[Path] = []
    try:
        for directory in reversed(missing):
            try:
                os.mkdir(directory, trust.DIR_MODE)  # writable by us only, whatever the umask
            except FileExistsError:
                pass  # another process made it meanwhile; the check below says if it is usable
            else:
                made.append(directory)
        if not path.parent.is_dir():
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path.parent))
    except OSError as exc:
        _remove_made(made)
        raise UnusableStateError(f"{path}: {_directory_reason(path.parent, exc)}") from None
    return made


def _remove_made(made: list[Path]) -> None:
    for directory in reversed(made):
        try:
            os.rmdir(directory)
        except OSError:
            break  # another process put a file in it meanwhile: it is theirs now


def _directory_reason(directory: Path, exc: OSError) -> str:
    """Why ``directory`` cannot hold databases, and what to do, for an error making or listing it."""
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        for part in (directory, *directory.parents):
            if os.path.lexists(part) and not part.is_dir():
                return f"'{part}' is a file, not a directory; move it away or use another --log-dir"
    return f"{_os_reason(directory, exc)}; use another --log-dir"


def _check_writable(path: Path) -> None:
    """Refuse a read-only filesystem, a directory or file we may not write, or a full filesystem.

    Reads the permissions and the filesystem's figures; opens nothing (see ``_open_files``).
    """
    for target in (path.parent, path):
        if os.path.lexists(target) and not os.access(target, os.W_OK):
            raise UnusableStateError(f"{path}: {_not_writable_reason(target)}; use another --log-dir")
    try:
        stat = os.statvfs(path.parent)
    except OSError as exc:
        raise UnusableStateError(f"{path}: {_os_reason(path.parent, exc)}; use another --log-dir") from None
    free = stat.f_bavail * stat.f_frsize
    if free < MIN_FREE_BYTES:
        raise UnusableStateError(
            f"{path}: filesystem is full ({free // 1024} KiB free); free some space or use another --log-dir"
        )


def _create(path: Path) -> None:
    """Create the database at the latest schema under a temp name, then link it into place.

    The link fails if another process created the database meanwhile: its file is kept and used.
    Where the filesystem has no hard links the database is left to ``_connect`` to create in
    place (its migration transaction still serializes concurrent creators).
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        conn = sqlite3.connect(temp, isolation_level=None)
        try:
            _set_wal(conn, path)
            schema.migrate(conn, path)
        finally:
            conn.close()  # the last connection checkpoints and removes the temp's -wal/-shm
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
    except sqlite3.Error as exc:
        raise storage_error(path, exc, UnusableStateError) from None
    except OSError as exc:
        raise UnusableStateError(f"{path}: {_os_reason(path.parent, exc)}; use another --log-dir") from None
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{temp}{suffix}")


def _connect(path: Path, immutable: bool = False) -> sqlite3.Connection:
    """Open ``path`` after checking it is a database of ours no newer than this code; migrate it.

    ``immutable``: read a file on a read-only filesystem without the WAL index SQLite cannot
    create there; refused when a WAL with commits not yet in the file lies beside it (they
    would be missed) or when the schema is older (it cannot be migrated there).
    """
    latest = schema.schema_version()
    # The header check needs no SQLite handle: a refused database gets no -wal/-shm files and
    # no checkpoint, so it stays byte-for-byte what was there.
    schema.refuse_if_newer(path, _header_schema_version(path), latest)
    if immutable and os.path.exists(f"{path}-wal") and os.path.getsize(f"{path}-wal") > 0:
        raise UnusableStateError(
            f"{path}: read-only filesystem with a WAL still beside the database; mount it "
            "read-write once so SQLite can fold it in"
        )
    target, uri = (f"{path.resolve().as_uri()}?immutable=1", True) if immutable else (str(path), False)
    try:
        conn = sqlite3.connect(
            target, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False, uri=uri
        )
    except sqlite3.Error as exc:
        raise storage_error(path, exc, UnusableStateError) from None
    try:
        # Before SQLite takes its first lock, so no other thread of this process reads the header
        # raw (and drops that lock) while this connection migrates.
        _hold(path, id(conn))
        # The header can lag behind a WAL that a running newer process has not checkpointed,
        # so the version is read again through SQLite before anything is written. Reading the
        # schema also finds a corrupt first page, before anything is written.
        version = schema.user_version(conn)
        schema.refuse_if_newer(path, version, latest)
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        if version == 0 and tables:
            raise UnusableStateError(
                f"{path}: not a sidecar-fsm database (it has tables {', '.join(sorted(tables)[:5])}); "
                "move it away or use another --log-dir"
            )
        if immutable and version < latest:
            raise UnusableStateError(
                f"{path}: schema {version} is older than this sidecar-fsm ({latest}) and the "
                "filesystem is read-only; read it with the sidecar-fsm that wrote it"
            )
        if not immutable and (version < latest or _journal_mode(conn) != "wal"):
            _set_wal(conn, path)
            schema.migrate(conn, path)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
    except BaseException as exc:
        close(conn)
        if isinstance(exc, sqlite3.Error):
            raise storage_error(path, exc, UnusableStateError) from None
        if isinstance(exc, OSError):
            raise UnusableStateError(f"{path}: {_os_reason(path, exc)}; use another --log-dir") from None
        raise
    return conn


def _header_schema_version(path: Path) -> int:
    """``user_version`` from the file header (offset 60), read without SQLite; 0 if absent or empty.

    Skipped (0) for a file this process already holds open through SQLite (see ``_open_files``).
    """
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise UnusableStateError(f"{path}: {_os_reason(path, exc)}; use another --log-dir") from None
    with _open_files_lock:
        if (stat.st_dev, stat.st_ino) in _open_files:
            return 0
        try:
            with open(path, "rb") as file:
                header = file.read(100)
        except OSError as exc:
            raise UnusableStateError(f"{path}: {_os_reason(path, exc)}; use another --log-dir") from None
    if not header:
        return 0
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise UnusableStateError(f"{path}: not a SQLite database; move it away or use another --log-dir")
    return int.from_bytes(header[60:64], "big")


def _journal_mode(conn: sqlite3.Connection) -> str:
    return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def _set_wal(conn: sqlite3.Connection, path: Path) -> None:
    """WAL (readers never block the writer) is a property of the file, set once by its creator."""
    if _journal_mode(conn) != "wal":
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise UnusableStateError(
                f"{path}: journal mode stayed '{mode}'; put --log-dir on a local filesystem"
            )


# -- errors ------------------------------------------------------------------------------------


def storage_error(
    path: Path,
    exc: sqlite3.Error,
    kind: type[SidecarError] = SidecarError,
    doing: str = "",
    waited: float | None = None,
) -> sqlite3.Error | SidecarError:
    """``exc`` as one line naming ``path`` and the reason if it is about the file or filesystem,
    else ``exc`` itself (a constraint, a bug in a statement) for the caller to raise.

    ``kind`` is ``UnusableStateError`` at open (the CLI exits 2: nothing was started);
    ``doing`` (e.g. "write rolled back") goes before the reason; ``waited`` is how long a locked
    write waited (default: the busy timeout).
    """
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    if primary not in storagefault.STORAGE_CODES:
        return exc
    advice = "use another --log-dir"
    if primary == SQLITE_FULL:
        reason, advice = (
            "filesystem is full (no space left on device)",
            "free some space or use another --log-dir",
        )
    elif primary in (SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_PERM):
        reason = _not_writable_reason(path)
        if primary == SQLITE_CANTOPEN and not _on_read_only_fs(path) and os.access(path.parent, os.W_OK):
            reason = "cannot open the database file"
    elif primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        reason = "database file is corrupt" if primary == SQLITE_CORRUPT else "not a SQLite database"
        advice = "move it away or use another --log-dir"
        # Found by a later read as well as at open: either way the file is unusable, not the run.
        kind = UnusableStateError
    elif primary in (SQLITE_BUSY, SQLITE_LOCKED):
        # Named when the kernel can tell (a stuck or SIGSTOPped writer), so the fix is one kill away.
        holder = storagefault.describe_lock_holders(path) or "another process"
        held = BUSY_TIMEOUT_SECONDS if waited is None else waited
        reason = f"database is locked; {holder} held it for {held:g}s"
        advice = "check for a stuck sidecar-fsm"
    else:
        reason = f"I/O error ({getattr(exc, 'sqlite_errorname', 'SQLITE_IOERR')})"
        advice = "check the disk or use another --log-dir"
    return kind(f"{path}: {doing + ': ' if doing else ''}{reason}; {advice}")


def _on_read_only_fs(target: Path) -> bool:
    """Whether ``target`` (or its nearest existing parent) is on a read-only filesystem."""
    for candidate in (target, *target.parents):
        try:
            return bool(os.statvfs(candidate).f_flag & os.ST_RDONLY)
        except OSError:
            continue
    return False


def _not_writable_reason(target: Path) -> str:
    """Why ``target`` (or its directory) cannot be written: a read-only filesystem or permissions."""
    return "read-only filesystem" if _on_read_only_fs(target) else "permission denied"


def _os_reason(target: Path, exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "read-only filesystem"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "filesystem is full"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOENT and exc.filename and os.path.isdir(os.path.dirname(exc.filename)):
        # mkdir in an existing directory answered "no such file": a virtual filesystem (/proc).
        return f"cannot create '{exc.filename}' (the filesystem refuses new directories there)"
    return (exc.strerror or str(exc)).lower()
