"""A sidecar that dies after it was ready: ``check()`` reports it with its exit and its log, and a
restart policy brings it back on the same address, counted and recorded.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import http11_request
from launchrun import (
    assert_nothing_left,
    failure_of,
    history,
    run_records,
    states_path,
)
from omegaconf import DictConfig

from sidecar_fsm.errors import SidecarError
from sidecar_fsm.launcher import H2PingSidecarManager
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import InstanceRecord


def test_killed_sidecar_is_reported_with_exit_code_and_log(
    lab_config: Callable[..., DictConfig],
    log_dir: Path,
    wait_until: Callable[..., Any],
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> None:
    manager = start_manager(lab_config())
    ((_, (record,)),) = run_records(log_dir)
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    error = wait_until(failure_of(manager), 10, "check() to report the killed sidecar")
    message = str(error)
    assert "h2-ping-sidecar 'nvcf'" in message
    assert "exited with code 137 (killed by SIGKILL) unexpectedly" in message
    assert "-9" not in message.splitlines()[0]
    assert "listening" in message.lower()  # the log tail: the proxy's own startup line
    # Reported again on the next poll, not forgotten.
    with pytest.raises(SidecarError, match="nvcf"):
        manager.check()
    manager.stop()
    ((run, (record,)),) = run_records(log_dir)
    assert (run.outcome, record.state, record.exit_code) == ("failed", "failed", -signal.SIGKILL)
    assert_nothing_left(log_dir)


def test_restart_policy_brings_it_back_on_the_same_address(
    lab_config: Callable[..., DictConfig],
    log_dir: Path,
    wait_until: Callable[..., Any],
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    manager = start_manager(lab_config(restart={"max_restarts": 2, "backoff": "100ms"}))
    (listen,) = [instance.listen for instance in manager.instances_actual]
    host, _, port = listen.rpartition(":")

    def current() -> InstanceRecord:
        ((_, (record,)),) = run_records(log_dir)
        return record

    for attempt in (1, 2):
        old_pid = current().pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)

        def restarted(old_pid: int = old_pid) -> InstanceRecord | None:
            manager.check()  # raises if the restart failed
            record = current()
            return record if record.pid != old_pid and record.state == "ready" else None

        record = wait_until(restarted, 20, f"restart {attempt}")
        assert record.restart_count == attempt
        assert record.listen == listen
        # Said where the operator looks, once per restart, the signal by its name.
        said = [line for line in capsys.readouterr().out.splitlines() if "restarting" in line]
        assert said == [
            f"h2-ping-sidecar {host_name()}: nvcf killed by SIGKILL; restarting (attempt {attempt} of 2) "
            f"on {listen}"
        ]
        assert [instance.listen for instance in manager.instances_actual] == [listen]
        assert http11_request(host, int(port), "/echo").status == 200

        # The restarted proxy's new metrics port replaces the old one in Prometheus' targets.
        def listed(metrics: str | None = record.metrics) -> bool:
            targets = log_dir / "sidecar-fsm" / "prometheus" / f"{host_name()}.json"
            return [entry["targets"] for entry in json.loads(targets.read_text())] == [[metrics]]

        wait_until(listed, 10, "the target file to name the restarted proxy's metrics address")

    assert states_path(log_dir, record.id) == [
        "configured",
        "building",
        "spawned",
        "ready",
        "spawned",
        "ready",
        "spawned",
        "ready",
    ]
    assert [event for event, _ in history(log_dir, record.id)].count("restart") == 2
    # The policy is spent: the third death is a failure.
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    error = wait_until(failure_of(manager), 10, "check() to give up after max_restarts")
    assert "exited with code 137 (killed by SIGKILL)" in str(error)
    manager.stop()
    assert_nothing_left(log_dir)
