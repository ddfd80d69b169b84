"""Many real processes writing one state database at once, and one killed mid-write.

The writers are this file run as a script (``python test_store_concurrency.py drive|burst ...``),
so each is a fresh interpreter with its own SQLite connection, as concurrent launchers are.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # when run as a script by the tests below
    sys.path.insert(0, str(REPO))

from sidecar_fsm.errors import SidecarError  # noqa: E402
from sidecar_fsm.state import dbfile  # noqa: E402
from sidecar_fsm.state.fsm import InstanceMachine  # noqa: E402
from sidecar_fsm.state.store import Store, database_path, load_migrations, schema_version  # noqa: E402

HOST = "node-under-test"
WRITERS = 8
INSTANCES_PER_WRITER = 300

# Lifecycles the writers cycle through, so every kind of transition is in the mix.
LIFECYCLES: tuple[tuple[tuple[str, dict[str, int]], ...], ...] = (
    (("build", {}), ("spawn", {"pid": 1}), ("ready", {}), ("drain", {}), ("stop", {"exit_code": 0})),
    (("build", {}), ("spawn", {"pid": 2}), ("ready", {}), ("restart", {"restart_count": 1}), ("fail", {})),
    (
        ("build", {}),
        ("fail", {"exit_code": 1}),
    ),
    (("stop", {}),),
)


def drive(log_dir: str, tag: str, count: int) -> None:
    """Writer: create a run of ``count`` instances, then drive them all, step by step, interleaved.

    Prints "opened" once the database is open and waits for a line on stdin, so every writer
    starts its burst at the same moment; prints "done" at the end.
    """
    store = Store.open(log_dir, host=HOST)
    print("opened", flush=True)
    sys.stdin.readline()
    store.create_run(tag, owner_pid=os.getpid(), owner_start_time=None, config_summary={"tag": tag})
    machines = []
    for k in range(count):
        record = store.create_instance(
            tag, f"i{k}", f"127.0.0.1:{k}", "https://x.example.com", None, None, None
        )
        machines.append((InstanceMachine(store, record.id), LIFECYCLES[k % len(LIFECYCLES)]))
    for step in range(max(len(lifecycle) for lifecycle in LIFECYCLES)):
        for machine, lifecycle in machines:
            if step < len(lifecycle):
                event, facts = lifecycle[step]
                machine.fire(event, **facts)
    store.end_run(tag, "ended")
    store.close()
    print("done", flush=True)


def burst(log_dir: str) -> None:
    """Writer that never stops: new instances driven through full lifecycles until it is killed."""
    store = Store.open(log_dir, host=HOST)
    store.create_run("burst", owner_pid=os.getpid(), owner_start_time=None, config_summary={})
    print("opened", flush=True)
    for k in range(10**9):
        record = store.create_instance(
            "burst", f"i{k}", "127.0.0.1:0", "https://x.example.com", None, None, None
        )
        machine = InstanceMachine(store, record.id)
        for event, facts in LIFECYCLES[k % len(LIFECYCLES)]:
            machine.fire(event, **facts)


def migrate(log_dir: str) -> None:
    """Opener of an old database: waits for a line on stdin, opens it (migrating), prints whether
    the old instance is still there."""
    sys.stdin.readline()
    with Store.open(log_dir, host=HOST) as store:
        print(store.get_instance(1) is not None, flush=True)


def start_writer(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture
def writers() -> Iterator[list[subprocess.Popen[str]]]:
    # Imported here: this file also runs as the writer script, where tests/ is not on the path.
    from helpers import kill_and_reap

    started: list[subprocess.Popen[str]] = []
    yield started
    kill_and_reap(started)


def release_together(writers: list[subprocess.Popen[str]]) -> None:
    """Send each writer the "go" it waits for on stdin, once all of them are started: what they
    race on (opening, migrating, writing) then begins in all of them at the same moment."""
    for process in writers:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()


def outcomes(writers: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """Each writer's exit code, stdout and stderr, once it is done (two minutes each at most)."""
    done = [process.communicate(timeout=120) for process in writers]
    return [(process.returncode, out, err) for process, (out, err) in zip(writers, done, strict=True)]


def assert_state_matches_history(path: Path) -> int:
    """Every instance's state equals its last history row, and its history is one unbroken chain."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        chains: dict[int, list[tuple[str, str]]] = {}
        for instance_id, source, dest in conn.execute(
            "SELECT instance_id, source, dest FROM transitions ORDER BY instance_id, id"
        ):
            chains.setdefault(instance_id, []).append((source, dest))
        instances = conn.execute("SELECT id, state FROM instances").fetchall()
    finally:
        conn.close()
    for instance_id, state in instances:
        chain = chains.get(instance_id, [])
        if not chain:  # created, killed before its first transition
            assert state == "configured", f"instance {instance_id}"
            continue
        assert [source for source, _ in chain] == ["configured"] + [dest for _, dest in chain[:-1]]
        assert state == chain[-1][1], f"instance {instance_id}"
    return len(instances)


def test_eight_writers_one_database(tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    # All writers open the fresh database at once: creation and migration race too.
    for n in range(WRITERS):
        writers.append(start_writer("drive", str(tmp_path), f"run{n}", str(INSTANCES_PER_WRITER)))
    for process in writers:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == "opened\n", process.communicate(timeout=30)[1]
    release_together(writers)

    for code, out, err in outcomes(writers):
        assert code == 0, err
        assert out == "done\n"
        assert "locked" not in err

    path = database_path(tmp_path, HOST)
    assert assert_state_matches_history(path) == WRITERS * INSTANCES_PER_WRITER
    with Store.open_existing(path) as store:
        runs = store.list_runs("finished")
        assert len(runs) == WRITERS
        for run in runs:
            states = [i.state for i in store.instances_of(run.run_id)]
            assert states.count("stopped") == INSTANCES_PER_WRITER // 2
            assert states.count("failed") == INSTANCES_PER_WRITER // 2


def count_transitions(path: Path) -> int:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM transitions").fetchone()[0])
    finally:
        conn.close()


def test_writer_killed_mid_burst_leaves_a_consistent_database(
    tmp_path: Path, writers: list[subprocess.Popen[str]]
) -> None:
    process = start_writer("burst", str(tmp_path))
    writers.append(process)
    assert process.stdout is not None
    assert process.stdout.readline() == "opened\n", process.communicate(timeout=30)[1]
    path = database_path(tmp_path, HOST)
    # Imported here: this file also runs as the writer script, where tests/ is not on the path.
    from helpers import wait_until

    def written() -> bool:
        assert process.poll() is None, process.communicate()[1]
        return count_transitions(path) >= 1500

    wait_until(written, 60, "the writer to record 1500 transitions")
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL

    # The killed writer left its WAL behind; opening recovers it.
    with Store.open(tmp_path, host=HOST) as store:
        assert store.list_runs("live")[0].run_id == "burst"
    assert assert_state_matches_history(path) > 300


def test_eight_processes_open_an_old_database_at_once_and_migrate_it_once(
    tmp_path: Path, writers: list[subprocess.Popen[str]]
) -> None:
    path = database_path(tmp_path, HOST)
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(load_migrations()[0].path.read_text())
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs (run_id, host, owner_pid, started_at) VALUES ('old', 'h', 1, 1.0)")
    conn.execute(
        "INSERT INTO instances (id, run_id, name, listen, upstream, state, state_since) "
        "VALUES (1, 'old', 'a', '127.0.0.1:1', 'https://x.example.com', 'ready', 1.0)"
    )
    conn.close()
    for _ in range(WRITERS):
        writers.append(start_writer("migrate", str(tmp_path)))
    release_together(writers)
    for code, out, err in outcomes(writers):
        assert (code, out) == (0, "True\n"), err

    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema_version()
        assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 1
        columns = [row[1] for row in conn.execute("PRAGMA table_info(instances)")]
        assert columns.count("restart_count") == 1 and columns[-1] == "metrics"
    finally:
        conn.close()


def hold_write_lock(db_path: str) -> None:
    """Another process inside a write transaction: holds SQLite's write lock until a line on stdin."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE runs SET outcome = outcome")
    print("holding", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    conn.close()


def test_a_write_waits_for_another_process_lock_and_gives_up_clearly_past_the_deadline(
    tmp_path: Path, writers: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(tmp_path, host=HOST) as store:
        store.create_run("before", owner_pid=1, owner_start_time=None, config_summary={})
        holder = start_writer("hold", str(store.path))
        writers.append(holder)
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "holding\n", holder.communicate(timeout=30)[1]

        # Readers are never blocked by a writer (WAL).
        assert [run.run_id for run in store.list_runs()] == ["before"]

        # Past SQLite's busy timeout: one clear line, nothing written, the store still usable.
        monkeypatch.setattr(dbfile, "BUSY_TIMEOUT_SECONDS", 0.2)
        with Store.open(tmp_path, host=HOST) as impatient:
            with pytest.raises(SidecarError) as refused:
                impatient.create_run("late", owner_pid=1, owner_start_time=None, config_summary={})
            # The holder is named (pid, name, state) from the kernel's lock table.
            process = psutil.Process(holder.pid)
            assert str(refused.value) == (
                f"{store.path}: could not start a write: database is locked; pid {holder.pid} "
                f"({process.name()}, {process.status()}) held it for 0.2s; check for a stuck sidecar-fsm"
            )
            assert impatient.get_run("late") is None

        # Within it: the write waits in SQLite's busy handler and lands once the other process
        # commits.
        done = threading.Event()
        failures: list[BaseException] = []

        def write() -> None:
            try:
                store.create_run("waited", owner_pid=1, owner_start_time=None, config_summary={})
            except BaseException as exc:
                failures.append(exc)
            done.set()

        thread = threading.Thread(target=write)
        thread.start()
        assert not done.wait(0.3), "the write did not wait for the other process's lock"
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert done.wait(30), "the write never started after the lock was released"
        thread.join()
        assert failures == []
        assert holder.wait(timeout=30) == 0
        assert store.get_run("waited") is not None


if __name__ == "__main__":
    if sys.argv[1] == "drive":
        drive(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "burst":
        burst(sys.argv[2])
    elif sys.argv[1] == "migrate":
        migrate(sys.argv[2])
    elif sys.argv[1] == "hold":
        hold_write_lock(sys.argv[2])
    else:
        raise SystemExit(
            f"usage: {sys.argv[0]} drive LOG_DIR TAG COUNT | burst LOG_DIR | migrate LOG_DIR | hold DB"
        )
