"""``sidecar-fsm prune``: ended runs older than the age go with their files, never a live run; and
the temp files a launcher killed while creating the database left, which prune and reap remove.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from clirun import StartedCli, cli_json
from helpers import sidecar_cli

from sidecar_fsm.state.dbfile import DB_DIR_NAME


def test_prune_removes_ended_runs_and_their_files_but_never_a_live_run(
    log_dir: Path, start_cli: Callable[..., StartedCli]
) -> None:
    ended = []
    for _ in range(2):
        run = start_cli()
        assert sidecar_cli(log_dir, "stop", run.run_id).returncode == 0
        run.proc.wait(timeout=10)
        ended.append(run)
    live = start_cli()
    ended_logs = [inst["log_path"] for run in ended for inst in run.run["instances"]]
    assert all(os.path.exists(path) for path in ended_logs)

    assert "nothing to prune" in sidecar_cli(log_dir, "prune").stdout  # they ended just now, not 7 days ago
    dry = json.loads(sidecar_cli(log_dir, "prune", "--older-than", "0s", "--dry-run", "--json").stdout)
    assert dry["dry_run"] is True
    assert sorted(run["run_id"] for run in dry["runs"]) == sorted(run.run_id for run in ended)
    assert all(os.path.exists(path) for path in ended_logs)  # a dry run removes nothing

    done = sidecar_cli(log_dir, "prune", "--older-than", "0s")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2
    assert not any(os.path.exists(path) for path in ended_logs)
    runs = cli_json(log_dir, "status", "--all")["runs"]
    assert [run["run_id"] for run in runs] == [live.run_id]
    assert all(os.path.exists(inst["log_path"]) for inst in live.run["instances"])
    assert sidecar_cli(log_dir, "prune", "--older-than", "soon").returncode == 2
    assert sidecar_cli(log_dir, "stop", "--timeout", "30").returncode == 0  # the one live run


_CRASH_WHILE_CREATING = """
import os, signal, sys
from sidecar_fsm.state import schema
from sidecar_fsm.state.store import Store

migrate = schema.migrate

def migrate_then_die(conn, path):
    # The temp database is complete and still open (its -wal and -shm exist): a launcher
    # SIGKILLed here never reaches the cleanup in dbfile._create's finally.
    migrate(conn, path)
    os.kill(os.getpid(), signal.SIGKILL)

schema.migrate = migrate_then_die
Store.open(sys.argv[1])
"""


def test_a_launcher_killed_while_creating_the_database_leaves_temp_files_reap_removes(
    log_dir: Path,
) -> None:
    done = subprocess.run([sys.executable, "-c", _CRASH_WHILE_CREATING, str(log_dir)], timeout=30)
    assert done.returncode == -signal.SIGKILL
    state = log_dir / DB_DIR_NAME
    temps = sorted(path.name for path in state.iterdir() if path.name.endswith((".tmp", "-wal", "-shm")))
    assert temps and all(name.startswith(".") and ".db." in name for name in temps), temps
    assert not list(state.glob("*.db"))  # never linked into place

    dry = json.loads(sidecar_cli(log_dir, "reap", "--dry-run", "--json").stdout)
    assert sorted(Path(path).name for path in dry["temp_files"]) == temps
    reaped = sidecar_cli(log_dir, "reap")
    assert reaped.returncode == 0, reaped.stderr
    assert reaped.stdout.count("removed database temp file") == len(temps)
    assert [path.name for path in state.iterdir() if path.name.startswith(".") and ".db." in path.name] == []
