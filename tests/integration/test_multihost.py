"""A log dir shared by several hosts: ``status`` and ``history`` read every host's database.

Two real databases, ``node-a.db`` and ``node-b.db``, are written in one log dir through the real
store and state machine (as two machines on a cluster filesystem would), and the read commands
run as subprocesses. Neither name is this machine's, so their owners are "other host": a pid
from another machine means nothing here, and this host's plain ``reap`` must leave them alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from sidecar_fsm.errors import ConfigError
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.hostname import HOST_ENV, host_name
from sidecar_fsm.state.store import Store, database_path


def cli(log_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != HOST_ENV}
    return subprocess.run(
        [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(log_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def cli_json(log_dir: Path, *args: str) -> Any:
    done = cli(log_dir, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def record_run(store: Store, names: list[str], *, end: bool = False) -> str:
    """A run on ``store``'s host whose instances went configured -> building -> spawned -> ready
    (and, with ``end``, drained and stopped, the run ended). The owner pid is arbitrary: on
    another host it is never looked up."""
    run_id = uuid.uuid4().hex
    store.create_run(run_id, 4242, 1.0, {"shutdown_grace": "5s"})
    for index, name in enumerate(names):
        listen = f"127.0.0.1:{21000 + index}"
        record = store.create_instance(run_id, name, listen, "https://api.example.com", None, None, None)
        machine = InstanceMachine(store, record.id)
        machine.fire("build")
        machine.fire("spawn", pid=30000 + index, pid_start_time=2.0)
        machine.fire("ready")
        if end:
            machine.fire("drain", detail="stop requested")
            machine.fire("stop", exit_code=0)
    if end:
        store.end_run(run_id, "ended")
    return run_id


@pytest.fixture
def two_hosts(log_dir: Path) -> dict[str, str]:
    """node-a: a finished run, then a live one; node-b: a live run. Returns name -> run id."""
    with Store.open(log_dir, host="node-a") as a, Store.open(log_dir, host="node-b") as b:
        runs = {
            "a-finished": record_run(a, ["policy"], end=True),
            "a-live": record_run(a, ["policy"]),
            "b-live": record_run(b, ["policy", "judge"]),
        }
    assert sorted(p.name for p in (log_dir / "sidecar-fsm").glob("*.db")) == ["node-a.db", "node-b.db"]
    return runs


def test_status_shows_every_hosts_runs_from_one_shared_log_dir(
    log_dir: Path, two_hosts: dict[str, str]
) -> None:
    every = cli_json(log_dir, "status", "--all")["runs"]
    assert {run["run_id"]: run["host"] for run in every} == {
        two_hosts["a-finished"]: "node-a",
        two_hosts["a-live"]: "node-a",
        two_hosts["b-live"]: "node-b",
    }
    assert {run["owner"]["status"] for run in every} == {"other host"}
    b_live = next(run for run in every if run["run_id"] == two_hosts["b-live"])
    assert [(inst["name"], inst["state"]) for inst in b_live["instances"]] == [
        ("policy", "ready"),
        ("judge", "ready"),
    ]

    # The default view: every host's live runs, plus the latest finished one.
    default = {run["run_id"] for run in cli_json(log_dir, "status")["runs"]}
    assert default == set(two_hosts.values())

    human = cli(log_dir, "status")
    assert human.returncode == 0, human.stderr
    assert human.stdout.count("live (owner on another host)") == 2
    hosts = [line.split()[1] for line in human.stdout.splitlines() if line and not line.startswith(" ")]
    assert sorted(h for h in hosts if h != "HOST") == ["node-a", "node-a", "node-b"]


@pytest.mark.parametrize("run", ["a-finished", "b-live"])
def test_history_finds_a_run_in_whichever_hosts_database_holds_it(
    run: str, log_dir: Path, two_hosts: dict[str, str]
) -> None:
    run_id = two_hosts[run]
    document = cli_json(log_dir, "history", run_id[:10], "policy")
    assert document["run"]["run_id"] == run_id
    assert document["run"]["host"] == ("node-a" if run.startswith("a") else "node-b")
    steps = [(t["from"], t["to"]) for t in document["transitions"]]
    expected = [("configured", "building"), ("building", "spawned"), ("spawned", "ready")]
    if run == "a-finished":
        expected += [("ready", "draining"), ("draining", "stopped")]
    assert steps == expected

    human = cli(log_dir, "history", run_id)
    assert human.returncode == 0, human.stderr
    host = document["run"]["host"]
    assert human.stdout.startswith(f"run {run_id} on {host}, owner pid 4242")


def test_plain_reap_leaves_other_hosts_databases_alone(log_dir: Path, two_hosts: dict[str, str]) -> None:
    before = {p.name: p.read_bytes() for p in (log_dir / "sidecar-fsm").glob("node-*.db")}
    done = cli_json(log_dir, "reap")
    assert done["runs"] == []
    # Only this host's database is reaped; the owners of node-a/node-b runs are never judged here.
    assert not database_path(log_dir).exists()
    after = {p.name: p.read_bytes() for p in (log_dir / "sidecar-fsm").glob("node-*.db")}
    assert after == before
    statuses = cli_json(log_dir, "status", "--all")["runs"]
    assert sum(run["ended_at"] is None for run in statuses) == 2


def test_host_name_honours_the_environment_and_refuses_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ENV, "node-7.cluster")
    assert host_name() == "node-7.cluster"
    monkeypatch.setenv(HOST_ENV, "")
    assert host_name() == os.uname().nodename
    for bad in ("../etc", "a/b", ".hidden"):
        monkeypatch.setenv(HOST_ENV, bad)
        with pytest.raises(ConfigError) as raised:
            host_name()
        assert str(raised.value) == (
            f"{HOST_ENV}: '{bad}' is not a host name; use letters, digits, '.', '-' or '_'"
        )
