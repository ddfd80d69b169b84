"""A proxy that misbehaves under a live launcher: frozen at stop, killed mid-drain, never ready, dying.

The launcher is this test process (``NodeSidecars`` / ``start_h2_ping_sidecar``), the proxy the
real binary, faults real signals: SIGSTOP freezes a proxy the way a host under memory pressure
or a debugger does, SIGKILL ends one the way the OOM killer does. Each case checks what the user
sees (the error's first line), what the record says (state, exit code, history) and that no
process of the run is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import http11_request, wait_until
from launchrun import failure_of
from omegaconf import OmegaConf

from sidecar_fsm.base import procs
from sidecar_fsm.config import h2_ping_sidecar_config_from_global_config
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager, start_h2_ping_sidecar
from sidecar_fsm.run.messages import where
from sidecar_fsm.run.supervise import NodeSidecars
from sidecar_fsm.state.store import InstanceRecord, open_all_hosts

NO_UPSTREAM = "https://127.0.0.1:9"


def _block(
    log_dir: Path, names: tuple[str, ...], upstream: str = NO_UPSTREAM, **extra: Any
) -> dict[str, Any]:
    return {
        "enabled": True,
        "instances": [{"name": name, "upstream": upstream, "listen": "127.0.0.1:0"} for name in names],
        "log_dir": str(log_dir),
        **extra,
    }


def _sidecars(block: dict[str, Any], binary: Path, log_dir: Path) -> NodeSidecars:
    parsed = h2_ping_sidecar_config_from_global_config(OmegaConf.create({"sidecar": block}))
    return NodeSidecars(parsed, parsed.instances, str(binary), str(log_dir))


def _records(log_dir: Path) -> dict[str, tuple[InstanceRecord, list[tuple[str, str, str | None]]]]:
    """Each instance of the (one) run: its row and its history as (event, dest, detail)."""
    (store,) = open_all_hosts(log_dir)
    try:
        (run,) = store.list_runs("all")
        return {
            inst.name: (inst, [(row.event, row.dest, row.detail) for row in store.history(inst.id)])
            for inst in store.instances_of(run.run_id)
        }
    finally:
        store.close()


def _history_times(log_dir: Path) -> list[tuple[str, str, str | None, float]]:
    (store,) = open_all_hosts(log_dir)
    try:
        ((inst,),) = [store.instances_of(run.run_id) for run in store.list_runs("all")]
        return [(row.event, row.dest, row.detail, row.at) for row in store.history(inst.id)]
    finally:
        store.close()


def _assert_gone(log_dir: Path) -> None:
    for inst, _ in _records(log_dir).values():
        if inst.pid is not None and inst.pid_start_time is not None:
            assert not procs.is_ours(procs.ProcessIdentity(inst.pid, inst.pid_start_time, None)), inst.name
    assert list(log_dir.glob("*.ready")) == []


@pytest.fixture
def runs() -> Iterator[list[NodeSidecars]]:
    """NodeSidecars a test drives: stopped at the end whatever happened (idempotent)."""
    started: list[NodeSidecars] = []
    yield started
    for sidecars in started:
        sidecars.stop_slack_seconds = 0.5
        for child in sidecars.children:  # a frozen proxy would otherwise wait out its grace
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.process.pid, signal.SIGCONT)
        sidecars.stop()


def test_a_proxy_frozen_at_stop_is_killed_after_grace_and_slack(
    sidecar_binary: Path, log_dir: Path, runs: list[NodeSidecars]
) -> None:
    """SIGTERM cannot reach a stopped process; stop() must not wait for it beyond grace + slack."""
    sidecars = _sidecars(_block(log_dir, ("frozen", "healthy"), shutdown_grace="1s"), sidecar_binary, log_dir)
    runs.append(sidecars)
    sidecars.stop_slack_seconds = 0.5
    sidecars.start()
    frozen_pid = _records(log_dir)["frozen"][0].pid
    assert frozen_pid is not None
    os.kill(frozen_pid, signal.SIGSTOP)
    started = time.monotonic()
    sidecars.stop()
    took = time.monotonic() - started
    assert 1.5 <= took < 1.5 + 3, f"stop() took {took:.2f}s for grace 1s + slack 0.5s"
    records = _records(log_dir)
    frozen, frozen_history = records["frozen"]
    assert (frozen.state, frozen.exit_code) == ("failed", -signal.SIGKILL)
    assert frozen.error is not None
    assert frozen.error.splitlines()[0].endswith(
        f"killed after grace (shutdown_grace 1s); see {frozen.log_path}"
    )
    assert [event for event, _, _ in frozen_history][-2:] == ["drain", "fail"]
    healthy, _ = records["healthy"]
    assert (healthy.state, healthy.exit_code) == ("stopped", 0)  # drained alongside, not after
    _assert_gone(log_dir)


def test_a_proxy_killed_mid_drain_is_recorded_at_once(
    sidecar_binary: Path, tls_origin: TlsH2Origin, log_dir: Path, runs: list[NodeSidecars]
) -> None:
    """A drain holding a request for up to 30s; the OOM killer ends the proxy; stop() says so now."""
    block = _block(
        log_dir, ("policy",), tls_origin.url, shutdown_grace="30s", ca_file=str(tls_origin.ca_file)
    )
    sidecars = _sidecars(block, sidecar_binary, log_dir)
    runs.append(sidecars)
    sidecars.start()
    (listen,) = [instance.listen for instance in sidecars.instances_actual]
    host, _, port = listen.rpartition(":")
    answers: list[BaseException | int] = []

    def long_request() -> None:
        try:
            answers.append(http11_request(host, int(port), "/slow?first_byte=60", timeout=90).status)
        except Exception as error:  # the proxy dies under it: the connection is reset
            answers.append(error)

    client = threading.Thread(target=long_request, daemon=True)
    client.start()
    wait_until(lambda: tls_origin.active_streams >= 1, 10, "the request to reach the origin")
    stopping = threading.Thread(target=sidecars.stop, daemon=True)
    started = time.monotonic()
    stopping.start()
    record, _ = _records(log_dir)["policy"]
    assert record.log_path is not None
    wait_until(lambda: "draining for up to 30s" in Path(record.log_path).read_text(), 10, "the drain")
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    stopping.join(10)
    assert not stopping.is_alive(), "stop() kept waiting for a proxy that was killed"
    assert time.monotonic() - started < 10
    record, history = _records(log_dir)["policy"]
    assert (record.state, record.exit_code) == ("failed", -signal.SIGKILL)
    assert record.error is not None
    assert record.error.splitlines()[0].endswith(
        f"exited with code 137 (killed by SIGKILL) while draining; see {record.log_path}"
    )
    assert [dest for _, dest, _ in history] == ["building", "spawned", "ready", "draining", "failed"]
    client.join(10)
    assert answers and answers[0] != 200  # the client saw the proxy die, not an answer
    _assert_gone(log_dir)


def test_a_proxy_that_never_writes_its_ready_file_fails_within_startup_timeout(
    sidecar_binary: Path, log_dir: Path, tmp_path: Path, runs: list[NodeSidecars]
) -> None:
    """The real proxy, frozen before it runs (its wrapper stops itself first): one line, nothing left."""
    wrapper = tmp_path / "frozen-proxy"
    wrapper.write_text(f'#!/bin/sh\nkill -STOP $$\nexec "{sidecar_binary}" "$@"\n')
    wrapper.chmod(0o755)
    sidecars = _sidecars(_block(log_dir, ("policy",), startup_timeout_seconds=1), wrapper, log_dir)
    runs.append(sidecars)
    started = time.monotonic()
    with pytest.raises(SidecarError) as caught:
        sidecars.start()
    took = time.monotonic() - started
    assert 1.0 <= took < 1.0 + 4, f"start() took {took:.2f}s for startup_timeout_seconds 1"
    record, history = _records(log_dir)["policy"]
    first = str(caught.value).splitlines()[0]
    assert first == (
        f"{where('policy', sidecars.run_id, sidecars.host)}: not ready after 1s "
        f"(startup_timeout_seconds); raise it or see {record.log_path}"
    )
    assert (record.state, record.exit_code) == ("failed", -signal.SIGKILL)
    assert [dest for _, dest, _ in history] == ["building", "spawned", "failed"]
    _assert_gone(log_dir)


def test_a_proxy_dying_after_ready_is_restarted_with_backoff_then_failed(
    sidecar_binary: Path,
    log_dir: Path,
    tmp_path: Path,
    managers: list[H2PingSidecarManager],
) -> None:
    """max_restarts 2, backoff 500ms: two restarts on the same address, each after the backoff and
    on record with its attempt; the third death fails the instance and check() says so."""
    config = OmegaConf.create(
        {
            "cache_dir": str(tmp_path / "unused-cache"),
            "sidecar": {
                **_block(log_dir, ("policy",)),
                "binary": str(sidecar_binary),
                "restart": {"max_restarts": 2, "backoff": "500ms"},
            },
        }
    )
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    managers.append(manager)
    (listen,) = [instance.listen for instance in manager.instances_actual]
    check_error = failure_of(manager)

    for attempt in (1, 2, 3):
        record, _ = _records(log_dir)["policy"]
        assert record.pid is not None and record.state == "ready"
        killed_at = time.time()
        os.kill(record.pid, signal.SIGKILL)
        if attempt == 3:
            error = wait_until(check_error, 10, "check() to give up after max_restarts")
            break

        def restarted(old: int = record.pid) -> InstanceRecord | None:
            assert check_error() is None
            now, _ = _records(log_dir)["policy"]
            return now if now.pid != old and now.state == "ready" else None

        again = wait_until(restarted, 20, f"restart {attempt}")
        assert (again.restart_count, again.listen) == (attempt, listen)
        # The restart is committed only after the backoff (both times are the wall clock).
        restart_at = max(at for event, _, _, at in _history_times(log_dir) if event == "restart")
        assert restart_at - killed_at >= 0.5

    assert "exited with code 137 (killed by SIGKILL) unexpectedly" in str(error).splitlines()[1]
    record, history = _records(log_dir)["policy"]
    assert (record.state, record.exit_code, record.restart_count) == ("failed", -signal.SIGKILL, 2)
    restarts = [detail for event, _, detail in history if event == "restart"]
    assert len(restarts) == 2
    for attempt, detail in enumerate(restarts, 1):
        assert detail is not None and detail.startswith(f"killed by SIGKILL; attempt {attempt} of 2, pid ")
        assert detail.endswith(f" on {listen}")
    assert [dest for _, dest, _ in history] == [
        "building", "spawned", "ready", "spawned", "ready", "spawned", "ready", "failed",
    ]  # fmt: skip
    manager.stop()
    _assert_gone(log_dir)
