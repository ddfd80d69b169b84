"""``sidecar-fsm stop`` from another shell: it drains the run as Ctrl-C would and says how each
instance ended; several live runs are listed; an owner gone points at reap; a stop killed after
its signal still stops the run. ``logs`` follows the run it reads until the run ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from clirun import StartedCli, cli_json
from helpers import SIDECAR_FSM, ProcessRegistry, sidecar_cli, wait_until


def test_stop_from_another_shell_drains_the_run_and_says_how_each_instance_ended(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    assert sidecar_cli(log_dir, "stop").returncode == 1  # nothing recorded yet: nothing to stop
    started = StartedCli(log_dir, gym_config_file, process_registry)
    # The hint names the log dir: it is not the default one.
    assert f"see: sidecar-fsm --log-dir {log_dir} status" in started.text()
    assert sidecar_cli(log_dir, "status").returncode == 0  # healthy

    done = sidecar_cli(log_dir, "stop", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert started.proc.wait(timeout=10) == 0, started.text()
    assert f"run {started.run_id} ended; stop waited " in done.stdout
    rows = {line.split()[0]: line.split()[1:3] for line in done.stdout.splitlines()[2:]}
    assert rows == {"policy": ["stopped", "0"], "judge": ["stopped", "0"]}
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["outcome"] == "ended" and run["attention"] is None
    # Already ended: nothing to do, said so.
    again = sidecar_cli(log_dir, "stop", started.run_id[:6])
    assert again.returncode == 0 and "already ended" in again.stdout


def test_stop_with_several_live_runs_lists_them_and_with_the_owner_gone_points_at_reap(
    log_dir: Path, start_cli: Callable[..., StartedCli]
) -> None:
    first, second = start_cli(), start_cli()
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


def test_a_stop_killed_after_its_signal_still_stops_the_run(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    """``stop`` records nothing: the owner drains and closes the run, whether or not ``stop``
    lives to see it (crash point ``stop-requested``)."""
    started = StartedCli(log_dir, gym_config_file, process_registry)
    crashed = subprocess.run(
        [str(SIDECAR_FSM), "--log-dir", str(log_dir), "stop"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SIDECAR_FSM_CRASH_AT": "stop-requested"},
    )
    assert crashed.returncode == -signal.SIGKILL
    assert started.proc.wait(timeout=30) == 0, started.text()
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["outcome"] == "ended"
    assert {inst["state"] for inst in run["instances"]} == {"stopped"}


def test_logs_follows_every_instance_until_the_run_ends(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
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
