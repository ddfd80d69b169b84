"""Storage faults while a run is live: the launcher stops what it can no longer record, in one line.

Each fault is real: the log dir is a small tmpfs filled up after the start, the write lock is held
by another process that then SIGSTOPs itself, the database file is deleted or replaced under the
run. The sidecars are the real proxy against the lab's TLS HTTP/2 origin. Each case checks the
line the user gets, that no sidecar of the run is left running, and what the database says once
the fault is gone (``PRAGMA integrity_check``; every instance's state is its last history row's
target). Mounting a tmpfs needs root and a kernel that lets this container mount: where it
cannot, the full-filesystem test skips saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from helpers import SIDECAR_FSM, ProcessRegistry, fill_filesystem, wait_until

from sidecar_fsm.base import procs
from sidecar_fsm.config import H2PingSidecarConfig
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.run.supervise import NodeSidecars
from sidecar_fsm.state import dbfile
from sidecar_fsm.state.store import DB_DIR_NAME, Store, database_path

HOST = "node7"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_FSM_HOST", HOST)


def make_sidecars(
    origin: TlsH2Origin, binary: Path, log_dir: Path, store: Store | None = None, max_restarts: int = 0
) -> NodeSidecars:
    config = H2PingSidecarConfig.model_validate(
        {
            "enabled": True,
            "instances": [
                {"name": name, "upstream": origin.url, "listen": "127.0.0.1:0"}
                for name in ("policy", "judge")
            ],
            "ca_file": str(origin.ca_file),
            "shutdown_grace": "2s",
            "startup_timeout_seconds": 20,
            "restart": {"max_restarts": max_restarts, "backoff": "0s"},
        }
    )
    sidecars = NodeSidecars(config, config.instances, str(binary), str(log_dir), store=store)
    sidecars.stop_slack_seconds = 2.0
    return sidecars


def pids_of(sidecars: NodeSidecars) -> list[procs.ProcessIdentity]:
    found = []
    for child in sidecars.children:
        assert child.identity is not None
        found.append(child.identity)
    return found


def assert_ended(identities: list[procs.ProcessIdentity]) -> None:
    for identity in identities:
        assert not procs.is_ours(identity), f"pid {identity.pid} still runs"


def our_proxies(binary: Path, log_dir: Path) -> list[int]:
    """Pids of processes of ``binary`` whose ready file is in ``log_dir`` (the run's sidecars)."""
    found = []
    for process in psutil.process_iter(["exe", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["exe"] == os.path.realpath(binary) and any(
            arg.startswith(f"{log_dir}{os.sep}") for arg in cmdline
        ):
            found.append(process.pid)
    return found


def assert_consistent(db: Path) -> None:
    """``integrity_check`` ok; every instance's state is the target of its last history row."""
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute(
            "SELECT i.id, i.state, (SELECT dest FROM transitions t WHERE t.instance_id = i.id "
            "ORDER BY t.id DESC LIMIT 1) FROM instances i"
        ).fetchall()
    finally:
        conn.close()
    assert rows
    for instance_id, state, last in rows:
        assert state == (last or "configured"), (instance_id, state, last)


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    assert "Traceback" not in text
    return text


# -- the filesystem fills up ------------------------------------------------------------------


@pytest.mark.parametrize("trigger", ["check", "check-with-restart", "stop"])
def test_a_full_filesystem_stops_the_sidecars_it_cannot_record(
    make_tmpfs: Callable[[Path, str], Path],
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    trigger: str,
) -> None:
    # The whole log dir on one small filesystem, as on a real full disk: logs, ready files, database.
    log_dir = make_tmpfs("4m", tmp_path / "logs")
    restarts = 1 if trigger == "check-with-restart" else 0
    sidecars = make_sidecars(tls_origin, sidecar_binary, log_dir, max_restarts=restarts)
    sidecars.start()
    try:
        db = database_path(log_dir, HOST)
        started = pids_of(sidecars)
        filler = fill_filesystem(log_dir)
        if trigger.startswith("check"):
            # One sidecar dies: check() must record `fail` (or, with a restart allowed, the
            # `restart` of a process it has already started) and cannot.
            assert procs.signal_if_ours(started[0], signal.SIGKILL)
            # Until the launcher can collect it: a Go process's main thread shows as a zombie
            # while its other threads are still torn down, and check() would rightly see nothing
            # dead yet.
            killed = sidecars.children[0].process
            assert killed is not None and procs.wait_exit(killed, 10) is not None
            with pytest.raises(SidecarError) as stopped:
                sidecars.check()
        else:
            with pytest.raises(SidecarError) as stopped:
                sidecars.stop()
        text = one_line(stopped.value)
        assert str(db) in text and "no space left" in text, text
        # Not one sidecar runs that the record cannot follow; no ready file is left.
        assert_ended(started)
        assert our_proxies(sidecar_binary, log_dir) == []
        assert sorted(log_dir.glob("*.ready*")) == []
        assert not sidecars.running
        filler.unlink()
        assert_consistent(db)
    finally:
        sidecars.stop()


# -- the write lock is held by a stopped process ----------------------------------------------

_HOLD_AND_STOP = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_write_lock_held_by_a_stopped_process_fails_the_start_naming_it(
    log_dir: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    # The start's first write waits for the lock no longer than startup_timeout_seconds, the
    # start's own deadline (30 s by default; 1.5 s here), not SQLite's 60 s busy timeout.
    Store.open(log_dir).close()
    db = database_path(log_dir, HOST)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, str(db)])
    process_registry.add(holder)
    try:
        wait_until(
            lambda: psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED, 20, "the holder to stop"
        )
        sidecars = make_sidecars(tls_origin, sidecar_binary, log_dir, store=Store.open(log_dir))
        sidecars.config = sidecars.config.model_copy(update={"startup_timeout_seconds": 1.5})
        began = time.monotonic()
        with pytest.raises(SidecarError) as failed:
            sidecars.start()
        waited = time.monotonic() - began
        text = one_line(failed.value)
        assert text.startswith(f"{db}: ") and "database is locked" in text, text
        assert f"pid {holder.pid} (" in text and "stopped)" in text and "held it for 1.5s" in text, text
        assert 1.5 <= waited < 20, waited
        assert our_proxies(sidecar_binary, log_dir) == []
        assert sorted(log_dir.glob("*.ready*")) == []
        assert sorted(log_dir.glob("h2ping-*.log")) == []  # no run row names them: none is left
        assert not sidecars.running
    finally:
        # A stopped process takes SIGKILL without being continued; its transaction rolls back.
        holder.kill()
        holder.wait(10)
    assert sidecars.store is not None
    sidecars.store.close()
    assert_consistent_or_empty(db)


def assert_consistent_or_empty(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # The start failed at its first write: no run, no instance was recorded.
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 0
    finally:
        conn.close()


# -- the database file is deleted or replaced under the run -----------------------------------


def replace_with_another_database(db: Path, scratch: Path) -> bytes:
    other = Store.open(scratch, host=HOST)
    other.create_run("someone-else", owner_pid=1, owner_start_time=None, config_summary={})
    other.close()  # the last connection checkpoints: the file alone holds everything
    source = database_path(scratch, HOST)
    os.replace(source, db)
    return db.read_bytes()


@pytest.mark.parametrize("trigger", ["check", "stop"])
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_deleted_or_replaced_under_a_live_run_is_noticed_at_its_next_check_or_stop(
    log_dir: Path, tmp_path: Path, tls_origin: TlsH2Origin, sidecar_binary: Path, how: str, trigger: str
) -> None:
    sidecars = make_sidecars(tls_origin, sidecar_binary, log_dir)
    sidecars.start()
    try:
        db = database_path(log_dir, HOST)
        started = pids_of(sidecars)
        sidecars.check()  # nothing wrong yet
        replacement = None
        if how == "deleted":
            # What cleaning the log dir of a live job does to the state.
            shutil.rmtree(db.parent)
        else:
            replacement = replace_with_another_database(db, tmp_path / "elsewhere")
        with pytest.raises(SidecarError) as stopped:
            # check() is the launcher's poll; a stop() with no check() since must notice too.
            sidecars.check() if trigger == "check" else sidecars.stop()
        text = one_line(stopped.value)
        expected = "deleted" if how == "deleted" else "replaced by another file"
        assert text.startswith(f"{db}: {expected} while run {sidecars.run_id} was live"), text
        assert_ended(started)
        assert our_proxies(sidecar_binary, log_dir) == []
        assert sidecars.failures() == [] and not sidecars.running
        if replacement is not None:
            # The file now at the path is someone else's: not one byte of it was written.
            assert db.read_bytes() == replacement
    finally:
        sidecars.stop()
    # The next run of this process starts on a fresh database (or the file that is there now).
    again = make_sidecars(tls_origin, sidecar_binary, log_dir)
    again.start()
    again.stop()
    assert_consistent(database_path(log_dir, HOST))


def test_the_cli_exits_1_in_one_line_when_the_log_dir_is_cleaned_under_it(
    tmp_path: Path,
    log_dir: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    """What a user sees: ``sidecar-fsm start`` supervising, someone runs ``rm -rf`` on the state."""
    config = tmp_path / "gym.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "sidecar": {
                    "enabled": True,
                    "binary": str(sidecar_binary),
                    "ca_file": str(tls_origin.ca_file),
                    "instances": [{"name": "policy", "upstream": tls_origin.url, "listen": "127.0.0.1:0"}],
                    "shutdown_grace": "2s",
                }
            }
        )
    )
    output = tmp_path / "start.out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(output, "wb") as out:
        started = subprocess.Popen(
            [str(SIDECAR_FSM), "start", str(config), "--log-dir", str(log_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    process_registry.add(started)
    wait_until(lambda: "supervising" in output.read_text() or started.poll() is not None, 30, "start")
    assert started.poll() is None, output.read_text()
    with Store.open_existing(database_path(log_dir, HOST)) as store:
        (run,) = store.list_runs("live")
        (instance,) = store.instances_of(run.run_id)
    assert instance.pid is not None and instance.pid_start_time is not None
    process_registry.add_pid(instance.pid)
    sidecar = procs.ProcessIdentity(instance.pid, instance.pid_start_time, None)

    shutil.rmtree(log_dir / DB_DIR_NAME)

    assert started.wait(timeout=30) == 1, output.read_text()
    db = database_path(log_dir, HOST)
    lines = [line for line in output.read_text().splitlines() if str(db) in line]
    assert lines == [
        f"{db}: deleted while run {run.run_id} was live; its sidecars were stopped, since a run that "
        "is not on record cannot be inspected or reaped; keep a live run's log dir"
    ], output.read_text()
    assert "Traceback" not in output.read_text()
    assert not procs.is_ours(sidecar)


def test_a_write_lock_held_by_a_stopped_process_during_a_run_stops_its_sidecars(
    log_dir: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    busy = 2.0  # as above: the default is 60 s
    monkeypatch.setattr(dbfile, "BUSY_TIMEOUT_SECONDS", busy)
    sidecars = make_sidecars(tls_origin, sidecar_binary, log_dir, store=Store.open(log_dir))
    sidecars.start()
    db = database_path(log_dir, HOST)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, str(db)])
    process_registry.add(holder)
    try:
        started = pids_of(sidecars)
        wait_until(
            lambda: psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED, 20, "the holder to stop"
        )
        assert procs.signal_if_ours(started[0], signal.SIGKILL)
        killed = sidecars.children[0].process
        assert killed is not None and procs.wait_exit(killed, 10) is not None
        began = time.monotonic()
        with pytest.raises(SidecarError) as stopped:
            sidecars.check()
        took = time.monotonic() - began
        text = one_line(stopped.value)
        assert text.startswith(f"run {sidecars.run_id}: its sidecars were stopped"), text
        assert f"{db}: " in text and f"pid {holder.pid} (" in text, text
        assert_ended(started)
        assert our_proxies(sidecar_binary, log_dir) == []
        # One write waited out the lock; the stop that followed tried no other (four more would
        # have each waited as long while the other sidecar ran).
        assert busy <= took < 2 * busy + 1.0, took
    finally:
        holder.kill()
        holder.wait(10)
        sidecars.stop()
        assert sidecars.store is not None
        sidecars.store.close()
    assert_consistent(db)
