"""The schema of the state database: its numbered steps and applying the missing ones.

Owns reading ``migrations/`` (numbered 1..N, never edited once merged), the version this code
writes, refusing a newer database, and ``migrate``. Must not open, create or locate the file
(``dbfile`` does, then calls ``migrate``) nor read or write runs (``store``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sidecar_fsm.base import resources
from sidecar_fsm.errors import SchemaTooNewError, SidecarError
from sidecar_fsm.state import storagefault

_MIGRATION_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


@dataclass(frozen=True)
class Migration:
    """One schema step: ``migrations/NNNN_name.sql``; applying it sets the schema version to ``step``."""

    step: int
    path: Path


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """The schema steps in ``directory`` (default: the packaged ``migrations/``), in order. Raises
    ``SidecarError`` for gaps or duplicates: applying a broken sequence could skip a step forever."""
    directory = resources.MIGRATIONS_DIR if directory is None else directory
    steps = []
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.fullmatch(path.name)
        if match is None:
            raise SidecarError(f"{path}: '{path.name}' is not a migration name; use NNNN_words.sql")
        steps.append(Migration(int(match.group(1)), path))
    numbers = [m.step for m in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise SidecarError(
            f"{directory}: migration steps {numbers} are not 1..N without gaps; fix the package"
        )
    return steps


@lru_cache(maxsize=1)
def schema_version() -> int:
    """The schema version this code writes: the highest step in ``migrations/``."""
    return len(load_migrations())


def refuse_if_newer(path: Path, version: int, latest: int) -> None:
    if version > latest:
        raise SchemaTooNewError(
            f"{path}: schema {version} is newer than this sidecar-fsm ({latest}); "
            "upgrade it or use another --log-dir"
        )


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the missing steps and record the version, all in one transaction; a no-op if current.

    The version is read after the write lock is taken, so of two processes opening an old
    database at once the second finds the work done. A failure rolls every step back.
    """
    latest = schema_version()
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = user_version(conn)
        refuse_if_newer(path, version, latest)
        for migration in load_migrations():
            if migration.step <= version:
                continue
            try:
                for statement in _statements(migration.path.read_text(encoding="utf-8")):
                    conn.execute(statement)
            except sqlite3.Error as exc:
                if storagefault.is_storage_error(exc):
                    raise
                raise SidecarError(
                    f"{migration.path}: step {migration.step} failed on {path}: {exc}; the database "
                    f"stays at schema {version}"
                ) from None
        if version < latest:
            conn.execute(f"PRAGMA user_version = {latest}")
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise


def _statements(script: str) -> Iterator[str]:
    """The statements of a migration script, one at a time (SQLite's tokenizer finds their ends).

    ``executescript`` would do it in one call, but it commits an open transaction first, and the
    migration must run inside the one whose write lock guards the version check.
    """
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if sqlite3.complete_statement(pending + ";") and pending.strip() and not _only_comments(pending):
        yield pending


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())
