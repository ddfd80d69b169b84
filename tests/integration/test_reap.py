"""reap on real processes and a real database: only provably-ours processes are ever signalled.

Records are written through the real store and state machine, pointing at real processes this
test spawns (``sleep``), so identity checks run against the kernel's idea of pid, start time and
executable; no mocks. The full kill -9 of a real ``sidecar-fsm start`` is in ``test_start_command.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import ProcessRegistry, missing_log_dir_line, sidecar_cli

from sidecar_fsm.base import procs
from sidecar_fsm.observe.verdicts import owner_of
from sidecar_fsm.run.reap import reap
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, database_path

SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"


def sleeper(registry: ProcessRegistry) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    registry.add(proc)
    return proc


def running_identity(pid: int) -> procs.ProcessIdentity:
    """The identity of a process that must be running (one this test started and has not ended):
    ``None`` here is a failure of the test's set-up, not a value to record."""
    identity = procs.identity_of(pid)
    assert identity is not None, f"pid {pid} is not running"
    return identity


def dead_pid() -> tuple[int, float]:
    """A pid that no longer runs, with the start time it had (its owner is "gone")."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = procs.identity_of(proc.pid)
    proc.wait()
    return proc.pid, identity.start_time if identity else 1.0


def db_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr) for table in tables
        }
    finally:
        conn.close()


def make_run(
    store: Store,
    log_dir: Path,
    owner: tuple[int, float | None],
    instances: list[tuple[str, procs.ProcessIdentity | None, str | None]],
    state: str = "ready",
    summary: dict[str, Any] | None = None,
) -> str:
    """A run owned by ``owner`` whose instances point at the given processes, in ``state``.

    Each instance is ``(name, identity recorded as pid/start time, executable recorded as binary)``
    and gets a ready file, as a real sidecar would have written.
    """
    run_id = uuid.uuid4().hex
    store.create_run(run_id, owner[0], owner[1], summary or {"shutdown_grace": "5s"})
    for index, (name, identity, binary) in enumerate(instances):
        ready = log_dir / f"h2ping-{name}-{run_id}.ready"
        record = store.create_instance(
            run_id,
            name,
            f"127.0.0.1:{20000 + index}",
            "https://api.example.com",
            binary,
            str(ready),
            str(ready),
        )
        machine = InstanceMachine(store, record.id)
        machine.fire("build")
        if state == "building":
            continue
        assert identity is not None
        machine.fire("spawn", pid=identity.pid, pid_start_time=identity.start_time)
        ready.write_text(json.dumps({"pid": identity.pid, "listen": f"127.0.0.1:{20000 + index}"}))
        if state == "ready":
            machine.fire("ready")
    return run_id


def test_process_that_is_ours_is_terminated_and_marked_failed(
    store: Store, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    proc = sleeper(process_registry)
    identity = running_identity(proc.pid)
    run_id = make_run(store, log_dir, dead_pid(), [("policy", identity, identity.exe)])

    report = reap(store)

    assert procs.wait_exit(proc, 5) is not None, "our process was not ended"
    (run,) = report.runs
    assert run.run_id == run_id and run.owner == "dead"
    assert run.instances[0].result == "drained and exited after SIGTERM"
    (inst,) = store.instances_of(run_id)
    assert inst.state == "failed"
    assert inst.error is not None and inst.error.startswith(f"reaped: owner pid {run.owner_pid} is gone")
    assert [(t.source, t.dest) for t in store.history(inst.id)][-2:] == [
        ("ready", "draining"),
        ("draining", "failed"),
    ]
    assert not Path(inst.ready_path or "").exists()
    stored = store.get_run(run_id)
    assert stored is not None and stored.outcome == "reaped" and stored.ended_at is not None
    # Idempotent: the second reap finds nothing.
    assert reap(store).runs == []


@pytest.mark.parametrize("mismatch", ["start time", "executable"])
def test_pid_now_held_by_an_unrelated_process_is_never_signalled(
    mismatch: str, store: Store, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    unrelated = sleeper(process_registry)
    real = running_identity(unrelated.pid)
    if mismatch == "start time":
        recorded = procs.ProcessIdentity(real.pid, real.start_time - 10, real.exe)
        binary = real.exe
    else:
        recorded = real
        binary = "/opt/cache/h2-ping-sidecar"
    run_id = make_run(store, log_dir, dead_pid(), [("policy", recorded, binary)])

    report = reap(store)

    assert unrelated.poll() is None, "an unrelated process was signalled"
    assert procs.identity_of(unrelated.pid) == real
    (inst,) = store.instances_of(run_id)
    assert inst.state == "failed"
    assert report.runs[0].instances[0].result == f"pid {real.pid} belongs to another process; not signalled"
    assert inst.error and "not signalled" in inst.error
    assert not Path(inst.ready_path or "").exists()


def test_owner_pid_reused_counts_as_gone(
    store: Store, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    impostor = sleeper(process_registry)
    real = running_identity(impostor.pid)
    run_id = make_run(
        store, log_dir, (real.pid, real.start_time - 100), [("policy", None, None)], state="building"
    )
    run = store.get_run(run_id)
    assert run is not None and owner_of(run) == "reused"

    report = reap(store)

    assert impostor.poll() is None
    assert report.runs[0].reason == f"owner pid {real.pid} now belongs to another process"
    (inst,) = store.instances_of(run_id)
    assert inst.state == "failed" and inst.error and "process had already exited" in inst.error


def test_live_run_is_left_entirely_alone(
    store: Store, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    proc = sleeper(process_registry)
    identity, me = running_identity(proc.pid), running_identity(os.getpid())
    make_run(store, log_dir, (me.pid, me.start_time), [("policy", identity, identity.exe)])
    before = db_rows(store.path)
    ready_files = sorted(log_dir.glob("*.ready"))

    assert reap(store).runs == []

    assert proc.poll() is None
    assert db_rows(store.path) == before
    assert sorted(log_dir.glob("*.ready")) == ready_files


def test_dry_run_changes_nothing_then_the_real_reap_does_what_it_said(
    store: Store, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    proc, other = sleeper(process_registry), sleeper(process_registry)
    identity, other_identity = running_identity(proc.pid), running_identity(other.pid)
    instances = [("policy", identity, identity.exe), ("judge", other_identity, "/not/ours")]
    make_run(store, log_dir, dead_pid(), instances)
    ready_files = sorted(log_dir.glob("*.ready"))
    # A proxy killed between creating its temp file and renaming it leaves that file too.
    leftover = ready_files[0].with_name(f".{ready_files[0].name}.tmp-4242")
    leftover.touch()
    # So does one killed while replacing its traffic file (a SIGKILL past the drain's grace).
    traffic_temp = log_dir / f".{ready_files[0].name.removesuffix('.ready')}.traffic.json.tmp-77"
    traffic_temp.touch()
    before = db_rows(store.path)

    plan = reap(store, dry_run=True)

    assert db_rows(store.path) == before
    assert sorted(log_dir.glob("*.ready")) == ready_files
    assert proc.poll() is None
    assert [i.action for i in plan.runs[0].instances] == [
        "SIGTERM, mark failed",
        "mark failed (pid not ours)",
    ]
    assert sorted(plan.runs[0].ready_files) == sorted(str(p) for p in [*ready_files, leftover])
    assert leftover.exists() and traffic_temp.exists()

    done = reap(store)
    assert [i.action for i in done.runs[0].instances] == [i.action for i in plan.runs[0].instances]
    assert procs.wait_exit(proc, 5) is not None
    assert other.poll() is None
    assert list(log_dir.glob("*.ready")) == []
    assert not leftover.exists()
    assert not traffic_temp.exists()


def test_two_reapers_at_once_reap_each_run_exactly_once(store: Store, log_dir: Path) -> None:
    for _ in range(3):
        make_run(store, log_dir, dead_pid(), [("policy", None, None)], state="building")
    env = {**os.environ, "SIDECAR_FSM_LOG_DIR": str(log_dir)}
    reapers = [
        subprocess.Popen(
            [sys.executable, "-m", "sidecar_fsm", "reap", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [reaper.communicate(timeout=60) for reaper in reapers]
    assert [reaper.returncode for reaper in reapers] == [0, 0], [err for _, err in outputs]
    reaped = [run["run_id"] for out, _ in outputs for run in json.loads(out)["runs"]]
    assert len(reaped) == 3 and len(set(reaped)) == 3
    assert all(run.outcome == "reaped" for run in store.list_runs("all"))
    assert database_path(log_dir).exists()


# A sidecar whose -exit-with-pid owner died: it is already draining, and exits by itself when
# the drain is done. A SIGTERM would be its second signal (drain cut short): it records one.
SELF_DRAINING = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    marker.write_text("SIGTERM")
    sys.exit(3)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(sys.argv[2]).write_text("up")
time.sleep(3.0)  # the drain of the requests in flight
"""


@dataclass(frozen=True)
class DrainingSidecar:
    proc: subprocess.Popen[bytes]
    identity: procs.ProcessIdentity
    marker: Path  # written if it is ever sent SIGTERM


@pytest.fixture
def draining(tmp_path: Path, process_registry: ProcessRegistry, wait_until: Any) -> DrainingSidecar:
    """A running ``SELF_DRAINING`` process, returned once it has set its SIGTERM handler (a
    SIGTERM before that would kill it unrecorded, and read as a drain cut short)."""
    marker, up = tmp_path / "sigterm", tmp_path / "up"
    proc = subprocess.Popen([sys.executable, "-c", SELF_DRAINING, str(marker), str(up)])
    process_registry.add(proc)
    wait_until(up.exists, 10, "the draining process did not start")
    identity = running_identity(proc.pid)
    return DrainingSidecar(proc, identity, marker)


def test_self_draining_sidecar_is_not_sent_a_second_signal(
    store: Store, log_dir: Path, draining: DrainingSidecar
) -> None:
    identity = draining.identity
    summary = {"shutdown_grace": "10s", "exit_with_owner": True}
    make_run(store, log_dir, dead_pid(), [("policy", identity, identity.exe)], summary=summary)

    report = reap(store)

    assert procs.wait_exit(draining.proc, 10) == 0, "the drain was cut short or the process was killed"
    assert not draining.marker.exists(), "reap sent SIGTERM to a sidecar that was already draining"
    (run,) = report.runs
    (instance,) = run.instances
    assert instance.action == "wait for its drain, mark failed"
    assert instance.result == "drained and exited by itself (exit_with_owner)"


def test_sidecar_its_launcher_left_draining_is_not_sent_a_second_signal(
    store: Store, log_dir: Path, draining: DrainingSidecar
) -> None:
    """A launcher killed mid-drain (no exit_with_owner): the row says draining, so its SIGTERM went
    out; reap lets the drain finish within the grace instead of cutting it with a second one."""
    identity = draining.identity
    summary = {"shutdown_grace": "10s", "exit_with_owner": False}
    run_id = make_run(store, log_dir, dead_pid(), [("policy", identity, identity.exe)], summary=summary)
    (inst,) = store.instances_of(run_id)
    InstanceMachine(store, inst.id, "ready").fire("drain", detail="SIGTERM")

    report = reap(store)

    assert procs.wait_exit(draining.proc, 10) == 0, "the drain was cut short or the process was killed"
    assert not draining.marker.exists(), "reap sent a second SIGTERM to a sidecar its launcher was draining"
    (instance,) = report.runs[0].instances
    assert instance.action == "wait for its drain, mark failed"
    assert instance.result == "finished the drain its launcher had begun, and exited"
    (inst,) = store.instances_of(run_id)
    assert inst.state == "failed"


def test_reap_on_a_missing_log_dir_says_so_and_creates_nothing(tmp_path: Path) -> None:
    """Not "nothing to reap": an operator who forgot --log-dir after a crash must hear it."""
    missing = tmp_path / "never-created"
    for args in (["reap"], ["reap", "--json"]):
        done = sidecar_cli(missing, *args)
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == missing_log_dir_line("reap", missing)
    assert not missing.exists()
