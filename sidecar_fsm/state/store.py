"""The per-host state database's rows: with ``dbfile`` (the file itself), the only code that speaks SQL.

Owns every write (runs, instances, transitions, traffic records) and every query of
``<log_dir>/sidecar-fsm/<host>.db``; ``records`` are the values it returns, ``states`` the groups
it selects by. Must not decide state changes (``fsm`` does; ``record_transition`` only checks the
expected source state), inspect or signal processes (``procs``), or store a URL with userinfo or
a query string.

Concurrency: launchers, reapers and readers on one host share the file (WAL: readers never block
the writer). Every write is one ``BEGIN IMMEDIATE`` transaction, so none fails half-way with
``SQLITE_BUSY_SNAPSHOT`` when it upgrades from reading to writing; a writer finding the lock held
waits (``dbfile.BUSY_TIMEOUT_SECONDS``). ``synchronous=NORMAL``: a commit survives the process
being killed at any instant; an OS crash can lose the last commits, never corrupt the file, and
then the processes they describe are gone too. A failed write is rolled back whole; one failing
because of the file (full, read-only, corrupt) raises a one-line ``SidecarError``. A ``Store`` is
thread-safe (one connection behind a lock), not fork-safe: open a new one in the child.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from sidecar_fsm.base.urls import redact_text, redact_tree, redact_url
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.state import dbfile, storagefault
from sidecar_fsm.state.dbfile import DB_DIR_NAME, database_path  # re-exported: callers and tests
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.records import (
    InstanceRecord,
    NewInstance,
    RunRecord,
    TrafficRecord,
    TransitionRecord,
    run_record,
)
from sidecar_fsm.state.schema import Migration, load_migrations, schema_version  # know them as store's
from sidecar_fsm.state.states import SERVING_METRICS

if TYPE_CHECKING:
    import sqlite_utils

__all__ = [
    "DB_DIR_NAME",
    "FACT_COLUMNS",
    "InstanceRecord",
    "Migration",
    "NewInstance",
    "RunRecord",
    "Store",
    "TrafficRecord",
    "TransitionRecord",
    "database_path",
    "load_migrations",
    "open_all_hosts",
    "schema_version",
]

# The columns an event may set alongside the state (``fsm`` passes them as event arguments).
FACT_COLUMNS = frozenset(
    {"pid", "pid_start_time", "exit_code", "error", "restart_count", "listen", "binary", "metrics"}
)

RUN_OUTCOMES = frozenset({"ended", "failed", "reaped"})

# How long one attempt at the write lock blocks inside SQLite. Its busy handler sleeps in C,
# where Python cannot run a signal handler: a Ctrl-C during a wait for another process's lock
# would otherwise be answered only when the wait ends (up to the busy timeout, a minute).
_LOCK_SLICE_SECONDS = 0.05


def _begin_immediate(conn: sqlite3.Connection, wait_seconds: float, busy_timeout: float) -> None:
    """``BEGIN IMMEDIATE``, waiting up to ``wait_seconds`` for the lock in slices (see above); the
    connection's ``busy_timeout`` (seconds) is put back afterwards."""
    deadline = time.monotonic() + wait_seconds
    conn.execute(f"PRAGMA busy_timeout = {int(_LOCK_SLICE_SECONDS * 1000)}")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # Python 3.10 has no error code: "database is locked" is SQLITE_BUSY's text.
                code = getattr(exc, "sqlite_errorcode", None)
                busy = (code & 0xFF) == storagefault.SQLITE_BUSY if code is not None else "locked" in str(exc)
                if not busy or time.monotonic() >= deadline:
                    raise
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")


class Store:
    """An open state database. Use ``Store.open`` (writers) or ``Store.open_existing`` (readers).

    Every method is a complete transaction; the instance is thread-safe and a context manager.
    """

    def __init__(self, path: Path, host: str, conn: sqlite3.Connection) -> None:
        self.path = path
        self.host = host
        # Driver-level autocommit (isolation_level=None): the driver never opens a transaction
        # behind our back, so BEGIN IMMEDIATE below is the only way a write transaction starts.
        self._conn = conn
        # The busy timeout the connection was opened with (dbfile): a write waits that long for
        # another process's lock unless told otherwise, as it did before the wait was sliced.
        self._busy_timeout = dbfile.BUSY_TIMEOUT_SECONDS
        self._writer: sqlite_utils.Database | None = None
        self._lock = threading.RLock()
        # Writes open inside the current transaction() on the thread holding self._lock; a
        # nested write joins that transaction through a savepoint instead of committing alone.
        self._nesting = 0

    @property
    def _db(self) -> sqlite_utils.Database:
        """sqlite-utils over our connection, made at the first write: importing it (with click and
        dateutil) would cost a read command such as ``status`` more than all its queries."""
        if self._writer is None:
            import sqlite_utils

            self._writer = sqlite_utils.Database(self._conn, recursive_triggers=False, execute_plugins=False)
        return self._writer

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, log_dir: str | Path, host: str | None = None) -> Store:
        """Open (creating it and its directory if needed) and migrate this host's database.

        Raises ``UnusableStateError`` (``SchemaTooNewError`` for a newer schema) with one line
        when the log dir or the file cannot be used (see ``dbfile``), before anything is created.
        """
        host = host or host_name()
        path, conn = dbfile.open_for_writing(log_dir, host)
        return cls(path, host, conn)

    @classmethod
    def open_existing(cls, path: str | Path) -> Store:
        """Open an existing database (any host's) for reading, migrated if older; refuses what
        ``open`` refuses."""
        path = Path(path)
        return cls(path, path.stem, dbfile.open_for_reading(path))

    def close(self) -> None:
        """Close the connection (the last one to close checkpoints the WAL into the file)."""
        with self._lock:
            dbfile.close(self._conn)

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
    def transaction(self, wait_seconds: float | None = None) -> Iterator[None]:
        """Group the writes made inside the block into one transaction: all are stored or none.

        One commit and one turn of the write lock, and no reader sees half of the group. Each write
        inside is a savepoint, so one that raises and is caught leaves the rest intact; an
        exception out of the block rolls all back. Other threads' writes wait until the block
        ends: keep it short. ``wait_seconds`` bounds the wait for another process's lock (a start's
        deadline); otherwise SQLite's busy timeout applies.
        """
        with self._write(wait_seconds):
            yield

    @contextmanager
    def _write(self, wait_seconds: float | None = None) -> Iterator[sqlite_utils.Database]:
        """One write transaction holding the write lock from its first statement, rolled back on
        any exception; inside ``transaction()``, a savepoint of that transaction."""
        with self._lock:
            if self._nesting:
                with self._savepoint():
                    yield self._db
                return
            conn = self._conn
            waited = self._busy_timeout if wait_seconds is None else wait_seconds
            try:
                _begin_immediate(conn, waited, self._busy_timeout)
            except sqlite3.Error as exc:
                self._raise_failed(exc, "could not start a write", waited)
            self._nesting = 1
            try:
                yield self._db
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                # A failed COMMIT (SQLITE_FULL while appending to the WAL) leaves the
                # transaction open: rolling it back is what makes the write all-or-nothing.
                conn.rollback()
                self._raise_failed(exc, "write rolled back")
            except BaseException:
                conn.rollback()
                raise
            finally:
                self._nesting = 0

    def _raise_failed(self, exc: sqlite3.Error, doing: str, waited: float | None = None) -> NoReturn:
        """Raise ``exc`` as one line naming the database if the file or filesystem is at fault,
        else as it is (a constraint: the caller's ``sqlite3.IntegrityError``)."""
        error = dbfile.storage_error(self.path, exc, doing=doing, waited=waited)
        if error is exc:
            raise exc
        raise error from exc

    @contextmanager
    def _savepoint(self) -> Iterator[None]:
        # Savepoint names are per connection and nest like a stack: the depth makes them unique.
        name = f"write_{self._nesting}"
        conn = self._conn
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

    def create_run(
        self,
        run_id: str,
        owner_pid: int,
        owner_start_time: float | None,
        config_summary: Mapping[str, Any],
    ) -> RunRecord:
        """Record a live run owned by ``owner_pid`` (whose start time tells it from a reused pid),
        URLs in ``config_summary`` redacted. Raises ``sqlite3.IntegrityError`` if ``run_id`` exists."""
        summary = redact_tree(dict(config_summary))
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
            db.table("runs").insert(row)
        return run_record(row)

    def end_run(self, run_id: str, outcome: str) -> None:
        """Mark a run finished with ``outcome`` (``RUN_OUTCOMES``) now. Idempotent: an ended run
        keeps its first outcome and time (a reaper racing the owner's shutdown must not overwrite
        "ended" with "reaped"). Raises ``SidecarError`` for an unknown run."""
        if outcome not in RUN_OUTCOMES:
            raise ValueError(f"end_run: '{outcome}' is not an outcome; use one of {sorted(RUN_OUTCOMES)}")
        with self._write() as db:
            cursor = db.execute(
                "UPDATE runs SET ended_at = ?, outcome = ? WHERE run_id = ? AND ended_at IS NULL",
                [time.time(), outcome, run_id],
            )
            if cursor.rowcount == 0 and _first(db, "SELECT 1 FROM runs WHERE run_id = ?", [run_id]) is None:
                raise SidecarError(f"end_run: run '{run_id}' does not exist in {self.path}")

    def delete_ended_run(self, run_id: str) -> list[InstanceRecord]:
        """Delete an ended run with its instances, their transitions and traffic; return the deleted
        instances (their files are the caller's). Re-read inside the write lock: a live or unknown
        run is never touched, whatever the caller read before, and the answer is then []."""
        with self._write() as db:
            row = _first(db, "SELECT ended_at FROM runs WHERE run_id = ?", [run_id])
            if row is None or row["ended_at"] is None:
                return []
            rows = list(db.query("SELECT * FROM instances WHERE run_id = ? ORDER BY id", [run_id]))
            for table in ("transitions", "traffic", "traffic_quantiles"):
                db.execute(
                    f"DELETE FROM {table} WHERE instance_id IN (SELECT id FROM instances WHERE run_id = ?)",
                    [run_id],
                )
            db.execute("DELETE FROM instances WHERE run_id = ?", [run_id])
            db.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
        return [InstanceRecord(**row) for row in rows]

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
        Raises ``sqlite3.IntegrityError`` for an unknown run or a name already used in the run."""
        new = NewInstance(name, listen, upstream, binary, log_path, ready_path)
        return self.create_instances(run_id, [new])[0]

    def create_instances(self, run_id: str, instances: Sequence[NewInstance]) -> list[InstanceRecord]:
        """Record several instances of ``run_id`` in one transaction, as ``create_instance`` does
        each; raises like it, with none of them recorded."""
        now = time.time()
        with self._write() as db:
            table = db.table("instances")
            ids: list[int] = []
            for new in instances:
                row = {
                    "run_id": run_id,
                    "name": new.name,
                    "listen": new.listen,
                    "upstream": redact_url(new.upstream),
                    "state": "configured",
                    "state_since": now,
                    "binary": new.binary,
                    "log_path": new.log_path,
                    "ready_path": new.ready_path,
                }
                inserted = table.insert(row).last_rowid
                assert inserted is not None  # an INSERT that did not raise made its row
                ids.append(inserted)
            sql = f"SELECT * FROM instances WHERE id IN ({_marks(ids)})"
            by_id = {row["id"]: row for row in db.query(sql, ids)}
        return [InstanceRecord(**by_id[instance_id]) for instance_id in ids]

    def record_transition(
        self,
        instance_id: int,
        source: str,
        dest: str,
        event: str,
        detail: str | None,
        facts: Mapping[str, Any],
    ) -> None:
        """Move the instance from ``source`` to ``dest`` with ``facts`` (``FACT_COLUMNS``) and append
        its history row, atomically; URLs in ``detail`` and ``error`` are redacted.

        Applies only if the row is still in ``source``: of two processes driving one instance the
        loser gets ``SidecarError`` with nothing written. An unknown fact raises ``ValueError``.
        """
        unknown = sorted(set(facts) - FACT_COLUMNS)
        if unknown:
            raise ValueError(f"record_transition: unknown facts {unknown}; facts are {sorted(FACT_COLUMNS)}")
        detail = redact_text(detail)
        now = time.time()
        columns: dict[str, Any] = {"state": dest, "state_since": now}
        for key, value in facts.items():
            columns[key] = redact_text(value) if key == "error" else value
        # Column names come from FACT_COLUMNS only (checked above), never from the caller's text.
        assignments = ", ".join(f"{name} = ?" for name in columns)
        with self._write() as db:
            cursor = db.execute(
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
            db.execute(
                "INSERT INTO transitions (instance_id, source, dest, event, at, detail) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [instance_id, source, dest, event, now, detail],
            )

    # -- reads -------------------------------------------------------------------------------

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        # list(): a half-read cursor would keep a read transaction open and stall checkpoints.
        with self._lock:
            try:
                cursor = self._conn.execute(sql, list(params))
                keys = [column[0] for column in cursor.description]
                return [dict(zip(keys, row, strict=True)) for row in cursor]
            except sqlite3.Error as exc:
                self._raise_failed(exc, "read failed")

    def list_runs(self, which: Literal["live", "finished", "all"] = "all") -> list[RunRecord]:
        """Runs, newest first. ``live``: not ended (its owner may still have died: ask ``procs``)."""
        where = {"live": "WHERE ended_at IS NULL", "finished": "WHERE ended_at IS NOT NULL", "all": ""}
        if which not in where:
            raise ValueError(f"list_runs: '{which}' is not one of live, finished, all")
        rows = self._rows(f"SELECT * FROM runs {where[which]} ORDER BY started_at DESC, rowid DESC")
        return [run_record(row) for row in rows]

    def runs_ended_before(self, before: float) -> list[RunRecord]:
        """Ended runs whose end is older than ``before`` (unix seconds), oldest first."""
        rows = self._rows(
            "SELECT * FROM runs WHERE ended_at IS NOT NULL AND ended_at < ? ORDER BY ended_at", [before]
        )
        return [run_record(row) for row in rows]

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None if this database has no such run."""
        rows = self._rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        return run_record(rows[0]) if rows else None

    def instances_of(self, run_id: str) -> list[InstanceRecord]:
        """The run's instances in creation order."""
        rows = self._rows("SELECT * FROM instances WHERE run_id = ? ORDER BY id", [run_id])
        return [InstanceRecord(**row) for row in rows]

    def get_instance(self, instance_id: int) -> InstanceRecord | None:
        """The instance as of its last transition, or None if there is no such instance."""
        rows = self._rows("SELECT * FROM instances WHERE id = ?", [instance_id])
        return InstanceRecord(**rows[0]) if rows else None

    def history(self, instance_id: int) -> list[TransitionRecord]:
        """The instance's transitions, oldest first."""
        rows = self._rows("SELECT * FROM transitions WHERE instance_id = ? ORDER BY id", [instance_id])
        return [TransitionRecord(**row) for row in rows]

    def instances_in_states(self, states: Iterable[str]) -> list[InstanceRecord]:
        """Instances of any run whose state is one of ``states``, in creation order. A scan on
        purpose (migrations/0002): an index on ``state`` would be rewritten by every transition."""
        wanted = sorted(set(states))
        if not wanted:
            return []
        rows = self._rows(f"SELECT * FROM instances WHERE state IN ({_marks(wanted)}) ORDER BY id", wanted)
        return [InstanceRecord(**row) for row in rows]

    def metrics_targets(self) -> list[InstanceRecord]:
        """Instances serving ``/metrics`` as recorded: ready or draining, with a metrics address,
        in a run not ended; in creation order. Whether each process still runs is the caller's
        question (``procs``): a launcher killed with -9 leaves its rows saying ready."""
        serving = sorted(SERVING_METRICS)
        rows = self._rows(
            "SELECT instances.* FROM instances JOIN runs ON runs.run_id = instances.run_id "
            f"WHERE runs.ended_at IS NULL AND instances.state IN ({_marks(serving)}) "
            "AND instances.metrics IS NOT NULL ORDER BY instances.id",
            serving,
        )
        return [InstanceRecord(**row) for row in rows]

    # -- traffic (issue 28): one proxy process's record, and the view every reader reads ------

    def record_traffic(self, instance_id: int, record: TrafficRecord) -> bool:
        """Store one proxy process's record for ``instance_id``; True when that changed a row.

        One row per (instance, pid), replaced only by a later ``as_of``: importing is idempotent
        and a restart's processes add up. One upsert statement, so two importers (a launcher's stop
        and a reap) cannot race; a changed row recomputes the instance's percentiles in the same
        transaction. Raises ``sqlite3.IntegrityError`` for an unknown instance.
        """
        sql = (
            "INSERT INTO traffic (instance_id, pid, as_of, record) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (instance_id, pid) DO UPDATE SET as_of = excluded.as_of, record = excluded.record "
            "WHERE excluded.as_of > traffic.as_of"
        )
        values = [instance_id, record.pid, record.as_of, json.dumps(record.document)]
        with self._write() as db:
            if db.conn.execute(sql, values).rowcount == 0:
                return False
            db.conn.execute(_QUANTILES_SQL, {"instance_id": instance_id})
            return True

    def traffic_pids(self, instance_id: int) -> set[int]:
        """The pids whose figures are stored for ``instance_id`` (an earlier process's, after a restart)."""
        rows = self._rows("SELECT pid FROM traffic WHERE instance_id = ?", [instance_id])
        return {int(row["pid"]) for row in rows}

    def traffic_summary(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The ``traffic_summary`` rows (docs/query.md) with figures, of ``run_id`` or of every run."""
        sql = "SELECT * FROM traffic_summary WHERE as_of IS NOT NULL"
        if run_id is None:
            return self._rows(sql)
        return self._rows(f"{sql} AND run_id = ?", [run_id])


def _quantile(histogram: str, above: int, of: int) -> str:
    """The upper bound of the first bucket of ``histogram``, every process of the instance added,
    whose cumulative count reaches the nearest rank ``below * above >= of * total`` (integers: no
    float product lands just above a whole number); NULL in +Inf or when nothing was counted.
    ``+ 0.0``: a bound written as ``1`` is the REAL 1.0."""
    return (
        "(SELECT min(le) FROM ("
        " SELECT le, sum(n) OVER (ORDER BY le IS NULL, le ROWS UNBOUNDED PRECEDING) AS below,"
        " sum(n) OVER () AS total FROM ("
        "  SELECT b.value + 0.0 AS le, sum(c.value) AS n FROM traffic AS t"
        f"  JOIN json_each(t.record, '$.{histogram}.counts') AS c"
        f"  LEFT JOIN json_each(t.record, '$.{histogram}.bounds') AS b ON b.key = c.key"
        "  WHERE t.instance_id = :instance_id GROUP BY le)"
        f") WHERE below * {above} >= {of} * total)"
    )


# One instance's six percentiles into ``traffic_quantiles`` (migrations/0005), which
# ``traffic_summary`` reads; the quantiles' ranks are p50, p90 and p99.
_QUANTILES_SQL = "INSERT OR REPLACE INTO traffic_quantiles VALUES (:instance_id, {})".format(
    ", ".join(
        _quantile(histogram, above, of)
        for histogram in ("ttfb_seconds", "duration_seconds")
        for above, of in ((2, 1), (10, 9), (100, 99))
    )
)


def open_all_hosts(log_dir: str | Path) -> list[Store]:
    """Every host's database under ``<log_dir>/sidecar-fsm/``, sorted by host; [] when there is none.

    Raises like ``Store.open_existing``, also for a log dir that cannot be listed; the stores
    opened before the failure are closed.
    """
    stores: list[Store] = []
    try:
        for path in dbfile.database_files(log_dir):
            stores.append(Store.open_existing(path))
    except BaseException:
        for store in stores:
            store.close()
        raise
    return stores


# -- rows ---------------------------------------------------------------------------------------


def _marks(values: Sequence[Any]) -> str:
    """``?, ?, ?``: one placeholder per value, so a state group is bound, never spelled in SQL."""
    return ", ".join("?" for _ in values)


def _first(
    db: sqlite_utils.Database | sqlite3.Connection, sql: str, params: list[Any]
) -> dict[str, Any] | None:
    cursor = db.execute(sql, params)
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([d[0] for d in cursor.description], row, strict=True))
