"""``stop``, ``logs``, ``prune``, ``lab``, ``status``'s exit codes and a followable drain, as a user
runs them: each command a real subprocess against the real proxy, origin and database.

A ``start`` runs in the background and another process stops it; ``logs -f`` follows a run
until it ends; ``prune`` meets runs this test ended itself beside a live one that must survive;
a launcher SIGKILLed while it creates the database leaves temp files that ``reap`` removes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import SIDECAR_FSM, ProcessRegistry, http11_request, sidecar_cli, wait_until

from sidecar_fsm.lab import TlsH2Origin, h2_request
from sidecar_fsm.state.dbfile import DB_DIR_NAME


def status_json(log_dir: Path, *args: str) -> Any:
    done = sidecar_cli(log_dir, "status", "--json", *args)
    assert done.returncode in (0, 3), done.stderr
    return json.loads(done.stdout)


def write_config(path: Path, origin: TlsH2Origin, binary: Path, grace: str = "2s", **extra: Any) -> Path:
    config = {
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(origin.ca_file),
            "metrics": True,
            "shutdown_grace": grace,
            "instances": [
                {"name": "policy", "upstream": origin.url, "listen": "127.0.0.1:0"},
                {"name": "judge", "upstream": origin.url, "listen": "127.0.0.1:0"},
            ],
            **extra,
        },
    }
    path.write_text(yaml.safe_dump(config))
    return path


class Started:
    """A ``sidecar-fsm start`` in the background; its run as ``status --json`` shows it."""

    def __init__(self, log_dir: Path, config: Path, registry: ProcessRegistry, *extra: str) -> None:
        self.output = config.with_suffix(".out")
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [str(SIDECAR_FSM), "start", str(config), "--log-dir", str(log_dir), *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        registry.add(self.proc)
        wait_until(lambda: "supervising" in self.text() or self.proc.poll() is not None, 30, "start")
        assert self.proc.poll() is None, self.text()
        runs = status_json(log_dir, "--all")["runs"]
        (self.run,) = [run for run in runs if run["owner"]["pid"] == self.proc.pid]
        self.run_id: str = self.run["run_id"]
        for inst in self.run["instances"]:
            registry.add_pid(inst["pid"])

    def text(self) -> str:
        return self.output.read_text(errors="replace")


@pytest.fixture
def config(tmp_path: Path, tls_origin: TlsH2Origin, sidecar_binary: Path) -> Path:
    return write_config(tmp_path / "gym.yaml", tls_origin, sidecar_binary)


def test_stop_from_another_shell_drains_the_run_and_says_how_each_instance_ended(
    log_dir: Path, config: Path, process_registry: ProcessRegistry
) -> None:
    assert sidecar_cli(log_dir, "stop").returncode == 1  # nothing recorded yet: nothing to stop
    started = Started(log_dir, config, process_registry)
    # The hint names the log dir: it is not the default one.
    assert f"see: sidecar-fsm --log-dir {log_dir} status" in started.text()
    assert sidecar_cli(log_dir, "status").returncode == 0  # healthy

    done = sidecar_cli(log_dir, "stop", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert started.proc.wait(timeout=10) == 0, started.text()
    assert f"run {started.run_id} ended; stop waited " in done.stdout
    rows = {line.split()[0]: line.split()[1:3] for line in done.stdout.splitlines()[2:]}
    assert rows == {"policy": ["stopped", "0"], "judge": ["stopped", "0"]}
    (run,) = status_json(log_dir)["runs"]
    assert run["outcome"] == "ended" and run["attention"] is None
    # Already ended: nothing to do, said so.
    again = sidecar_cli(log_dir, "stop", started.run_id[:6])
    assert again.returncode == 0 and "already ended" in again.stdout


def test_stop_with_several_live_runs_lists_them_and_with_the_owner_gone_points_at_reap(
    log_dir: Path,
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    first = Started(log_dir, write_config(tmp_path / "a.yaml", tls_origin, sidecar_binary), process_registry)
    second = Started(log_dir, write_config(tmp_path / "b.yaml", tls_origin, sidecar_binary), process_registry)
    several = sidecar_cli(log_dir, "stop")
    assert several.returncode == 2
    assert "2 live runs" in several.stderr
    assert first.run_id in several.stderr and second.run_id in several.stderr

    first.proc.kill()
    first.proc.wait(timeout=10)
    # Owner gone: its sidecars (exit_with_owner) drain and exit by themselves; while one still
    # runs status needs attention (3), and once none does the run reads as ended (0).
    watched = wait_until(
        lambda: (done := sidecar_cli(log_dir, "status", "--run", first.run_id)).returncode == 0 and done,
        30,
        "the killed launcher's sidecars to exit with it",
    )
    assert "ended: owner gone, nothing left running" in watched.stdout, watched.stdout
    gone = sidecar_cli(log_dir, "stop", first.run_id)
    assert gone.returncode == 1
    assert gone.stderr.strip().endswith(f"is gone; run sidecar-fsm --log-dir {log_dir} reap")
    assert len(gone.stderr.strip().splitlines()) == 1

    assert sidecar_cli(log_dir, "stop", second.run_id, "--timeout", "30").returncode == 0
    assert second.proc.wait(timeout=10) == 0
    assert sidecar_cli(log_dir, "reap").returncode == 0


def test_logs_follows_every_instance_until_the_run_ends(
    log_dir: Path, config: Path, process_registry: ProcessRegistry
) -> None:
    started = Started(log_dir, config, process_registry)
    tail = sidecar_cli(log_dir, "logs", started.run_id, "policy", "-n", "1")
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 1
    assert not tail.stdout.startswith("policy |")  # one instance: no prefix

    follow_out = log_dir.parent / "follow.out"
    with open(follow_out, "wb") as out:
        follower = subprocess.Popen(
            [str(SIDECAR_FSM), "--log-dir", str(log_dir), "logs", started.run_id[:8], "-f"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    process_registry.add(follower)
    wait_until(lambda: "judge  | " in follow_out.read_text(), 10, "the judge's log lines")
    started.proc.send_signal(signal.SIGTERM)
    assert started.proc.wait(timeout=30) == 0
    assert follower.wait(timeout=10) == 0  # the run ended: -f ends by itself
    text = follow_out.read_text()
    # The drain's last words were written before the run closed, so -f has them.
    assert any(line.startswith("policy | ") and "drained" in line for line in text.splitlines()), text
    assert any(line.startswith("judge  | ") and "drained" in line for line in text.splitlines()), text


def test_prune_removes_ended_runs_and_their_files_but_never_a_live_run(
    log_dir: Path,
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    ended = []
    for name in ("one", "two"):
        run = Started(
            log_dir, write_config(tmp_path / f"{name}.yaml", tls_origin, sidecar_binary), process_registry
        )
        assert sidecar_cli(log_dir, "stop", run.run_id).returncode == 0
        run.proc.wait(timeout=10)
        ended.append(run)
    live = Started(
        log_dir, write_config(tmp_path / "live.yaml", tls_origin, sidecar_binary), process_registry
    )
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
    runs = status_json(log_dir, "--all")["runs"]
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


def test_a_second_ctrl_c_ends_the_drain_now_and_says_so(
    log_dir: Path,
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    config = write_config(tmp_path / "slow.yaml", tls_origin, sidecar_binary, grace="60s")
    started = Started(log_dir, config, process_registry)
    policy = next(inst for inst in started.run["instances"] if inst["name"] == "policy")
    host, port = policy["listen"].rsplit(":", 1)
    answers: list[object] = []

    def slow_request() -> None:
        try:
            answers.append(http11_request(host, int(port), "/slow?first_byte=50", timeout=60).status)
        except OSError as error:
            answers.append(error)

    client = threading.Thread(target=slow_request, daemon=True)
    client.start()
    wait_until(lambda: tls_origin.active_streams >= 1, 10, "the request to reach the origin")

    started.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "draining policy:" in started.text(), 10, "the drain lines")
    text = started.text()
    assert "draining policy: 1 request in flight, up to 60s; Ctrl-C again to stop now" in text
    assert "draining judge: no request in flight" in text

    started.proc.send_signal(signal.SIGINT)
    # Well before the 60 s grace: the proxies ended their drain at their second signal.
    assert started.proc.wait(timeout=20) == 0, started.text()
    assert "SIGINT again: stopping now" in started.text()
    assert "stopped now (drain cut short)" in started.text()
    client.join(timeout=20)
    assert answers and answers[0] != 200


def test_lab_prints_an_upstream_and_ca_file_that_work(
    tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    output = tmp_path / "lab.out"
    with open(output, "wb") as out:
        lab = subprocess.Popen([str(SIDECAR_FSM), "lab", "--idle", "5"], stdout=out, stderr=subprocess.STDOUT)
    process_registry.add(lab)
    wait_until(lambda: "serving until Ctrl-C" in output.read_text() or lab.poll() is not None, 20, "the lab")
    values = dict(
        line.split(": ", 1)
        for line in output.read_text().splitlines()
        if line.startswith(("upstream:", "ca_file:"))
    )
    port = int(values["upstream"].rsplit(":", 1)[1])
    status, _ = h2_request("127.0.0.1", port, "/echo?x=1", values["ca_file"], server_hostname="localhost")
    assert status == 200
    lab.send_signal(signal.SIGTERM)
    assert lab.wait(timeout=10) == 0
    assert not os.path.exists(values["ca_file"])  # the lab's throwaway CA goes with it


def test_a_closed_stdout_pipe_is_quiet(log_dir: Path) -> None:
    (log_dir / "x").mkdir()
    proc = subprocess.Popen(
        [str(SIDECAR_FSM), "--log-dir", str(log_dir / "x"), "status", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the command writes (`status | head -0`)
    stderr = proc.stderr.read()
    assert proc.wait(timeout=30) == 128 + signal.SIGPIPE
    assert stderr == b""


def test_a_stop_killed_after_its_signal_still_stops_the_run(
    log_dir: Path, config: Path, process_registry: ProcessRegistry
) -> None:
    """``stop`` records nothing: the owner drains and closes the run, whether or not ``stop``
    lives to see it (crash point ``stop-requested``)."""
    started = Started(log_dir, config, process_registry)
    crashed = subprocess.run(
        [str(SIDECAR_FSM), "--log-dir", str(log_dir), "stop"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SIDECAR_FSM_CRASH_AT": "stop-requested"},
    )
    assert crashed.returncode == -signal.SIGKILL
    assert started.proc.wait(timeout=30) == 0, started.text()
    (run,) = status_json(log_dir)["runs"]
    assert run["outcome"] == "ended"
    assert {inst["state"] for inst in run["instances"]} == {"stopped"}
