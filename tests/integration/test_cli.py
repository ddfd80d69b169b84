"""The ``sidecar-fsm`` command run as a subprocess against the real proxy, origin and database.

Covers ``start`` (supervise, SIGTERM drain, the rewritten config), the SIGKILL of a launcher and
what ``status`` and ``reap`` then do (with and without ``exit_with_owner``), ``history``,
``build``, and the read commands on a missing, empty or too-new state database.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ProcessRegistry, http11_request, wait_until

from sidecar_fsm import procs
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.store import Store, database_path, schema_version

SCRIPT = Path(sys.executable).with_name("sidecar-fsm")


def cli(log_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(log_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_json(log_dir: Path, *args: str) -> Any:
    done = cli(log_dir, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def write_gym_config(path: Path, origin: TlsH2Origin, binary: Path, **sidecar: Any) -> Path:
    """A Gym-shaped config: two sidecar instances on free ports, a model server on the origin."""
    config = {
        "policy_base_url": origin.url + "/v1",
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(origin.ca_file),
            "instances": [
                {"name": "policy", "upstream": origin.url, "listen": "127.0.0.1:0"},
                {"name": "judge", "upstream": origin.url, "listen": "127.0.0.1:0"},
            ],
            "shutdown_grace": "2s",
            **sidecar,
        },
        "policy_model": {"responses_api_models": {"openai_model": {"base_url": "${policy_base_url}"}}},
    }
    path.write_text(yaml.safe_dump(config))
    return path


class StartedCli:
    """A ``sidecar-fsm start`` subprocess, its output file, and the sidecars it reported ready."""

    def __init__(self, log_dir: Path, config: Path, registry: ProcessRegistry, *extra: str) -> None:
        self.output = log_dir.parent / "start.out"
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [str(SCRIPT), "--log-dir", str(log_dir), "start", str(config), *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        registry.add(self.proc)
        wait_until(
            lambda: "supervising" in self.text() or self.proc.poll() is not None, 30, "start to be ready"
        )
        assert self.proc.poll() is None, self.text()
        (self.run,) = cli_json(log_dir, "status")["runs"]
        self.instances = self.run["instances"]
        for inst in self.instances:
            registry.add_pid(inst["pid"])

    def text(self) -> str:
        return self.output.read_text(errors="replace")


def echo_through(inst: dict[str, Any]) -> int:
    host, port = inst["listen"].rsplit(":", 1)
    return http11_request(host, int(port), "/echo?x=1", timeout=10).status


def sidecar_identity(inst: dict[str, Any]) -> procs.ProcessIdentity:
    identity = procs.identity_of(inst["pid"])
    assert identity is not None, f"sidecar {inst['name']} is not running"
    return identity


@pytest.fixture
def gym_config(tmp_path: Path, tls_origin: TlsH2Origin, sidecar_binary: Path) -> Path:
    return write_gym_config(tmp_path / "gym.yaml", tls_origin, sidecar_binary)


def test_start_supervises_until_sigterm_then_drains_and_exits_0(
    log_dir: Path, gym_config: Path, process_registry: ProcessRegistry, tmp_path: Path
) -> None:
    rewritten = tmp_path / "rewritten.yaml"
    started = StartedCli(log_dir, gym_config, process_registry, "--write-config", str(rewritten))
    assert {inst["state"] for inst in started.instances} == {"ready"}
    assert all(echo_through(inst) == 200 for inst in started.instances)
    assert "policy_model.responses_api_models.openai_model.base_url" in started.text()
    written = yaml.safe_load(rewritten.read_text())
    base_url = written["policy_model"]["responses_api_models"]["openai_model"]["base_url"]
    assert base_url in {f"http://{inst['listen']}/v1" for inst in started.instances}
    assert written["policy_base_url"].startswith("https://localhost:")  # top-level key untouched

    started.proc.send_signal(signal.SIGTERM)
    assert started.proc.wait(timeout=30) == 0, started.text()

    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["outcome"] == "ended"
    assert {inst["state"] for inst in run["instances"]} == {"stopped"}
    history = cli_json(log_dir, "history", run["run_id"][:8], "policy")["transitions"]
    assert [(t["from"], t["to"]) for t in history] == [
        ("configured", "building"),
        ("building", "spawned"),
        ("spawned", "ready"),
        ("ready", "draining"),
        ("draining", "stopped"),
    ]
    human = cli(log_dir, "history", run["run_id"])
    assert human.returncode == 0
    assert human.stdout.splitlines()[1].split() == [
        "TIME",
        "AFTER",
        "INSTANCE",
        "FROM",
        "TO",
        "EVENT",
        "DETAIL",
    ]
    assert len(human.stdout.splitlines()) == 2 + 10  # header lines + 5 transitions x 2 instances


def test_sigkilled_start_leaves_sidecars_serving_until_reap(
    log_dir: Path,
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    config = write_gym_config(tmp_path / "gym.yaml", tls_origin, sidecar_binary, exit_with_owner=False)
    started = StartedCli(log_dir, config, process_registry)
    identities = [sidecar_identity(inst) for inst in started.instances]
    ready_files = [Path(inst["ready_path"]) for inst in started.instances]
    assert all(path.exists() for path in ready_files)

    started.proc.send_signal(signal.SIGKILL)
    started.proc.wait(timeout=10)

    # Nobody supervises them now, and without exit_with_owner they keep serving.
    assert all(echo_through(inst) == 200 for inst in started.instances)
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["owner"]["status"] == "dead" and run["ended_at"] is None
    assert {inst["state"] for inst in run["instances"]} == {"ready"}
    human = cli(log_dir, "status")
    assert f"pid {started.proc.pid} (dead)" in human.stdout
    assert "owner gone: run sidecar-fsm reap" in human.stdout

    plan = cli(log_dir, "reap", "--dry-run")
    assert plan.returncode == 0 and plan.stdout.startswith(f"would reap run {run['run_id'][:12]}")
    assert all(procs.is_ours(identity) for identity in identities)

    done = cli_json(log_dir, "reap")
    (reaped,) = done["runs"]
    assert reaped["run_id"] == run["run_id"] and reaped["owner"] == "dead"
    assert {inst["result"] for inst in reaped["instances"]} == {"drained and exited after SIGTERM"}
    assert not any(procs.is_ours(identity) for identity in identities)
    assert not any(path.exists() for path in ready_files)
    (after,) = cli_json(log_dir, "status", "--all")["runs"]
    assert after["outcome"] == "reaped"
    for inst in after["instances"]:
        assert inst["state"] == "failed"
        assert inst["error"].startswith(f"reaped: owner pid {started.proc.pid} is gone; drained and exited")

    again = cli(log_dir, "reap")
    assert again.returncode == 0
    assert again.stdout.startswith("nothing to reap")


def test_sigkilled_start_with_exit_with_owner_sidecars_exit_by_themselves(
    log_dir: Path, gym_config: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config, process_registry)
    identities = [sidecar_identity(inst) for inst in started.instances]

    started.proc.send_signal(signal.SIGKILL)
    started.proc.wait(timeout=10)

    # shutdown_grace is 2s; the sidecars notice the owner is gone, drain and exit.
    wait_until(
        lambda: not any(procs.is_ours(i) for i in identities), 2 + 10, "sidecars to exit with their owner"
    )
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["owner"]["status"] == "dead"
    assert {inst["state"] for inst in run["instances"]} == {"ready"}  # nobody recorded the exit yet

    (reaped,) = cli_json(log_dir, "reap")["runs"]
    assert {inst["result"] for inst in reaped["instances"]} == {"process had already exited"}
    (after,) = cli_json(log_dir, "status", "--all")["runs"]
    assert after["outcome"] == "reaped"
    assert {inst["state"] for inst in after["instances"]} == {"failed"}
    assert not any(Path(inst["ready_path"]).exists() for inst in after["instances"])
    assert cli_json(log_dir, "reap")["runs"] == []


@pytest.mark.parametrize("command", [["status"], ["status", "--all"], ["history", "abc"], ["reap"]])
def test_read_commands_on_a_missing_or_empty_log_dir(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "never-created"
    done = cli(missing, *command)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in {
        f"no runs recorded in {missing}",
        "nothing to reap: every recorded run has a live owner or is already closed",
    }
    assert not missing.exists()
    empty = tmp_path / "empty"
    Store.open(empty).close()
    done = cli(empty, *command)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    as_json = cli(empty, *command, "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) in ({"runs": []}, {"transitions": []}, {"dry_run": False, "runs": []})


@pytest.mark.parametrize("command", [["status"], ["history", "abc"], ["reap", "--dry-run"]])
def test_a_database_newer_than_the_code_is_refused_with_exit_2(command: list[str], log_dir: Path) -> None:
    Store.open(log_dir).close()
    path = database_path(log_dir)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema_version() + 1}")
    conn.commit()
    conn.close()
    before = path.read_bytes()

    done = cli(log_dir, *command)

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"{path}: schema {schema_version() + 1} is newer than this sidecar-fsm ({schema_version()}); "
        "upgrade it or use another --log-dir\n"
    )
    assert path.read_bytes() == before


def test_history_of_an_unknown_run_or_instance_fails_with_one_line(
    log_dir: Path, gym_config: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config, process_registry)
    started.proc.send_signal(signal.SIGINT)
    assert started.proc.wait(timeout=30) == 0
    unknown = cli(log_dir, "history", "zzzz")
    assert unknown.returncode == 1
    assert unknown.stderr == "sidecar-fsm history: run 'zzzz' is not recorded; see sidecar-fsm status --all\n"
    bad_instance = cli(log_dir, "history", started.run["run_id"], "nope")
    assert bad_instance.returncode == 1
    assert bad_instance.stderr.startswith("sidecar-fsm history: instance 'nope' is not in run ")
    assert bad_instance.stderr.count("\n") == 1


def test_build_prints_the_cached_binary(cache_dir: Path, sidecar_binary: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), "build", "--cache-dir", str(cache_dir)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.is_file() and os.access(path, os.X_OK)
    assert path.is_relative_to(cache_dir)


def test_start_exits_1_naming_the_sidecar_that_died(
    log_dir: Path, gym_config: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config, process_registry)
    judge = next(inst for inst in started.instances if inst["name"] == "judge")
    assert procs.signal_if_ours(sidecar_identity(judge), signal.SIGKILL)

    assert started.proc.wait(timeout=30) == 1, started.text()
    assert "judge" in started.text()
    (run,) = cli_json(log_dir, "status", "--run", started.run["run_id"][:6])["runs"]
    states = {inst["name"]: inst["state"] for inst in run["instances"]}
    assert states == {"judge": "failed", "policy": "stopped"}
    human = cli(log_dir, "status", "--run", started.run["run_id"])
    judge_line = next(line for line in human.stdout.splitlines() if line.strip().startswith("judge"))
    assert judge_line.split()[1] == "failed"
