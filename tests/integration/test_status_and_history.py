"""``status`` and ``history`` as a user runs them: a missing log dir or run fails alike, a newer
database is refused, a process is called alive only once its identity is proven, and an unforeseen
filesystem fault is one line naming the command and the path.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import (
    StartedCli,
    cli_json,
    db_rows,
)
from helpers import ProcessRegistry, sidecar_cli

from sidecar_fsm.base import procs
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, database_path, schema_version


@pytest.mark.parametrize("command", [["status"], ["status", "--all"], ["status", "--run", "abc"]])
def test_status_on_a_missing_log_dir_or_run_fails_alike_and_on_an_empty_one_says_so(
    command: list[str], tmp_path: Path
) -> None:
    missing = tmp_path / "never-created"
    for argv in ([*command, "--log-dir", str(missing)], ["--log-dir", str(missing), *command, "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "sidecar_fsm", *argv], capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm status: log dir '{missing}' does not exist; "
            "give the --log-dir (or SIDECAR_FSM_LOG_DIR) the run was started with\n"
        )
    assert not missing.exists()
    empty = tmp_path / "empty"
    Store.open(empty).close()
    done = sidecar_cli(empty, *command)
    if "--run" in command:
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm status --run: run 'abc' is not recorded in {empty}; "
            f"see sidecar-fsm --log-dir {empty} status --all\n"
        )
        return
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"no runs recorded in {empty}\n"
    as_json = sidecar_cli(empty, *command, "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == {"runs": []}


def test_history_on_a_missing_log_dir_or_run_fails_alike(tmp_path: Path) -> None:
    missing = tmp_path / "never-created"
    done = sidecar_cli(missing, "history", "abc")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"sidecar-fsm history: log dir '{missing}' does not exist; ")
    assert not missing.exists()
    empty = tmp_path / "empty"
    Store.open(empty).close()
    for extra in ([], ["--json"]):
        done = sidecar_cli(empty, "history", "abc", *extra)
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm history: run 'abc' is not recorded in {empty}; "
            f"see sidecar-fsm --log-dir {empty} status --all\n"
        )


@pytest.mark.parametrize("command", [["status"], ["history", "abc"], ["reap", "--dry-run"]])
def test_a_database_newer_than_the_code_is_refused_with_exit_2(command: list[str], log_dir: Path) -> None:
    Store.open(log_dir).close()
    path = database_path(log_dir)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema_version() + 1}")
    conn.commit()
    conn.close()
    before = path.read_bytes()

    done = sidecar_cli(log_dir, *command)

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"{path}: schema {schema_version() + 1} is newer than this sidecar-fsm ({schema_version()}); "
        "upgrade it or use another --log-dir\n"
    )
    assert path.read_bytes() == before


def test_history_of_an_unknown_run_or_instance_fails_with_one_line(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
    started.proc.send_signal(signal.SIGINT)
    assert started.proc.wait(timeout=30) == 0
    unknown = sidecar_cli(log_dir, "history", "zzzz")
    assert unknown.returncode == 1
    assert unknown.stderr == (
        f"sidecar-fsm history: run 'zzzz' is not recorded in {log_dir}; "
        f"see sidecar-fsm --log-dir {log_dir} status --all\n"
    )
    bad_instance = sidecar_cli(log_dir, "history", started.run["run_id"], "nope")
    assert bad_instance.returncode == 1
    assert bad_instance.stderr.startswith("sidecar-fsm history: instance 'nope' is not in run ")
    assert bad_instance.stderr.count("\n") == 1


SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"


def test_status_proves_identity_before_calling_a_process_alive(
    log_dir: Path, process_registry: ProcessRegistry
) -> None:
    """Three instances recorded ready: one whose process runs, one whose pid another process now
    holds (its start time differs), one whose process exited. Records go through the real store
    and state machine; the processes are real (``sleep``)."""
    ours = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    impostor = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    exited = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    owner = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    for proc in (ours, impostor, exited, owner):
        process_registry.add(proc)
    identities = {name: procs.identity_of(p.pid) for name, p in (("ours", ours), ("impostor", impostor))}
    exited_identity = procs.identity_of(exited.pid)
    owner_identity = procs.identity_of(owner.pid)
    for gone in (exited, owner):  # identities read while they ran; now they end
        gone.kill()
        gone.wait()
    assert owner_identity and exited_identity and identities["ours"] and identities["impostor"]
    recorded = {
        "policy": identities["ours"],
        "judge": procs.ProcessIdentity(impostor.pid, identities["impostor"].start_time - 10, SLEEP),
        "critic": exited_identity,
    }
    with Store.open(log_dir) as store:
        run_id = "f00dfeed" * 4
        store.create_run(run_id, owner.pid, owner_identity.start_time, {"shutdown_grace": "5s"})
        for index, (name, identity) in enumerate(recorded.items()):
            record = store.create_instance(
                run_id,
                name,
                f"127.0.0.1:{20000 + index}",
                "https://api.example.com",
                identity.exe,
                None,
                None,
            )
            machine = InstanceMachine(store, record.id)
            machine.fire("build")
            machine.fire("spawn", pid=identity.pid, pid_start_time=identity.start_time)
            machine.fire("ready")
    before = db_rows(database_path(log_dir))

    (run,) = cli_json(log_dir, "status")["runs"]
    observed = {inst["name"]: (inst["state"], inst["alive"], inst["process"]) for inst in run["instances"]}
    assert observed == {
        "policy": ("ready", True, "running"),
        "judge": ("ready", False, "reused"),
        "critic": ("ready", False, "gone"),
    }
    human = sidecar_cli(log_dir, "status").stdout
    assert f"{impostor.pid} (reused)" in human
    assert (
        f"recorded ready but pid {impostor.pid} now belongs to another process; "
        f"run sidecar-fsm --log-dir {log_dir} reap" in human
    )
    assert f"{exited.pid} (gone)" in human
    assert db_rows(database_path(log_dir)) == before  # reading never changes the database
    assert ours.poll() is None and impostor.poll() is None  # and never signals


def test_an_unforeseen_filesystem_fault_is_one_line_naming_the_command_and_path(tmp_path: Path) -> None:
    """A config whose cache_dir runs through a file: the build cannot make its folder."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    config = tmp_path / "gym.yaml"
    config.write_text(
        f"cache_dir: {a_file / 'cache'}\n"
        "sidecar:\n  enabled: true\n"
        "  instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:0'}]\n"
    )
    done = sidecar_cli(tmp_path / "logs", "start", str(config))
    assert done.returncode in (1, 2), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("sidecar-fsm start: ") and str(a_file) in done.stderr, done.stderr
    assert a_file.read_text() == "mine\n"
