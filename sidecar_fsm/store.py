"""The per-host state database: the only code that speaks SQL.

Owns ``<log_dir>/sidecar-fsm/<host>.db``: opening it, applying ``migrations/`` in order under a
file lock, refusing a database written by a newer sidecar-fsm, every write (runs, instances,
transitions) and every query. Must not decide state changes: ``fsm`` decides, and
``record_transition`` only checks the expected source state and stores what it was told. Must not
inspect or signal processes (whether a run's owner is alive is ``procs``' call, from the pid and
start time stored here), and never stores a URL with userinfo or a query string.

Concurrency: several launchers, reapers and CLI readers on one host share the file. The journal
is WAL (readers never block the writer). Every write is one ``BEGIN IMMEDIATE`` transaction: the
write lock is taken up front, so a transaction never fails half-way with ``SQLITE_BUSY_SNAPSHOT``
when it upgrades from reading to writing. A writer takes a free lock at once, retries a held one
for a millisecond, then queues on a ``flock`` (``_WriterQueue``) where only the head retries,
within a deadline (``Store._begin_immediate``); checkpoints run after the commit that released the lock
(``Store._checkpoint``). ``synchronous=NORMAL``: a commit survives the process being killed at
any instant; only an OS crash or power loss can lose the last commits, never corrupt the file,
and then every process those commits describe is gone as well.

A ``Store`` is safe to share between threads (one connection behind a lock) but not across
``fork``: open a new one in the child.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple

import filelock
import sqlite_utils

from sidecar_fsm import resources
from sidecar_fsm.errors import SchemaTooNewError, SidecarError
from sidecar_fsm.hostname import host_name
from sidecar_fsm.urls import redact_url

DB_DIR_NAME = "sidecar-fsm"

# SQLite's busy handler while a database is opened and migrated. Afterwards the connection's
# timeout is 0 and this module waits itself (``Store._begin_immediate``, ``Store._rows``): the
# handler's first sleep is a whole millisecond, twenty times what a transition holds the lock.
BUSY_TIMEOUT_SECONDS = 30.0

# How long a write waits for SQLite's write lock, and a read for the rare SQLITE_BUSY of a WAL
# reader (a WAL being recovered after a crash, a checkpoint resetting it), before giving up.
# Writes hold the lock for well under a millisecond, so this is only reached when a process is stuck.
WRITE_DEADLINE_SECONDS = 60.0
FIRST_RETRY_PAUSE_SECONDS = 0.00005
LAST_RETRY_PAUSE_SECONDS = 0.01
# How long a writer retries a held write lock before it queues (``Store._begin_immediate``).
SPIN_SECONDS = 0.001

# Commits of one connection between two checkpoints; about SQLite's default of 1000 WAL pages,
# at 4-5 pages per transition.
CHECKPOINT_EVERY_COMMITS = 200

# Migrating a large database builds indexes; no healthy migration takes this long.
MIGRATION_LOCK_TIMEOUT_SECONDS = 120.0

# The columns an event may set alongside the state (``fsm`` passes them as event arguments).
FACT_COLUMNS = frozenset(
    {"pid", "pid_start_time", "exit_code", "error", "restart_count", "listen", "binary", "metrics"}
)

RUN_OUTCOMES = frozenset({"ended", "failed", "reaped"})

_SQLITE_MAGIC = b"SQLite format 3\x00"
_MIGRATION_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
# A URL inside free text (an error, a log line): everything up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


@dataclass(frozen=True)
class RunRecord:
    """One launcher run. ``ended_at``/``outcome`` are None while the run is live."""

    run_id: str
    host: str
    owner_pid: int
    owner_start_time: float | None
    started_at: float
    ended_at: float | None
    outcome: str | None
    config_summary: dict[str, Any]


@dataclass(frozen=True)
class InstanceRecord:
    """One sidecar instance of a run, as of its last transition. Times are unix seconds."""

    id: int
    run_id: str
    name: str
    listen: str
    upstream: str
    state: str
    state_since: float
    pid: int | None
    pid_start_time: float | None
    binary: str | None
    log_path: str | None
    ready_path: str | None
    exit_code: int | None
    error: str | None
    restart_count: int
    # The proxy's /metrics listener (host:port), recorded by the ``ready`` event; None when the
    # instance runs without metrics or has not been ready yet. Defaulted, so a record built by
    # hand (a test, another tool) from the columns of schema 2 still type-checks.
    metrics: str | None = None


class NewInstance(NamedTuple):
    """An instance to record (``Store.create_instances``): what its launcher knows before it starts."""

    name: str
    listen: str
    upstream: str
    binary: str | None
    log_path: str | None
    ready_path: str | None


@dataclass(frozen=True)
class TransitionRecord:
    """One history row: ``source`` -> ``dest`` by ``event`` at ``at`` (unix seconds)."""

    id: int
    instance_id: int
    source: str
    dest: str
    event: str
    at: float
    detail: str | None


@dataclass(frozen=True)
class Migration:
    """One schema step: ``migrations/NNNN_name.sql``; applying it sets the schema version to ``step``."""

    step: int
    path: Path


def database_path(log_dir: str | Path, host: str | None = None) -> Path:
    """``<log_dir>/sidecar-fsm/<host>.db``: one file per host, so hosts never share a SQLite file.

    ``host`` defaults to ``hostname.host_name()`` (``$SIDECAR_FSM_HOST`` or the machine's name),
    the name ``reap --ray`` uses for each node, so every command agrees on "this host's" file.
    """
    return Path(log_dir) / DB_DIR_NAME / f"{host or host_name()}.db"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """The schema steps in ``directory`` (default: the packaged ``migrations/``), in order.

    Read-only. Raises ``SidecarError`` when the steps are not numbered 1, 2, ... without gaps or
    duplicates: applying a broken sequence could skip a step forever.
    """
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


class Store:
    """An open state database. Use ``Store.open`` (writers) or ``Store.open_existing`` (readers).

    Every method is a complete transaction; the instance is thread-safe and a context manager.
    """

    def __init__(self, path: Path, host: str, conn: sqlite3.Connection) -> None:
        self.path = path
        self.host = host
        # Driver-level autocommit (isolation_level=None): the driver never opens a transaction
        # behind our back, so BEGIN IMMEDIATE below is the only way a write transaction starts.
        self._db = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
        self._lock = threading.RLock()
        self._writers = _WriterQueue(Path(f"{path}.writers"))
        self._uncheckpointed = 0
        # Writes open inside the current transaction() on the thread holding self._lock; a
        # nested write joins that transaction through a savepoint instead of committing alone.
        self._nesting = 0

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, log_dir: str | Path, host: str | None = None) -> Store:
        """Open (creating it and its directory if needed) and migrate this host's database.

        Raises ``SchemaTooNewError`` before anything is written when a newer sidecar-fsm made the
        database, and ``SidecarError`` when the file is not a SQLite database.
        """
        host = host or host_name()
        path = database_path(log_dir, host)
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls._open(path, host)

    @classmethod
    def open_existing(cls, path: str | Path) -> Store:
        """Open an existing database (any host's), for reading; refuses a newer schema like ``open``.

        A database made by an older sidecar-fsm is migrated first (the queries need the current
        columns); migrations only add, so an older launcher still writing it keeps working.
        """
        path = Path(path)
        if not path.is_file():
            raise SidecarError(f"{path}: no such state database; check --log-dir")
        return cls._open(path, path.stem)

    @classmethod
    def _open(cls, path: Path, host: str) -> Store:
        latest = schema_version()
        # The header check needs no SQLite handle: a refused database gets no -wal/-shm files and
        # no checkpoint, so it stays byte-for-byte what the newer sidecar-fsm left.
        _refuse_if_newer(path, _header_schema_version(path), latest)
        conn = sqlite3.connect(
            str(path), timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
        )
        try:
            # The header can lag behind a WAL that a running newer process has not checkpointed,
            # so the version is read again through SQLite before anything is written.
            version = _user_version(conn)
            _refuse_if_newer(path, version, latest)
            if version < latest or _journal_mode(conn) != "wal":
                _migrate_locked(conn, path, latest)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # Store._checkpoint does it, after the commit
            conn.execute("PRAGMA busy_timeout=0")  # waits are this module's (see BUSY_TIMEOUT_SECONDS)
        except BaseException:
            conn.close()
            raise
        return cls(path, host, conn)

    def close(self) -> None:
        """Close the connection (the last one to close checkpoints the WAL into the file)."""
        with self._lock:
            if self._uncheckpointed:
                self._checkpoint()
            self._db.close()
            self._writers.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # -- writes ------------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group the writes made inside the block into one transaction: all are stored or none.

        For a caller that makes several changes in step (a run and its instances, one event for
        each instance of a run): one commit and one turn of the writers' lock instead of one
        each, and no reader ever sees half of the group. Each write inside keeps its own
        all-or-nothing guarantee through a savepoint, so a write that raises and is caught leaves
        the rest of the group intact. Any exception out of the block rolls all of it back.
        Other threads' writes wait until the block ends: keep it short and free of waits.
        """
        with self._write():
            yield

    @contextmanager
    def _write(self) -> Iterator[sqlite_utils.Database]:
        """One write transaction, holding SQLite's write lock from its first statement.

        Rolled back on any exception, so a failed write leaves the database as it was. Inside
        ``transaction()`` it is a savepoint of that transaction instead.
        """
        with self._lock:
            if self._nesting:
                with self._savepoint():
                    yield self._db
                return
            self._begin_immediate()
            self._nesting = 1
            try:
                yield self._db
            except BaseException:
                self._db.rollback()
                raise
            finally:
                self._nesting = 0
            try:
                self._db.conn.execute("COMMIT")
            except BaseException:
                self._db.rollback()
                raise
            # After the commit, which released the write lock: the checkpoint's fsyncs then
            # delay no other writer.
            self._uncheckpointed += 1
            if self._uncheckpointed >= CHECKPOINT_EVERY_COMMITS:
                self._checkpoint()

    def _begin_immediate(self) -> None:
        """Take SQLite's write lock: at once if it is free, else soon, else in turn behind the others.

        The connection's busy timeout is 0 (SQLite's busy handler first sleeps a whole
        millisecond), so each try costs one statement. Three stages, measured with 8 writer
        processes on 2 cores (bench/store.py), where a transition holds the lock 70-150 us:
        1. a free lock is taken at once (one writer alone never waits or queues);
        2. a held one is retried for up to ``SPIN_SECONDS``, giving the core away between tries
           (``sched_yield``), so the lock holder and other writers run first and a writer is
           already running when the lock comes free. Without this stage most writers slept in
           the queue below, the lock changed hands only when the kernel had scheduled a
           sleeper, and the CPUs sat idle a third of the time: 8 writers together made 0.8x the
           transitions per second of one;
        3. then the writer queues on ``_WriterQueue``: a lock held longer (a stuck or stopped
           process, a migration) is polled by one writer only, with pauses from 50 us doubling to
           10 ms, until ``WRITE_DEADLINE_SECONDS``.
        """
        if self._try_begin() is None:
            return
        spin_until = time.monotonic() + SPIN_SECONDS
        while time.monotonic() < spin_until:
            os.sched_yield()
            if self._try_begin() is None:
                return
        with self._writers.turn():
            for _ in _attempts(time.monotonic() + WRITE_DEADLINE_SECONDS):
                busy = self._try_begin()
                if busy is None:
                    return
            raise SidecarError(
                f"{self.path}: could not start a write: {busy}; another process holds "
                "the database, check for a stuck sidecar-fsm"
            ) from busy

    def _try_begin(self) -> sqlite3.OperationalError | None:
        """``BEGIN IMMEDIATE`` once: None when this connection now holds the write lock, the
        SQLITE_BUSY error when another one does; any other error is raised."""
        try:
            self._db.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            return exc
        return None

    @contextmanager
    def _savepoint(self) -> Iterator[None]:
        # Savepoint names are per connection and nest like a stack: the depth makes them unique.
        name = f"write_{self._nesting}"
        conn = self._db.conn
        conn.execute(f"SAVEPOINT {name}")
        self._nesting += 1
        try:
            yield
        except BaseException:
            conn.execute(f"ROLLBACK TO {name}")
            conn.execute(f"RELEASE {name}")
            raise
        finally:
            self._nesting -= 1
        conn.execute(f"RELEASE {name}")

    def _checkpoint(self) -> None:
        """Copy committed WAL frames into the database file (PASSIVE: never blocks a writer).

        Replaces SQLite's auto-checkpoint, which runs inside COMMIT and so inside the writers'
        turn, where its fsyncs would stall every writer on the host. Best effort: a checkpoint
        that cannot finish now leaves the frames for the next one.
        """
        self._uncheckpointed = 0
        with contextlib.suppress(sqlite3.Error):
            self._db.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def create_run(
        self,
        run_id: str,
        owner_pid: int,
        owner_start_time: float | None,
        config_summary: Mapping[str, Any],
    ) -> RunRecord:
        """Record a live run owned by ``owner_pid`` (whose start time tells it from a reused pid).

        URL values anywhere in ``config_summary`` are redacted before storage. Raises
        ``sqlite3.IntegrityError`` if ``run_id`` exists.
        """
        summary = _redact_tree(dict(config_summary))
        row = {
            "run_id": run_id,
            "host": self.host,
            "owner_pid": owner_pid,
            "owner_start_time": owner_start_time,
            "started_at": time.time(),
            "ended_at": None,
            "outcome": None,
            "config_summary": json.dumps(summary, sort_keys=True, default=str),
        }
        with self._write() as db:
            _insert(db, "runs", row)
        return _run_record({**row, "config_summary": row["config_summary"]})

    def end_run(self, run_id: str, outcome: str) -> None:
        """Mark a run finished with ``outcome`` ("ended", "failed" or "reaped"); sets ``ended_at``.

        Idempotent: a run that already ended keeps its first outcome and time (a reaper racing the
        owner's own shutdown must not overwrite "ended" with "reaped"). Raises ``SidecarError`` for
        an unknown run or outcome.
        """
        if outcome not in RUN_OUTCOMES:
            raise ValueError(f"end_run: '{outcome}' is not an outcome; use one of {sorted(RUN_OUTCOMES)}")
        with self._write() as db:
            cursor = db.execute(
                "UPDATE runs SET ended_at = ?, outcome = ? WHERE run_id = ? AND ended_at IS NULL",
                [time.time(), outcome, run_id],
            )
            if cursor.rowcount == 0 and _first(db, "SELECT 1 FROM runs WHERE run_id = ?", [run_id]) is None:
                raise SidecarError(f"end_run: run '{run_id}' does not exist in {self.path}")

    def create_instance(
        self,
        run_id: str,
        name: str,
        listen: str,
        upstream: str,
        binary: str | None,
        log_path: str | None,
        ready_path: str | None,
    ) -> InstanceRecord:
        """Record an instance of ``run_id`` in state ``configured``; ``upstream`` is stored redacted.

        Raises ``sqlite3.IntegrityError`` for an unknown run or a name already used in the run.
        """
        new = NewInstance(name, listen, upstream, binary, log_path, ready_path)
        return self.create_instances(run_id, [new])[0]

    def create_instances(self, run_id: str, instances: Sequence[NewInstance]) -> list[InstanceRecord]:
        """Record several instances of ``run_id`` at once, as ``create_instance`` does each; all or none.

        One statement per instance and one to read them back: a launcher records every instance
        of a run before its first proxy starts. Raises ``sqlite3.IntegrityError`` like
        ``create_instance``, with none of them recorded.
        """
        now = time.time()
        with self._write() as db:
            ids = [
                _insert(
                    db,
                    "instances",
                    {
                        "run_id": run_id,
                        "name": new.name,
                        "listen": new.listen,
                        "upstream": redact_url(new.upstream),
                        "state": "configured",
                        "state_since": now,
                        "binary": new.binary,
                        "log_path": new.log_path,
                        "ready_path": new.ready_path,
                    },
                )
                for new in instances
            ]
            sql = f"SELECT * FROM instances WHERE id IN ({', '.join('?' for _ in ids)})"
            by_id = {row["id"]: row for row in db.query(sql, ids)}
        return [_instance_record(by_id[instance_id]) for instance_id in ids]

    def record_transition(
        self,
        instance_id: int,
        source: str,
        dest: str,
        event: str,
        detail: str | None,
        facts: Mapping[str, Any],
    ) -> None:
        """Move the instance from ``source`` to ``dest`` and append its history row, atomically.

        Called by ``fsm`` before its machine moves, so the database is never behind what the
        launcher acts on. The update only applies if the row is still in ``source``: two machines
        (two processes) driving one instance cannot both win, and the loser gets ``SidecarError``
        with nothing written. ``facts`` (keys from ``FACT_COLUMNS``) are written in the same
        transaction; an unknown key raises ``ValueError`` before anything is written. URLs inside
        ``detail`` and ``error`` are redacted.
        """
        unknown = sorted(set(facts) - FACT_COLUMNS)
        if unknown:
            raise ValueError(f"record_transition: unknown facts {unknown}; facts are {sorted(FACT_COLUMNS)}")
        detail = _redact_text(detail)
        now = time.time()
        columns: dict[str, Any] = {"state": dest, "state_since": now}
        for key, value in facts.items():
            columns[key] = _redact_text(value) if key == "error" else value
        # Column names come from FACT_COLUMNS only (checked above), never from the caller's text.
        assignments = ", ".join(f"{name} = ?" for name in columns)
        # The hot path talks to the connection directly: sqlite-utils' execute() re-parses each
        # statement's first keyword, and everything between BEGIN and COMMIT delays every other
        # writer on the host.
        with self._write() as db:
            conn = db.conn
            cursor = conn.execute(
                f"UPDATE instances SET {assignments} WHERE id = ? AND state = ?",
                [*columns.values(), instance_id, source],
            )
            if cursor.rowcount != 1:
                found = _first(db, "SELECT state FROM instances WHERE id = ?", [instance_id])
                if found is None:
                    raise SidecarError(f"instance {instance_id}: does not exist in {self.path}")
                raise SidecarError(
                    f"instance {instance_id}: state is '{found['state']}', not '{source}'; another "
                    f"process moved it, reload it before firing '{event}'"
                )
            conn.execute(
                "INSERT INTO transitions (instance_id, source, dest, event, at, detail) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (instance_id, source, dest, event, now, detail),
            )

    # -- reads -------------------------------------------------------------------------------

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        # list(): a half-read cursor would keep a read transaction open and stall checkpoints.
        with self._lock:
            busy: sqlite3.OperationalError | None = None
            for _ in _attempts(time.monotonic() + WRITE_DEADLINE_SECONDS):
                try:
                    return list(self._db.query(sql, list(params)))
                except sqlite3.OperationalError as exc:
                    # WAL readers take no lock; only recovery or a WAL reset makes one wait.
                    if not _is_busy(exc):
                        raise
                    busy = exc
            assert busy is not None
            raise busy

    def list_runs(self, which: Literal["live", "finished", "all"] = "all") -> list[RunRecord]:
        """Runs, newest first. ``live``: not ended (its owner may still have died: ask ``procs``)."""
        where = {"live": "WHERE ended_at IS NULL", "finished": "WHERE ended_at IS NOT NULL", "all": ""}
        if which not in where:
            raise ValueError(f"list_runs: '{which}' is not one of live, finished, all")
        rows = self._rows(f"SELECT * FROM runs {where[which]} ORDER BY started_at DESC, rowid DESC")
        return [_run_record(row) for row in rows]

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None if this database has no such run."""
        rows = self._rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        return _run_record(rows[0]) if rows else None

    def instances_of(self, run_id: str) -> list[InstanceRecord]:
        """The run's instances in creation order."""
        rows = self._rows("SELECT * FROM instances WHERE run_id = ? ORDER BY id", [run_id])
        return [_instance_record(row) for row in rows]

    def get_instance(self, instance_id: int) -> InstanceRecord | None:
        """The instance as of its last transition, or None if there is no such instance."""
        rows = self._rows("SELECT * FROM instances WHERE id = ?", [instance_id])
        return _instance_record(rows[0]) if rows else None

    def history(self, instance_id: int) -> list[TransitionRecord]:
        """The instance's transitions, oldest first."""
        rows = self._rows("SELECT * FROM transitions WHERE instance_id = ? ORDER BY id", [instance_id])
        return [TransitionRecord(**row) for row in rows]

    def instances_in_states(self, states: Iterable[str]) -> list[InstanceRecord]:
        """Instances of any run whose state is one of ``states``, in creation order.

        Scans the instance table on purpose (see migrations/0002): an index on ``state`` would be
        rewritten by every transition, inside the write lock all writers share.
        """
        wanted = sorted(set(states))
        if not wanted:
            return []
        marks = ", ".join("?" for _ in wanted)
        rows = self._rows(f"SELECT * FROM instances WHERE state IN ({marks}) ORDER BY id", wanted)
        return [_instance_record(row) for row in rows]

    def live_instance_on_listen(self, listen: str) -> InstanceRecord | None:
        """The newest non-terminal instance recorded on ``listen`` (host:port), if any."""
        rows = self._rows(
            "SELECT * FROM instances WHERE listen = ? AND state NOT IN ('stopped', 'failed') "
            "ORDER BY id DESC LIMIT 1",
            [listen],
        )
        return _instance_record(rows[0]) if rows else None


class _WriterQueue:
    """Orders the writers that found SQLite's write lock held, so that only one of them polls it.

    SQLite makes a blocked writer poll: its busy handler sleeps 1, 2, 5, ... up to 100 ms between
    tries, while a transition holds the lock for a fraction of a millisecond, and every blocked
    writer polls. Writers that met a held lock here take an exclusive ``flock`` on
    ``<db>.writers`` first; its holder retries ``BEGIN IMMEDIATE`` with short pauses, the rest
    sleep in the kernel until it has the write lock and hands the ``flock`` on.

    Correctness never depends on it: SQLite's own lock still guards every transaction, and where
    ``flock`` is not supported the queue steps aside. The kernel drops the lock of a killed
    process; a writer that is stopped (SIGSTOP, a debugger) while it holds the turn holds up the
    queue until it continues or dies, as it would hold SQLite's write lock anyway.
    """

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            self._fd = None  # e.g. a read-only log dir: readers never write, writers fall back

    @contextmanager
    def turn(self) -> Iterator[None]:
        fd = self._fd
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                fd = None
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_all_hosts(log_dir: str | Path) -> list[Store]:
    """Every host's database under ``<log_dir>/sidecar-fsm/``, sorted by host (read side).

    Raises like ``Store.open_existing`` (``SchemaTooNewError`` for a newer host's database);
    the stores opened before the failure are closed first.
    """
    stores: list[Store] = []
    try:
        for path in sorted((Path(log_dir) / DB_DIR_NAME).glob("*.db")):
            stores.append(Store.open_existing(path))
    except BaseException:
        for store in stores:
            store.close()
        raise
    return stores


# -- schema ------------------------------------------------------------------------------------


def _header_schema_version(path: Path) -> int:
    """``user_version`` from the file header (offset 60), read without SQLite; 0 if absent or empty."""
    try:
        with open(path, "rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        return 0
    if not header:
        return 0
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise SidecarError(f"{path}: not a SQLite database; move it away or use another --log-dir")
    return int.from_bytes(header[60:64], "big")


def _refuse_if_newer(path: Path, version: int, latest: int) -> None:
    if version > latest:
        raise SchemaTooNewError(
            f"{path}: schema {version} is newer than this sidecar-fsm ({latest}); "
            "upgrade it or use another --log-dir"
        )


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _journal_mode(conn: sqlite3.Connection) -> str:
    return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def _migrate_locked(conn: sqlite3.Connection, path: Path, latest: int) -> None:
    """Bring the database to ``latest`` under ``<db>.lock``; a no-op if another process just did.

    The file lock serializes openers of an old or new database: without it two processes would
    both see version N and both apply step N+1 (the second fails on "table exists"), and one
    could switch the journal to WAL while another is mid-transaction. Each step and its version
    bump commit together, so a crash between steps resumes at the next step.
    """
    lock = filelock.FileLock(f"{path}.lock", timeout=MIGRATION_LOCK_TIMEOUT_SECONDS)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise SidecarError(
            f"{path}.lock: not acquired within {MIGRATION_LOCK_TIMEOUT_SECONDS:.0f}s; another sidecar-fsm "
            "is migrating or stuck, check its processes"
        ) from None
    try:
        version = _user_version(conn)
        _refuse_if_newer(path, version, latest)
        # WAL is a property of the file, set once; switching needs an exclusive moment, which the
        # lock plus the busy timeout give us.
        if _journal_mode(conn) != "wal":
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise SidecarError(
                    f"{path}: journal mode stayed '{mode}'; put --log-dir on a local filesystem"
                )
        for migration in load_migrations():
            if migration.step <= version:
                continue
            script = migration.path.read_text(encoding="utf-8")
            try:
                # One transaction per step, version bump included (user_version is transactional).
                conn.executescript(
                    f"BEGIN IMMEDIATE;\n{script}\n;\nPRAGMA user_version = {migration.step};\nCOMMIT;"
                )
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise SidecarError(
                    f"{migration.path}: step {migration.step} failed on {path}: {exc}; the database "
                    f"stays at schema {migration.step - 1}"
                ) from exc
    finally:
        lock.release()


# -- rows and redaction ------------------------------------------------------------------------


def _attempts(deadline: float) -> Iterator[None]:
    """Paces the retries of a busy database: once now, then after pauses from
    ``FIRST_RETRY_PAUSE_SECONDS`` doubling to ``LAST_RETRY_PAUSE_SECONDS``, until ``deadline``."""
    yield
    pause = FIRST_RETRY_PAUSE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, LAST_RETRY_PAUSE_SECONDS)
        yield


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _insert(db: sqlite_utils.Database, table: str, row: Mapping[str, Any]) -> int:
    """INSERT ``row`` into ``table`` (names from this module only); returns the new rowid.

    Plain SQL rather than ``Table.insert``: sqlite-utils introspects the table's schema on every
    insert (0.28 ms of a launcher's warm start per instance, inside the writers' lock).
    """
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    cursor = db.conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values()))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _first(db: sqlite_utils.Database, sql: str, params: list[Any]) -> dict[str, Any] | None:
    cursor = db.execute(sql, params)
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([d[0] for d in cursor.description], row, strict=True))


def _run_record(row: Mapping[str, Any]) -> RunRecord:
    fields = dict(row)
    fields["config_summary"] = json.loads(fields["config_summary"] or "{}")
    return RunRecord(**fields)


def _instance_record(row: Mapping[str, Any]) -> InstanceRecord:
    return InstanceRecord(**row)


def _redact_text(text: Any) -> Any:
    """Free text with every URL in it redacted (error messages quote the URL they failed on)."""
    if not isinstance(text, str):
        return text
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)


def _redact_tree(value: Any) -> Any:
    """A JSON-like tree with every string that contains a URL redacted."""
    if isinstance(value, Mapping):
        return {str(key): _redact_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_tree(item) for item in value]
    return _redact_text(value)
