"""The state database on real SQLite files: opening, migrating, refusing, writing, querying."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sidecar_fsm.base import resources
from sidecar_fsm.errors import SchemaTooNewError, SidecarError
from sidecar_fsm.state import schema
from sidecar_fsm.state.fsm import NON_TERMINAL, InstanceMachine
from sidecar_fsm.state.store import (
    NewInstance,
    Store,
    database_path,
    load_migrations,
    open_all_hosts,
    schema_version,
)

LATEST = schema_version()


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def files_in(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def build_at_step(path: Path, step: int) -> None:
    """A database as the code of schema ``step`` left it (WAL, version recorded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = raw(path)
    conn.execute("PRAGMA journal_mode=WAL")
    for migration in load_migrations()[:step]:
        conn.executescript(migration.path.read_text())
    conn.execute(f"PRAGMA user_version = {step}")
    conn.close()


def test_database_path_is_per_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert database_path(tmp_path, "node7") == tmp_path / "sidecar-fsm" / "node7.db"
    monkeypatch.delenv("SIDECAR_FSM_HOST", raising=False)
    assert database_path(str(tmp_path)) == tmp_path / "sidecar-fsm" / f"{socket.gethostname()}.db"
    # Several nodes sharing one machine (a local Ray cluster) each name their own file.
    monkeypatch.setenv("SIDECAR_FSM_HOST", "node3")
    assert database_path(tmp_path) == tmp_path / "sidecar-fsm" / "node3.db"
    with Store.open(tmp_path) as opened:
        assert (opened.host, opened.path.name) == ("node3", "node3.db")


def test_open_creates_a_wal_database_at_the_latest_schema(tmp_path: Path) -> None:
    with Store.open(tmp_path / "logs", host="node1") as opened:
        assert opened.path == tmp_path / "logs" / "sidecar-fsm" / "node1.db"
        assert opened.host == "node1"
    conn = raw(tmp_path / "logs" / "sidecar-fsm" / "node1.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST == len(load_migrations()) >= 2
    # Reopening an up-to-date database changes nothing.
    Store.open(tmp_path / "logs", host="node1").close()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST


def test_newer_schema_is_refused_and_left_byte_for_byte(tmp_path: Path) -> None:
    path = database_path(tmp_path, "node1")
    Store.open(tmp_path, host="node1").close()
    conn = raw(path)
    conn.execute(f"PRAGMA user_version = {LATEST + 3}")
    conn.close()
    before = files_in(path.parent)

    message = (
        f"{path}: schema {LATEST + 3} is newer than this sidecar-fsm ({LATEST}); "
        "upgrade it or use another --log-dir"
    )
    with pytest.raises(SchemaTooNewError) as refused:
        Store.open(tmp_path, host="node1")
    assert str(refused.value) == message
    with pytest.raises(SchemaTooNewError):
        Store.open_existing(path)
    with pytest.raises(SchemaTooNewError):
        open_all_hosts(tmp_path)

    # Same bytes, and no -wal/-shm or lock file appeared beside it.
    assert files_in(path.parent) == before


def test_newer_schema_still_in_the_wal_is_refused(tmp_path: Path) -> None:
    path = database_path(tmp_path, "node1")
    Store.open(tmp_path, host="node1").close()
    # A newer sidecar-fsm is running: its version bump sits in the WAL, the file header lags.
    newer = raw(path)
    newer.execute("PRAGMA wal_autocheckpoint = 0")
    newer.execute(f"PRAGMA user_version = {LATEST + 1}")
    main_file = path.read_bytes()
    try:
        with pytest.raises(SchemaTooNewError, match=f"schema {LATEST + 1} is newer"):
            Store.open(tmp_path, host="node1")
        assert path.read_bytes() == main_file
    finally:
        newer.close()


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = database_path(tmp_path, "node1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all, but longer than one hundred bytes " * 3)
    before = files_in(path.parent)
    with pytest.raises(SidecarError, match="not a SQLite database"):
        Store.open(tmp_path, host="node1")
    assert files_in(path.parent) == before


def test_open_existing_needs_the_file(tmp_path: Path) -> None:
    with pytest.raises(SidecarError, match="no such state database"):
        Store.open_existing(tmp_path / "nope.db")
    assert not (tmp_path / "nope.db").exists()


def table_dump(conn: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    cursor = conn.execute(f"SELECT * FROM {table} ORDER BY rowid")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


@pytest.mark.parametrize("step", range(1, LATEST))
def test_migrating_an_older_database_to_the_latest_loses_nothing(tmp_path: Path, step: int) -> None:
    path = database_path(tmp_path, "node1")
    build_at_step(path, step)
    conn = raw(path)
    conn.execute(
        "INSERT INTO runs VALUES ('old-run', 'node1', 123, 99.5, 1000.0, NULL, NULL, '{\"instances\": 2}')"
    )
    conn.execute("INSERT INTO runs VALUES ('done-run', 'node1', 124, NULL, 900.0, 950.0, 'ended', '{}')")
    conn.execute(
        "INSERT INTO instances (id, run_id, name, listen, upstream, state, state_since, pid, pid_start_time,"
        " binary, log_path, ready_path, exit_code, error) VALUES"
        " (1, 'old-run', 'policy', '127.0.0.1:1250', 'https://api.example.com', 'ready', 1002.0,"
        " 555, 1001.5, '/bin/sidecar', '/logs/p.log', '/logs/p.ready', NULL, NULL),"
        " (2, 'old-run', 'judge', '127.0.0.1:1251', 'https://judge.example.com', 'failed', 1003.0,"
        " NULL, NULL, NULL, NULL, NULL, 1, 'bind: address already in use')"
    )
    conn.executemany(
        "INSERT INTO transitions (instance_id, source, dest, event, at, detail) VALUES (?, ?, ?, ?, ?, ?)",
        [
            (1, "configured", "building", "build", 1000.1, None),
            (1, "building", "spawned", "spawn", 1000.2, "pid 555"),
            (1, "spawned", "ready", "ready", 1002.0, None),
            (2, "configured", "failed", "fail", 1003.0, "bind: address already in use"),
        ],
    )
    before = {table: table_dump(conn, table) for table in ("runs", "instances", "transitions")}
    conn.close()

    with Store.open(tmp_path, host="node1") as migrated:
        assert [r.run_id for r in migrated.list_runs()] == ["old-run", "done-run"]
        assert migrated.get_run("old-run") is not None
        policy = migrated.get_instance(1)
        assert policy is not None and policy.state == "ready" and policy.restart_count == 0
        # Columns added after ``step`` read as "not recorded" for the old rows.
        assert policy.metrics is None
        assert [h.event for h in migrated.history(1)] == ["build", "spawn", "ready"]
        # An instance from the old database carries on under the new code.
        InstanceMachine(migrated, 1, state=policy.state).fire("restart", restart_count=1)

    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    after = {table: table_dump(conn, table) for table in ("runs", "instances", "transitions")}
    assert after["runs"] == before["runs"]
    assert after["transitions"][: len(before["transitions"])] == before["transitions"]
    for old, new in zip(before["instances"][1:], after["instances"][1:], strict=True):
        assert {key: new[key] for key in old} == old
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"transitions_by_instance", "runs_live", "instances_by_listen"} <= indexes


def copy_migrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, str]) -> None:
    directory = tmp_path / "migrations"
    shutil.copytree(resources.MIGRATIONS_DIR, directory)
    for name, text in extra.items():
        (directory / name).write_text(text)
    monkeypatch.setattr(resources, "MIGRATIONS_DIR", directory)
    # Not cache_clear(): the cache would keep this test's version after the directory is restored.
    monkeypatch.setattr(schema, "schema_version", lambda: len(load_migrations()))


def test_a_failing_step_rolls_back_and_keeps_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store.open(tmp_path, host="node1").close()
    copy_migrations(
        tmp_path,
        monkeypatch,
        {f"{LATEST + 1:04d}_broken.sql": "CREATE TABLE half_done (x);\nINSERT INTO nowhere VALUES (1);\n"},
    )

    with pytest.raises(SidecarError, match=f"step {LATEST + 1} failed .*stays at schema {LATEST}"):
        Store.open(tmp_path, host="node1")

    conn = raw(database_path(tmp_path, "node1"))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0] == 0


def test_migration_steps_must_be_numbered_without_gaps(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("")
    (tmp_path / "0003_c.sql").write_text("")
    with pytest.raises(SidecarError, match=r"steps \[1, 3\] are not 1..N"):
        load_migrations(tmp_path)
    (tmp_path / "0003_c.sql").rename(tmp_path / "3_c.sql")
    with pytest.raises(SidecarError, match="'3_c.sql' is not a migration name"):
        load_migrations(tmp_path)


def test_runs_are_listed_newest_first_by_liveness(store: Store) -> None:
    for run_id in ("a", "b", "c"):
        store.create_run(run_id, owner_pid=os.getpid(), owner_start_time=1.0, config_summary={"n": 1})
    store.end_run("b", "ended")

    assert [r.run_id for r in store.list_runs("all")] == ["c", "b", "a"]
    assert [r.run_id for r in store.list_runs("live")] == ["c", "a"]
    assert [r.run_id for r in store.list_runs("finished")] == ["b"]
    ended = store.get_run("b")
    assert ended is not None and ended.outcome == "ended" and ended.ended_at is not None
    assert ended.config_summary == {"n": 1} and ended.host == store.host and ended.owner_pid == os.getpid()
    assert store.get_run("zzz") is None
    with pytest.raises(ValueError, match="'dead' is not one of"):
        store.list_runs("dead")  # type: ignore[arg-type]


def test_end_run_keeps_the_first_outcome(store: Store) -> None:
    store.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
    store.end_run("r", "ended")
    first = store.get_run("r")
    store.end_run("r", "reaped")  # a reaper that lost the race against the owner's own shutdown
    assert store.get_run("r") == first
    with pytest.raises(SidecarError, match="run 'nope' does not exist"):
        store.end_run("nope", "ended")
    with pytest.raises(ValueError, match="'gone' is not an outcome"):
        store.end_run("r", "gone")


def test_instance_queries(store: Store) -> None:
    store.create_run("r1", owner_pid=1, owner_start_time=None, config_summary={})
    store.create_run("r2", owner_pid=2, owner_start_time=None, config_summary={})
    a = store.create_instance("r1", "a", "127.0.0.1:1250", "https://x.example.com", "/b", "/l", "/r")
    b = store.create_instance("r1", "b", "127.0.0.1:1251", "https://y.example.com", None, None, None)
    c = store.create_instance("r2", "a", "127.0.0.1:1250", "https://x.example.com", None, None, None)
    InstanceMachine(store, a.id).fire("fail", error="boom")
    InstanceMachine(store, c.id).fire("build")

    assert [i.name for i in store.instances_of("r1")] == ["a", "b"]
    assert store.instances_of("none") == []
    assert [i.id for i in store.instances_in_states(["configured", "building"])] == [b.id, c.id]
    assert store.instances_in_states([]) == []
    live = store.instances_in_states(NON_TERMINAL)
    assert [i.id for i in live if i.listen == "127.0.0.1:1250"] == [c.id]  # a's failed: not live
    assert store.get_instance(10_000) is None
    with pytest.raises(sqlite3.IntegrityError):
        store.create_instance("r1", "a", "127.0.0.1:1252", "https://x.example.com", None, None, None)


def test_create_instances_records_all_in_order_or_none(store: Store) -> None:
    store.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
    created = store.create_instances(
        "r",
        [
            NewInstance("b", "127.0.0.1:2", "https://u:secret@y.example.com?key=1", "/bin", "/l2", "/r2"),
            NewInstance("a", "127.0.0.1:1", "https://x.example.com", None, None, None),
        ],
    )
    assert [(i.name, i.listen, i.state) for i in created] == [
        ("b", "127.0.0.1:2", "configured"),
        ("a", "127.0.0.1:1", "configured"),
    ]
    assert created == store.instances_of("r")
    assert "secret" not in created[0].upstream and "key" not in created[0].upstream
    assert (created[0].binary, created[0].log_path, created[0].ready_path) == ("/bin", "/l2", "/r2")

    # A name already in the run (or twice in the batch): nothing of the batch is recorded.
    for names in (["c", "a"], ["d", "d"]):
        batch = [NewInstance(n, "127.0.0.1:3", "https://z.example.com", None, None, None) for n in names]
        with pytest.raises(sqlite3.IntegrityError):
            store.create_instances("r", batch)
    assert [i.name for i in store.instances_of("r")] == ["b", "a"]


def test_record_transition_checks_the_source_and_the_facts(store: Store) -> None:
    store.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
    instance = store.create_instance("r", "a", "127.0.0.1:1", "https://x.example.com", None, None, None)

    with pytest.raises(SidecarError, match="state is 'configured', not 'ready'"):
        store.record_transition(instance.id, "ready", "draining", "drain", None, {})
    with pytest.raises(SidecarError, match="instance 999: does not exist"):
        store.record_transition(999, "configured", "building", "build", None, {})
    with pytest.raises(ValueError, match=r"unknown facts \['upstream'\]"):
        store.record_transition(instance.id, "configured", "building", "build", None, {"upstream": "x"})

    assert store.get_instance(instance.id) == instance
    assert store.history(instance.id) == []


def test_ready_records_the_listen_and_metrics_addresses(store: Store) -> None:
    store.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
    with_metrics = store.create_instance("r", "a", "127.0.0.1:0", "https://x.example.com", None, None, None)
    without = store.create_instance("r", "b", "127.0.0.1:0", "https://x.example.com", None, None, None)
    for record, facts in ((with_metrics, {"metrics": "127.0.0.1:40001"}), (without, {})):
        machine = InstanceMachine(store, record.id)
        machine.fire("build")
        machine.fire("spawn", pid=41, pid_start_time=1.5)
        machine.fire("ready", listen="127.0.0.1:40000", **facts)

    ready = store.get_instance(with_metrics.id)
    assert ready is not None
    assert (ready.state, ready.listen, ready.metrics) == ("ready", "127.0.0.1:40000", "127.0.0.1:40001")
    assert store.instances_of("r")[1].metrics is None
    # A restarted proxy binds a new metrics port: the next ready event overwrites the address.
    machine = InstanceMachine(store, with_metrics.id, state="ready")
    machine.fire("restart", restart_count=1)
    machine.fire("ready", listen="127.0.0.1:40000", metrics="127.0.0.1:40002")
    assert store.get_instance(with_metrics.id).metrics == "127.0.0.1:40002"  # type: ignore[union-attr]


def test_transaction_commits_the_group_at_once_or_not_at_all(store: Store) -> None:
    reader = raw(store.path)
    with store.transaction():
        store.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
        first = store.create_instance("r", "a", "127.0.0.1:1", "https://x.example.com", None, None, None)
        # A write that fails inside the group is undone alone, and the caller may go on.
        with pytest.raises(sqlite3.IntegrityError):
            store.create_instance("r", "a", "127.0.0.1:2", "https://x.example.com", None, None, None)
        store.record_transition(first.id, "configured", "building", "build", None, {})
        # Another connection sees none of it before the commit.
        assert reader.execute("SELECT count(*) FROM runs WHERE run_id = 'r'").fetchone() == (0,)
    assert reader.execute("SELECT count(*) FROM instances WHERE run_id = 'r'").fetchone() == (1,)
    assert [t.dest for t in store.history(first.id)] == ["building"]

    with pytest.raises(RuntimeError, match="interrupted"), store.transaction():
        store.create_run("s", owner_pid=1, owner_start_time=None, config_summary={})
        store.create_instance("s", "a", "127.0.0.1:3", "https://x.example.com", None, None, None)
        store.record_transition(first.id, "building", "spawned", "spawn", None, {"pid": 5})
        raise RuntimeError("interrupted")
    assert store.get_run("s") is None
    assert reader.execute("SELECT count(*) FROM instances WHERE run_id = 's'").fetchone() == (0,)
    assert store.get_instance(first.id).state == "building"  # type: ignore[union-attr]
    # The store is usable afterwards: single writes commit on their own again.
    store.record_transition(first.id, "building", "spawned", "spawn", None, {"pid": 5})
    assert reader.execute("SELECT state FROM instances WHERE id = ?", [first.id]).fetchone() == ("spawned",)


def test_no_url_is_stored_with_userinfo_or_query(store: Store) -> None:
    store.create_run(
        "r",
        owner_pid=1,
        owner_start_time=None,
        config_summary={"instances": [{"upstream": "https://bob:SECRET1@api.example.com/v1?key=SECRET2"}]},
    )
    instance = store.create_instance(
        "r",
        "a",
        "127.0.0.1:1",
        "https://bob:SECRET3@api.example.com:8443/v1?api-key=SECRET4#frag",
        None,
        None,
        None,
    )
    machine = InstanceMachine(store, instance.id)
    machine.fire("build", detail="fetching https://u:SECRET5@proxy.example.com/x?token=SECRET6")
    machine.fire("fail", error='Post "https://api.example.com/v1/chat?sig=SECRET7": EOF')

    row = store.get_instance(instance.id)
    assert row is not None
    assert row.upstream == "https://api.example.com:8443/v1"
    assert row.error == 'Post "https://api.example.com/v1/chat": EOF'
    assert store.history(instance.id)[0].detail == "fetching https://proxy.example.com/x"
    run = store.get_run("r")
    assert run is not None
    assert run.config_summary == {"instances": [{"upstream": "https://api.example.com/v1"}]}
    store.close()
    # Nothing secret anywhere in the file, WAL included (checkpointed at close).
    dump = "\n".join(raw(store.path).iterdump())
    assert "SECRET" not in dump and "bob" not in dump


def test_queries_use_their_indexes(store: Store) -> None:
    conn = raw(store.path)

    def plan(sql: str) -> str:
        return " | ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))

    assert "USING INDEX runs_live" in plan(
        "SELECT * FROM runs WHERE ended_at IS NULL ORDER BY started_at DESC, rowid DESC"
    )
    history = plan("SELECT * FROM transitions WHERE instance_id = 1 ORDER BY id")
    assert "USING INDEX transitions_by_instance" in history and "TEMP B-TREE" not in history
    assert "USING INDEX instances_by_listen" in plan(
        "SELECT * FROM instances WHERE listen = 'x' AND state NOT IN ('stopped', 'failed') "
        "ORDER BY id DESC LIMIT 1"
    )


def test_open_all_hosts_reads_every_host(tmp_path: Path) -> None:
    for host in ("node2", "node1"):
        with Store.open(tmp_path, host=host) as opened:
            opened.create_run(f"run-{host}", owner_pid=1, owner_start_time=None, config_summary={})
    stores = open_all_hosts(tmp_path)
    try:
        assert [s.host for s in stores] == ["node1", "node2"]
        assert [s.list_runs()[0].run_id for s in stores] == ["run-node1", "run-node2"]
    finally:
        for opened in stores:
            opened.close()
    assert open_all_hosts(tmp_path / "empty") == []


def test_the_wal_is_checkpointed_while_writing(store: Store) -> None:
    # SQLite's auto-checkpoint (after a commit, outside the write lock) keeps the WAL bounded.
    store.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
    machines = [
        InstanceMachine(
            store, store.create_instance("r", f"i{k}", "127.0.0.1:0", "https://x", None, None, None).id
        )
        for k in range(300)
    ]
    for event in ("build", "spawn", "ready", "drain", "stop"):
        for machine in machines:
            machine.fire(event)
    # 1,800 commits of 4-5 pages each would be ~30 MB of WAL without checkpoints.
    wal = Path(f"{store.path}-wal")
    assert wal.stat().st_size < 8 * 1024 * 1024
    store.close()
    assert not wal.exists()  # the last connection to close folds the WAL into the file


def test_opening_the_database_again_keeps_this_process_locks_on_it(tmp_path: Path) -> None:
    # Closing any descriptor of a file drops every POSIX lock this process holds on it, SQLite's
    # too. Its shared lock on the database keeps another process's last close from folding and
    # deleting the WAL this connection still writes to (lost commits). A second open in the same
    # process (the CLI, another run) must not read the file behind SQLite's back.
    with Store.open(tmp_path, host="node1") as first:
        first.list_runs()
        inode = os.stat(first.path).st_ino

        def our_locks() -> list[str]:
            # A line without its leading ordinal ("12: POSIX ..."): the kernel renumbers the table
            # as other processes take and drop locks, which says nothing about ours.
            with open("/proc/locks", encoding="ascii") as table:
                return sorted(
                    line.split(":", 1)[1].strip()
                    for line in table
                    if f":{inode} " in line and f" {os.getpid()} " in line
                )

        held = our_locks()
        assert held, "SQLite holds no lock on the database: nothing to check"
        Store.open(tmp_path, host="node1").close()
        for reader in open_all_hosts(tmp_path):
            reader.close()
        assert our_locks() == held
