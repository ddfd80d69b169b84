"""Read-only queries over every host's database of a log dir, through the documented views.

Owns ``sidecar-fsm query``'s SQL: attaching each host's file read-only to one in-memory
connection, presenting each of ``VIEWS`` (the contract) as one TEMP view or table over every
host, refusing any statement that would write, and stopping a statement at its deadline. Must
not write a row, take a write lock (a launcher writing beside the query is never blocked), or
change a file's bytes. Three gates, so a bug in one is caught by the next: each file is attached
``mode=ro`` (or ``immutable=1``), ``PRAGMA query_only`` is on, and an authorizer allows only reads.

``mode=ro`` on a WAL database nobody has open creates its ``-shm`` and ``-wal``, which a read-only
connection cannot remove; when this query created them, one ordinary open and close removes them
(SQLite does so only if no other connection holds the database). In a folder that cannot be
written (a log dir mounted read-only), ``mode=ro`` fails without the ``-shm``, so the file is
opened ``immutable=1``: nothing can be writing it there, and a WAL with commits not yet in the
file is refused rather than silently missed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar_fsm.errors import SidecarError, UnusableStateError
from sidecar_fsm.state import dbfile
from sidecar_fsm.state.schema import migrate, schema_version

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "VIEWS", "QueryRefused", "QueryResult", "QueryTimeout", "run_query"]


def _documented_views() -> dict[str, tuple[str, ...]]:
    """Each view the migrations make and its columns, in order, read from a database they build in
    memory: the columns are named once, in the migrations' SQL (docs/query.md documents them;
    tests/unit/test_query_views.py holds them as the contract)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, Path(":memory:"))
        views = conn.execute("SELECT name FROM sqlite_master WHERE type = 'view' ORDER BY rowid")
        names = [row[0] for row in views]
        return {
            name: tuple(row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", [name]))
            for name in names
        }
    finally:
        conn.close()


# The query surface: each view and its columns, in order. Later migrations may add columns at
# the end, never rename, drop or reorder one; the union below selects exactly these, so a
# database from a newer sidecar-fsm (with more columns) is read alongside older ones, and an
# older one is migrated first (``_attach``), as ``status`` does.
VIEWS = _documented_views()

DEFAULT_TIMEOUT_SECONDS = 10.0

# How many SQLite VM steps run between two looks at the clock: about a millisecond of work.
_PROGRESS_STEPS = 10_000

# What the authorizer lets through: reading, selecting, calling functions, recursive CTEs, and
# the pragmas that only describe the schema (``pragma_table_info('run_summary')``).
_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, 33}
)  # 33: RECURSIVE
_DESCRIBING_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "collation_list",
        "function_list",
        "pragma_list",
    }
)
# The authorizer's action codes (sqlite3.h), in order, as the words of a refusal.
_ACTIONS = (
    "copy", "create index", "create table", "create temp index", "create temp table",
    "create temp trigger", "create temp view", "create trigger", "create view", "delete from",
    "drop index", "drop table", "drop temp index", "drop temp table", "drop temp trigger",
    "drop temp view", "drop trigger", "drop view", "insert into", "run pragma", "read", "select",
    "open or close a transaction", "update", "attach", "detach", "alter table", "reindex",
    "analyze", "create virtual table", "drop virtual table", "call", "use a savepoint", "recurse",
)  # fmt: skip


class QueryRefused(SidecarError):
    """The statement is not one read-only SELECT (a write, several statements, a SQL error)."""


class QueryTimeout(SidecarError):
    """The statement ran past its deadline and was interrupted."""


@dataclass(frozen=True)
class QueryResult:
    """The statement's column names and rows, and the hosts whose databases it read."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    hosts: list[str]


def run_query(
    log_dir: str | Path,
    sql: str,
    hosts: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    cancel: threading.Event | None = None,
) -> QueryResult:
    """Run one read-only SELECT over the views of every host's database under ``log_dir`` (or
    ``hosts``' only); each view name means the rows of every chosen host, each with its ``host``.

    Raises ``QueryRefused`` (a write, several statements, a SQL error), ``QueryTimeout``,
    ``LookupError`` for a host with no database and ``UnusableStateError``. Setting ``cancel``
    (from a SIGINT handler) stops the statement within a millisecond's work and raises
    ``KeyboardInterrupt``: one raised inside SQLite's callbacks would be swallowed by sqlite3 and
    turn into a misleading SQL error.
    """
    files = _chosen_files(log_dir, hosts)
    created: list[Path] = []
    conn = sqlite3.connect("file::memory:", uri=True, isolation_level=None, check_same_thread=False)
    try:
        with _deadline(conn, timeout, cancel):
            _present_views(conn, files, created)
            return QueryResult(*_run_refusing_writes(conn, sql), hosts=[path.stem for path in files])
    finally:
        conn.close()
        for path in created:
            _remove_index_files(path)


def _chosen_files(log_dir: str | Path, hosts: Sequence[str]) -> list[Path]:
    files = dbfile.database_files(log_dir)
    if not hosts:
        return files
    by_host = {path.stem: path for path in files}
    unknown = [host for host in hosts if host not in by_host]
    if unknown:
        known = ", ".join(by_host) or "none"
        raise LookupError(
            f"--host '{unknown[0]}': no database for it in {Path(log_dir) / dbfile.DB_DIR_NAME}; "
            f"hosts: {known}"
        )
    return [by_host[host] for host in dict.fromkeys(hosts)]


@contextlib.contextmanager
def _deadline(conn: sqlite3.Connection, timeout: float, cancel: threading.Event | None) -> Iterator[None]:
    """Interrupt whatever ``conn`` runs past ``timeout`` seconds (``QueryTimeout``) or once
    ``cancel`` is set (``KeyboardInterrupt``)."""
    ends = time.monotonic() + timeout
    expired = cancelled = False

    def stop_now() -> int:
        nonlocal expired, cancelled
        cancelled = cancel is not None and cancel.is_set()
        expired = time.monotonic() > ends
        return 1 if cancelled or expired else 0

    conn.set_progress_handler(stop_now, _PROGRESS_STEPS)
    try:
        yield
    except sqlite3.OperationalError as exc:
        if cancelled:
            raise KeyboardInterrupt from None
        if expired:
            raise QueryTimeout(
                f"interrupted after {timeout:g}s (--timeout); narrow the query or raise --timeout"
            ) from None
        raise exc
    finally:
        conn.set_progress_handler(None, 0)


def _present_views(conn: sqlite3.Connection, files: list[Path], created: list[Path]) -> None:
    """Attach ``files`` read-only and make each of ``VIEWS`` a TEMP view (or table) over them all.

    Up to SQLite's attach limit (10 by default) every view is a lazy UNION ALL, read in one
    snapshot per statement. Past it, each host is attached in turn and its rows copied into a
    TEMP table, so a cluster of any size can be queried (each host then in its own snapshot).
    """
    _list_in_main_schema(conn)
    # Connection.getlimit is Python 3.11+; 10 is SQLite's compiled-in default.
    getlimit = getattr(conn, "getlimit", None)
    limit = 10 if getlimit is None else int(getlimit(7))  # 7: SQLITE_LIMIT_ATTACHED
    if 0 < len(files) <= limit:
        schemas = [_attach(conn, path, f"h{index}", created) for index, path in enumerate(files)]
        for view, columns in VIEWS.items():
            select = ", ".join(f'"{column}"' for column in columns)
            union = " UNION ALL ".join(f'SELECT {select} FROM {schema}."{view}"' for schema in schemas)
            conn.execute(f'CREATE TEMP VIEW "{view}" AS {union}')
    else:
        for view, columns in VIEWS.items():
            conn.execute(f'CREATE TEMP TABLE "{view}" ({", ".join(columns)})')
        for path in files:
            schema = _attach(conn, path, "h", created)
            for view, columns in VIEWS.items():
                select = ", ".join(f'"{column}"' for column in columns)
                conn.execute(f'INSERT INTO temp."{view}" SELECT {select} FROM h."{view}"')
            conn.execute(f"DETACH {schema}")
    conn.execute("PRAGMA query_only = 1")


def _list_in_main_schema(conn: sqlite3.Connection) -> None:
    """Make ``SELECT * FROM sqlite_master`` list each view, as it does on one host's file.

    The views over every host are TEMP (a view in ``main`` may not read an attached database), so
    ``main`` gets an empty view of each name with the same columns: an unqualified name finds the
    TEMP view first, and only ``main.<view>`` reads the empty one, whose SQL says so.
    """
    for view, columns in VIEWS.items():
        nulls = ", ".join(f'NULL AS "{column}"' for column in columns)
        conn.execute(
            f'CREATE VIEW main."{view}" AS -- empty: {view} means temp.{view}, every host\'s rows\n'
            f"SELECT {nulls} WHERE 0"
        )


def _attach(conn: sqlite3.Connection, path: Path, schema: str, created: list[Path]) -> str:
    """Attach ``path`` as ``schema``, read-only; appends it to ``created`` if SQLite made its -shm."""
    # A database from before the views is migrated first, as status would (migrations only add).
    dbfile.migrate_if_below(path, schema_version())
    had_index = os.path.exists(f"{path}-shm") or os.path.exists(f"{path}-wal")
    uri = _read_only_uri(path, had_index)
    try:
        conn.execute(f"ATTACH DATABASE ? AS {schema}", (uri,))
        if not had_index and "mode=ro" in uri:
            created.append(path)
        version = int(conn.execute(f"PRAGMA {schema}.user_version").fetchone()[0])
        views = {
            row[0] for row in conn.execute(f"SELECT name FROM {schema}.sqlite_master WHERE type = 'view'")
        }
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from None
    missing = [view for view in VIEWS if view not in views]
    if missing:
        raise UnusableStateError(
            f"{path}: schema {version} has no view '{missing[0]}'; not a sidecar-fsm database, "
            "or one written by a newer sidecar-fsm that broke the views; move it away or use --host"
        )
    return schema


def _read_only_uri(path: Path, had_index: bool) -> str:
    """``mode=ro`` where the folder can be written (or the -shm exists); else ``immutable=1``."""
    base = path.resolve().as_uri()
    if os.access(path.parent, os.W_OK) or had_index and os.path.exists(f"{path}-shm"):
        return f"{base}?mode=ro"
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise UnusableStateError(
            f"{path}: read-only folder with a WAL but no -shm beside the database; mount it "
            "read-write once so SQLite can fold the WAL in"
        )
    return f"{base}?mode=ro&immutable=1"


def _remove_index_files(path: Path) -> None:
    """Remove the -wal and -shm a read-only attach left beside an idle database (module docstring);
    best effort: they are harmless if kept."""
    with contextlib.suppress(sqlite3.Error, OSError):
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=1.0)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()


def _run_refusing_writes(conn: sqlite3.Connection, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` with only reads authorized; its columns and rows, or ``QueryRefused``."""
    refused: list[str] = []

    def authorize(action: int, arg1: str | None, arg2: str | None, schema: str | None, _: str | None) -> int:
        if action in _READ_ACTIONS or action == sqlite3.SQLITE_PRAGMA and arg1 in _DESCRIBING_PRAGMAS:
            return sqlite3.SQLITE_OK
        # The first use of a table-valued pragma (pragma_table_info) registers it in the schema
        # of ``main``, which SQLite authorizes as an UPDATE of sqlite_master. ``main`` is this
        # connection's own in-memory database, never a host's file, and query_only stays on.
        if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and schema == "main":
            return sqlite3.SQLITE_OK
        refused.append(_describe(action, arg1))
        return sqlite3.SQLITE_DENY

    conn.set_authorizer(authorize)
    try:
        cursor = conn.execute(sql)
        if cursor.description is None:
            raise QueryRefused(f"{_quoted(sql)} returns no rows; give one SELECT")
        columns = [column[0] for column in cursor.description]
        return columns, cursor.fetchall()
    except sqlite3.ProgrammingError as exc:
        raise QueryRefused(f"{_quoted(sql)}: {str(exc).lower().rstrip('.')}; give one SELECT") from None
    except sqlite3.DatabaseError as exc:
        if refused:
            # SQLite authorizes a CREATE or DROP as the write to its schema table it makes
            # (sqlite_temp_master): a name the user never wrote, so it is not shown.
            named = [words for words in refused if "'sqlite_" not in words]
            what = f" would {named[0]}" if named else " would change the schema"
            raise QueryRefused(
                f"{_quoted(sql)}{what}: writes are refused; query runs one read-only SELECT (or WITH)"
            ) from None
        if isinstance(exc, sqlite3.OperationalError) and str(exc) == "interrupted":
            raise
        raise QueryRefused(f"{_quoted(sql)}: {exc}") from None
    finally:
        conn.set_authorizer(None)


def _describe(action: int, arg1: str | None) -> str:
    if action == sqlite3.SQLITE_TRANSACTION and arg1:
        return f"{arg1.lower()} a transaction"
    words = _ACTIONS[action] if 0 <= action < len(_ACTIONS) else f"do action {action}"
    return f"{words} '{arg1}'" if arg1 else words


def _quoted(sql: str) -> str:
    """The statement as the error's value: one line, shortened past 60 characters."""
    text = " ".join(sql.split())
    return f"'{text[:57]}...'" if len(text) > 60 else f"'{text}'"


def _unusable(path: Path, exc: sqlite3.Error) -> SidecarError:
    error = dbfile.storage_error(path, exc, UnusableStateError)
    if isinstance(error, SidecarError):
        return error
    return UnusableStateError(f"{path}: {str(exc).lower()}; move it away or use --host")
