"""``sidecar-fsm start`` as a user runs it: supervising until SIGINT or SIGTERM, then draining;
a launcher killed with -9 and what its sidecars do; a sidecar dying under it; the user's build cache;
an upstream path dropped with a warning; a second Ctrl-C; a closed stdout pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml
from clirun import (
    StartedCli,
    cli_json,
    db_rows,
    echo_through,
    load_through_the_launcher,
    sidecar_identity,
    write_gym_config,
)
from helpers import SIDECAR_FSM, ProcessRegistry, sidecar_cli, wait_until
from launchrun import request_in_flight

from sidecar_fsm.base import procs
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.state.store import database_path


def test_start_supervises_until_sigterm_then_drains_and_exits_0(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry, tmp_path: Path
) -> None:
    rewritten = tmp_path / "rewritten.yaml"
    started = StartedCli(log_dir, gym_config_file, process_registry, "--write-config", str(rewritten))
    assert {inst["state"] for inst in started.instances} == {"ready"}
    assert all(echo_through(inst) == 200 for inst in started.instances)
    assert "policy_model.responses_api_models.openai_model.base_url" in started.text()
    written = yaml.safe_load(rewritten.read_text())
    base_url = written["policy_model"]["responses_api_models"]["openai_model"]["base_url"]
    assert base_url in {f"http://{inst['listen']}/v1" for inst in started.instances}
    assert written["policy_base_url"].startswith("https://localhost:")  # top-level key untouched
    # Its sidecars already run: `gym env start --config OUT.yaml` must not start a second set.
    assert written["sidecar"]["enabled"] is False
    assert "cache_dir" not in written  # the CLI's cache choice is not put into the user's config
    second = load_through_the_launcher(rewritten)
    assert second == {"manager": None, "base_url": base_url}
    assert len(cli_json(log_dir, "status", "--all")["runs"]) == 1  # no second run recorded
    assert [sidecar_identity(inst) for inst in started.instances]  # the first set still serves

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
    human = sidecar_cli(log_dir, "history", run["run_id"])
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
    # header lines + 5 transitions x 2 instances + what each instance carried
    assert len(human.stdout.splitlines()) == 2 + 10 + 2
    assert [line.split(":")[0] for line in human.stdout.splitlines()[-2:]] == [
        "traffic policy",
        "traffic judge",
    ]


def test_sigkilled_start_leaves_sidecars_serving_until_reap(
    log_dir: Path, start_cli: Callable[..., StartedCli]
) -> None:
    started = start_cli(exit_with_owner=False)
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
    assert {inst["alive"] for inst in run["instances"]} == {True}  # ours, and still running
    human = sidecar_cli(log_dir, "status")
    assert human.returncode == 3  # owner gone with sidecars still running: needs attention
    assert f"pid {started.proc.pid} (dead)" in human.stdout
    assert f"owner gone: run sidecar-fsm --log-dir {log_dir} reap" in human.stdout

    plan = sidecar_cli(log_dir, "reap", "--dry-run")
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

    again = sidecar_cli(log_dir, "reap")
    assert again.returncode == 0
    assert again.stdout.startswith("nothing to reap")


def test_sigkilled_start_with_exit_with_owner_sidecars_exit_by_themselves(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
    started.sigkill_and_wait_for_sidecars()
    before = db_rows(database_path(log_dir))
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["owner"]["status"] == "dead"
    assert {inst["state"] for inst in run["instances"]} == {"ready"}  # nobody recorded the exit yet
    # ...but status says what is true now: the processes are gone.
    assert [(inst["alive"], inst["process"]) for inst in run["instances"]] == [(False, "gone")] * 2
    human = sidecar_cli(log_dir, "status")
    for inst in run["instances"]:
        line = next(line for line in human.stdout.splitlines() if line.strip().startswith(inst["name"] + " "))
        assert f"{inst['pid']} (gone)" in line
        assert line.endswith(
            f"recorded ready but pid {inst['pid']} has exited; nothing left running: "
            f"run sidecar-fsm --log-dir {log_dir} reap to close the record"
        )
    assert "ended: owner gone, nothing left running" in human.stdout
    assert human.returncode == 0  # nothing needs attention: nothing of the run is left
    history = sidecar_cli(log_dir, "history", run["run_id"], "policy")
    assert history.returncode == 0
    head = history.stdout.splitlines()[:2]
    assert f"owner pid {started.proc.pid} (dead: run sidecar-fsm --log-dir {log_dir} reap)" in head[0]
    assert head[1].startswith("policy: recorded ready but pid ")
    as_json = cli_json(log_dir, "history", run["run_id"])
    assert {inst["alive"] for inst in as_json["instances"]} == {False}
    assert as_json["run"]["owner"]["status"] == "dead"
    assert db_rows(database_path(log_dir)) == before  # reading never changes the database

    (reaped,) = cli_json(log_dir, "reap")["runs"]
    assert {inst["result"] for inst in reaped["instances"]} == {"process had already exited"}
    (after,) = cli_json(log_dir, "status", "--all")["runs"]
    assert after["outcome"] == "reaped"
    assert {inst["state"] for inst in after["instances"]} == {"failed"}
    assert not any(Path(inst["ready_path"]).exists() for inst in after["instances"])
    assert cli_json(log_dir, "reap")["runs"] == []


def test_start_exits_1_naming_the_sidecar_that_died(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
    judge = next(inst for inst in started.instances if inst["name"] == "judge")
    assert procs.signal_if_ours(sidecar_identity(judge), signal.SIGKILL)

    assert started.proc.wait(timeout=30) == 1, started.text()
    assert "judge" in started.text()
    (run,) = cli_json(log_dir, "status", "--run", started.run["run_id"][:6])["runs"]
    states = {inst["name"]: inst["state"] for inst in run["instances"]}
    assert states == {"judge": "failed", "policy": "stopped"}
    human = sidecar_cli(log_dir, "status", "--run", started.run["run_id"])
    judge_line = next(line for line in human.stdout.splitlines() if line.strip().startswith("judge"))
    assert judge_line.split()[1] == "failed"


def test_start_and_build_use_the_users_cache_not_the_working_directory(
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    cache_dir: Path,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    # $XDG_CACHE_HOME/sidecar-fsm is the session's cache (already built), so nothing compiles.
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "sidecar-fsm").symlink_to(cache_dir)
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg)}
    elsewhere = tmp_path / "some-other-folder"
    elsewhere.mkdir()
    log_dir = tmp_path / "logs"
    config = write_gym_config(tmp_path / "gym.yaml", tls_origin, None)

    built = subprocess.run(
        [str(SIDECAR_FSM), "build"], capture_output=True, text=True, timeout=600, env=env, cwd=elsewhere
    )
    assert built.returncode == 0, built.stderr
    assert Path(built.stdout.strip()) == xdg / "sidecar-fsm" / sidecar_binary.relative_to(cache_dir)

    started = StartedCli(log_dir, config, process_registry, env=env, cwd=elsewhere)
    assert {inst["binary"] for inst in started.instances} == {built.stdout.strip()}
    assert "building" not in started.text()
    started.proc.send_signal(signal.SIGINT)
    assert started.proc.wait(timeout=30) == 0, started.text()
    assert list(elsewhere.iterdir()) == []  # no ./cache


def test_an_upstream_path_is_dropped_with_one_warning_line(tmp_path: Path) -> None:
    """The warning names the field and the value in one line, not Python's file:line form."""
    config = tmp_path / "gym.yaml"
    missing = tmp_path / "no-such-binary"
    config.write_text(
        yaml.safe_dump(
            {
                "sidecar": {
                    "enabled": True,
                    "binary": str(missing),
                    "build_if_missing": False,
                    "instances": [
                        {"name": "policy", "upstream": "https://api.example.com/v1", "listen": "127.0.0.1:0"}
                    ],
                }
            }
        )
    )
    done = sidecar_cli(tmp_path / "logs", "start", str(config))
    assert done.returncode == 1, done.stderr
    warning, error = done.stderr.strip().splitlines()
    assert warning.startswith(
        "sidecar-fsm: warning: sidecar.instances[0].upstream: 'https://api.example.com/v1'"
    )
    assert "dropped" in warning
    assert "does not exist" in error
    assert "Traceback" not in done.stderr and not (tmp_path / "logs").exists()


def test_a_second_ctrl_c_ends_the_drain_now_and_says_so(
    tls_origin: TlsH2Origin, start_cli: Callable[..., StartedCli]
) -> None:
    started = start_cli(shutdown_grace="60s")
    policy = next(inst for inst in started.run["instances"] if inst["name"] == "policy")
    client, answers = request_in_flight(policy["listen"], "/slow?first_byte=50", tls_origin)

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
