"""The launcher's main job end to end: the real proxy, a real TLS HTTP/2 origin, real processes and
database, as NeMo Gym drives it (start, requests, stop), with ports picked by the kernel, instances
started together, every launch recorded before the next, and a stop that ends what outlives its
grace. A start that fails or is interrupted is in ``test_start_failures.py``, a sidecar that dies
in ``test_restart.py``, many runs at once in ``test_concurrent_runs.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import http11_request
from launchrun import (
    FULL_HISTORY,
    LISTEN_THEN_READY,
    assert_nothing_left,
    fake_binary,
    gym_config,
    post_json,
    run_records,
    states_path,
)
from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.base import procs
from sidecar_fsm.lab import IdleRelay, TlsH2Origin
from sidecar_fsm.launcher import (
    H2PingSidecarManager,
    NodeSidecars,
    start_h2_ping_sidecar,
)
from sidecar_fsm.state.store import database_path

# --- the main job ----------------------------------------------------------------------------


def test_end_to_end_as_gym_does_it(
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., IdleRelay],
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
) -> None:
    idle = 1.0
    relay = idle_relay(tls_origin, idle=idle)
    upstream = f"https://localhost:{relay.port}"
    config = gym_config(upstream, tls_origin.ca_file, log_dir, cache_dir)
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    try:
        (listen,) = [instance.listen for instance in manager.instances_actual]
        assert not listen.endswith(":0")
        # Gym hands the servers a serialized config: the rewrite must survive that.
        served = OmegaConf.create(OmegaConf.to_yaml(config))
        base_url = served.policy_model.responses_api_models.openai_model.base_url
        assert base_url == f"http://{listen}"
        assert config.policy_base_url == upstream  # the alias target is left as it was

        wait = 3 * idle
        status, payload, took = asyncio.run(
            post_json(f"{base_url}/slow?first_byte={wait:g}", {"input": "hi"}, timeout=wait + 20)
        )
        assert status == 200, payload[:300]
        assert payload.startswith(b"slow: first byte after 3s")
        assert took >= wait
        assert tls_origin.pings >= 1
        manager.check()
    finally:
        manager.stop()
    manager.stop()  # idempotent

    ((run, (record,)),) = run_records(log_dir)
    assert run.outcome == "ended"
    assert record.state == "stopped"
    assert record.exit_code == 0
    assert states_path(log_dir, record.id) == FULL_HISTORY
    assert "sk-x" not in json.dumps(run.config_summary)
    assert_nothing_left(log_dir)


def test_port_zero_instances_get_distinct_ports_and_urls(
    make_tls_origin: Callable[..., TlsH2Origin],
    cache_dir: Path,
    log_dir: Path,
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> None:
    first, second = make_tls_origin(), make_tls_origin()
    config = gym_config(
        first.url,
        first.ca_file,
        log_dir,
        cache_dir,
        instances=[
            {"name": "policy", "upstream": first.url, "listen": "127.0.0.1:0"},
            {"name": "judge", "upstream": second.url, "listen": "127.0.0.1:0"},
        ],
    )
    config.judge_model = {"responses_api_models": {"judge": {"base_url": [f"{second.url}/echo"]}}}
    manager = start_manager(config)
    listens = [instance.listen for instance in manager.instances_actual]
    ports = {int(listen.rpartition(":")[2]) for listen in listens}
    assert len(ports) == 2 and 0 not in ports
    assert config.policy_model.responses_api_models.openai_model.base_url == f"http://{listens[0]}"
    assert list(config.judge_model.responses_api_models.judge.base_url) == [f"http://{listens[1]}/echo"]
    for listen, origin in ((listens[0], first), (listens[1], second)):
        host, _, port = listen.rpartition(":")
        response = http11_request(host, int(port), "/echo?x=1")
        assert response.status == 200
        assert json.loads(response.body)["authority"] == f"localhost:{origin.port}"
    # Both were awaited together: one run, both ready, the bound addresses recorded.
    ((run, records),) = run_records(log_dir)
    assert [record.listen for record in records] == listens
    assert [record.state for record in records] == ["ready", "ready"]


# The tail of a shell stand-in that has read "$ready" and "$listen": become (exec, same pid) a
# Python process that binds the listen address and names it in the ready file, as the proxy
# does; a ready file naming a port its writer does not listen on is refused.

_SLOW_BUT_READY = (
    """
while [ $# -gt 0 ]; do
  case "$1" in -ready-file) ready="$2";; -listen) listen="$2";; esac
  shift
done
sleep 1
"""
    + LISTEN_THEN_READY
)


def test_instances_start_together_not_one_after_another(
    tls_origin: TlsH2Origin, lab_config: Callable[..., DictConfig], log_dir: Path, tmp_path: Path
) -> None:
    """Three children that each take 1 s to get ready: one startup in total, not three."""
    binary = fake_binary(tmp_path / "slow-ready", _SLOW_BUT_READY)
    config = lab_config(
        binary=str(binary),
        instances=[
            {"name": f"i{index}", "upstream": tls_origin.url, "listen": "127.0.0.1:0"} for index in range(3)
        ],
    )
    started = time.monotonic()
    manager = start_h2_ping_sidecar(config)
    took = time.monotonic() - started
    assert manager is not None
    try:
        assert 1.0 <= took < 2.5, took  # one after another would be 3 s or more
        listens = [instance.listen for instance in manager.instances_actual]
        assert len(set(listens)) == 3 and not any(listen.endswith(":0") for listen in listens)
    finally:
        manager.stop()
    assert {record.state for _, records in run_records(log_dir) for record in records} == {"stopped"}
    assert_nothing_left(log_dir)


def test_stop_removes_the_temp_file_of_a_proxy_that_died_writing_its_ready_file(
    log_dir: Path, node_run: Callable[..., NodeSidecars]
) -> None:
    """The launcher prepares no temp file; the proxy's own (``.<ready>.tmp-<random>``) goes at stop()."""

    sidecars = node_run()
    sidecars.start()
    assert list(log_dir.glob(".*.tmp*")) == []  # renamed into place by the proxy
    ((_, (record,)),) = run_records(log_dir)
    assert record.ready_path is not None
    ready_path = Path(record.ready_path)
    leftover = ready_path.with_name(f".{ready_path.name}.tmp-1234567")
    leftover.write_text('{"pid": 1')
    sidecars.stop()
    assert not leftover.exists()
    assert_nothing_left(log_dir)


def test_each_launch_is_recorded_with_its_pid_before_the_next_launch(
    tls_origin: TlsH2Origin,
    log_dir: Path,
    node_run: Callable[..., NodeSidecars],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A launcher killed between two launches leaves every running sidecar on record with its pid.

    What the database holds at the moment of each launch is read through a second connection
    just before the real ``procs.spawn`` runs.
    """

    seen: list[list[tuple[str, str, int | None]]] = []
    real_spawn = procs.spawn

    def spawn_seeing_the_database(*args: Any, **kwargs: Any) -> Any:
        with contextlib.closing(sqlite3.connect(f"file:{database_path(log_dir)}?mode=ro", uri=True)) as db:
            seen.append(db.execute("SELECT name, state, pid FROM instances ORDER BY id").fetchall())
        return real_spawn(*args, **kwargs)

    monkeypatch.setattr(procs, "spawn", spawn_seeing_the_database)
    instances = [
        {"name": name, "upstream": tls_origin.url, "listen": "127.0.0.1:0"}
        for name in ("first", "second", "third")
    ]
    sidecars = node_run(instances=instances)
    sidecars.start()
    ((_, records),) = run_records(log_dir)
    assert len(seen) == 3 and all(record.pid for record in records)
    for index, rows in enumerate(seen):
        earlier = [(record.name, "spawned", record.pid) for record in records[:index]]
        assert rows[:index] == earlier, (
            f"{records[index].name} launched before its predecessors were recorded"
        )
        assert rows[index] == (records[index].name, "configured", None)
    sidecars.stop()
    assert_nothing_left(log_dir)


def test_stop_kills_what_outlives_the_grace(
    log_dir: Path, deaf_sidecar: Callable[[str], NodeSidecars]
) -> None:
    """A child that ignores SIGTERM: SIGKILL after grace + slack, and the record says so."""

    sidecars = deaf_sidecar("0s")
    sidecars.stop_slack_seconds = 0.3
    started = time.monotonic()
    sidecars.stop()
    assert 0.3 <= time.monotonic() - started < 5
    ((run, (record,)),) = run_records(log_dir)
    assert (run.outcome, record.state, record.exit_code) == ("failed", "failed", -signal.SIGKILL)
    assert record.error is not None and "killed after grace (shutdown_grace 0s)" in record.error
    assert states_path(log_dir, record.id)[-2:] == ["draining", "failed"]
    sidecars.stop()  # idempotent
    assert_nothing_left(log_dir)


def test_interrupt_during_stop_kills_the_rest_then_propagates(
    log_dir: Path, deaf_sidecar: Callable[[str], NodeSidecars]
) -> None:
    sidecars = deaf_sidecar("30s")

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # a Ctrl-C while stop() waits for the drain
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            sidecars.stop()
        assert time.monotonic() - started < 10
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    ((run, (record,)),) = run_records(log_dir)
    assert (run.outcome, record.state, record.exit_code) == ("failed", "failed", -signal.SIGKILL)
    assert record.error is not None and "interrupted during drain" in record.error
    assert_nothing_left(log_dir)


@pytest.mark.parametrize("allow", [False, True])
def test_a_listen_off_loopback_runs_with_gyms_warning_unless_allowed(
    allow: bool,
    tls_origin: TlsH2Origin,
    lab_config: Callable[..., DictConfig],
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Gym config with a non-loopback listen runs here as it runs under Gym, with Gym's
    warning on stdout; allow_non_loopback (ours) says it is meant and silences it."""
    instances = [{"name": "wide", "upstream": tls_origin.url, "listen": "0.0.0.0:0"}]
    manager = start_manager(lab_config(instances=instances, allow_non_loopback=allow))
    printed = capsys.readouterr().out
    assert ("not a loopback address" in printed) is not allow, printed
    (listen,) = [instance.listen for instance in manager.instances_actual]
    port = int(listen.rsplit(":", 1)[1])
    assert http11_request("127.0.0.1", port, "/echo").status == 200
