"""The launcher end to end: the real proxy, a real TLS HTTP/2 origin, real processes and database.

Each failure path checks the three promises of ``start_h2_ping_sidecar``: it raises a clear
error, no process of the run is left, and the caller's config is exactly what it was. A fake
"binary" (a shell script) stands in for the proxy only where the test is about our handling of
a child that misbehaves (exits early, never becomes ready); everything else runs the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from helpers import ProcessRegistry, http11_request
from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from sidecar_fsm import launcher
from sidecar_fsm.base import buildcache, procs
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.lab import IdleRelay, TlsH2Origin
from sidecar_fsm.launcher import (
    H2PingSidecarManager,
    NodeSidecars,
    h2_ping_sidecar_config_from_global_config,
    resolve_log_dir,
    start_h2_ping_sidecar,
)
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import InstanceRecord, Store, database_path, open_all_hosts

FULL_HISTORY = ["configured", "building", "spawned", "ready", "draining", "stopped"]


# --- helpers ---------------------------------------------------------------------------------


def gym_config(upstream: str, ca_file: Path, log_dir: Path, cache_dir: Path, **block: Any) -> DictConfig:
    """A config shaped like NeMo Gym's: servers under a top-level key, model URL via an alias."""
    sidecar = {
        "enabled": True,
        "instances": [{"name": "nvcf", "upstream": upstream, "listen": "127.0.0.1:0"}],
        "ping_interval": "250ms",
        "shutdown_grace": "5s",
        "startup_timeout_seconds": 20,
        "ca_file": str(ca_file),
    }
    sidecar.update(block)
    return OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "nemo_gym_log_dir": str(log_dir),
            "policy_base_url": upstream,
            "policy_model": {
                "responses_api_models": {
                    "openai_model": {
                        "entrypoint": "app.py",
                        "base_url": "${policy_base_url}",
                        "api_key": "sk-x",
                    }
                }
            },
            "sidecar": sidecar,
        }
    )


def snapshot(config: DictConfig) -> Any:
    return OmegaConf.to_container(config, resolve=False)


def run_records(log_dir: Path) -> list[tuple[Any, list[InstanceRecord]]]:
    out = []
    for store in open_all_hosts(log_dir):
        try:
            for run in store.list_runs("all"):
                out.append((run, store.instances_of(run.run_id)))
        finally:
            store.close()
    return out


def history(log_dir: Path, instance_id: int) -> list[tuple[str, str]]:
    (store,) = open_all_hosts(log_dir)
    try:
        return [(row.event, row.dest) for row in store.history(instance_id)]
    finally:
        store.close()


def states_path(log_dir: Path, instance_id: int) -> list[str]:
    rows = history(log_dir, instance_id)
    return ["configured"] + [dest for _, dest in rows]


def assert_nothing_left(log_dir: Path) -> None:
    """No run of ``log_dir`` is live, no recorded sidecar still runs, no child of ours remains,
    and no ready file or proxy temp file is left behind."""
    assert sorted(path.name for path in log_dir.glob("*.ready*")) == []
    assert sorted(path.name for path in log_dir.glob(".*.tmp*")) == []
    for run, instances in run_records(log_dir):
        assert run.ended_at is not None, f"run {run.run_id} not ended"
        for record in instances:
            assert record.state in ("stopped", "failed"), (record.name, record.state)
            if record.pid is not None and record.pid_start_time is not None:
                identity = procs.ProcessIdentity(record.pid, record.pid_start_time, None)
                assert not procs.is_ours(identity), f"{record.name} pid {record.pid} still runs"
    mine = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.status() != psutil.STATUS_ZOMBIE and str(log_dir) in " ".join(_cmdline(child))
    ]
    assert mine == []
    assert list(log_dir.glob("*.ready")) == []


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


# What sidecar-fsm's proxy prints for -h (Go's flag usage), trimmed: a user-named binary is asked
# for its flags before anything starts (binaryflags), so a stand-in answers as the real one does.
_OUR_USAGE = "\n".join(
    f"  -{flag}\n    \t{usage}"
    for flag, usage in (
        ("ca-file path", "extra PEM root certificates for the upstream (path)"),
        ("exit-with-pid pid", "drain and exit when the process with this pid is gone"),
        ("insecure-skip-verify", "skip upstream certificate verification (tests only)"),
        ("listen host:port", "host:port to serve HTTP/1.1 on"),
        ("max-conn-age duration", "move new requests to a fresh connection"),
        ("metrics-listen host:port", "serve GET /metrics on this loopback host:port"),
        ("ping-interval duration", "send a PING after this read-idle duration"),
        ("ping-timeout duration", "close a connection whose PING is unanswered"),
        ("ready-file path", 'write {"pid","listen"} JSON to this path once bound'),
        ("retry-body-limit bytes", "buffer request bodies up to this many bytes"),
        ("shutdown-grace duration", "drain in-flight requests for up to this duration"),
        ("upstream https://host[:port]", "upstream origin https://host[:port]"),
    )
)


def fake_binary(path: Path, body: str) -> Path:
    """A shell stand-in for the proxy running ``body``; ``-h`` answers with our proxy's flags."""
    answer_help = f"if [ \"$1\" = -h ]; then cat >&2 <<'EOF'\n{_OUR_USAGE}\nEOF\nexit 0; fi\n"
    path.write_text("#!/bin/sh\n" + answer_help + body + "\n")
    path.chmod(0o755)
    return path


def failure_of(manager: H2PingSidecarManager) -> Callable[[], SidecarError | None]:
    def probe() -> SidecarError | None:
        try:
            manager.check()
        except SidecarError as error:
            return error
        return None

    return probe


@pytest.fixture
def node_run(
    tls_origin: TlsH2Origin, sidecar_binary: Path, log_dir: Path, cache_dir: Path
) -> Iterator[Callable[..., NodeSidecars]]:
    """Factory: ``node_run(binary=None, run_id=None, store=None, logs=None, **block)`` → a ``NodeSidecars``.

    Not started: a test drives it directly. Its config is ``gym_config`` on the lab origin with
    ``block`` over the sidecar defaults; ``binary`` None is the real proxy, ``logs`` None the
    test's ``log_dir``. Each run is stopped at the end whatever happened (``stop()`` is idempotent).
    """
    runs: list[NodeSidecars] = []

    def make(
        binary: Path | None = None,
        *,
        run_id: str | None = None,
        store: Store | None = None,
        logs: Path | None = None,
        **block: Any,
    ) -> NodeSidecars:
        logs = log_dir if logs is None else logs
        config = gym_config(tls_origin.url, tls_origin.ca_file, logs, cache_dir, **block)
        parsed = h2_ping_sidecar_config_from_global_config(config)
        run = NodeSidecars(
            parsed, parsed.instances, str(binary or sidecar_binary), str(logs), store=store, run_id=run_id
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop_slack_seconds = 0.5
        run.stop()


# A proxy stand-in that gets ready, then ignores SIGTERM: only SIGKILL ends it.
_LISTEN_THEN_READY = f"""exec "{sys.executable}" -c '
import json, os, socket, sys, time
host, _, port = sys.argv[2].rpartition(":")
sock = socket.socket()
sock.bind((host, int(port)))
sock.listen()
with open(sys.argv[1] + ".tmp", "w") as file:
    json.dump({{"pid": os.getpid(), "listen": "%s:%d" % sock.getsockname()}}, file)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
' "$ready" "$listen"
"""

# Ignores SIGTERM, and listens where its ready file says (a ready file naming an address the
# child does not listen on is refused at start).
_READY_BUT_DEAF = (
    """
trap '' TERM
while [ $# -gt 0 ]; do
  case "$1" in -ready-file) ready="$2";; -listen) listen="$2";; esac
  shift
done
"""
    + _LISTEN_THEN_READY
)


@pytest.fixture
def deaf_sidecar(
    node_run: Callable[..., NodeSidecars], tls_origin: TlsH2Origin, tmp_path: Path
) -> Callable[[str], NodeSidecars]:
    """Factory: ``deaf_sidecar(shutdown_grace)`` → a started run of one instance that ignores SIGTERM."""
    binary = fake_binary(tmp_path / "deaf", _READY_BUT_DEAF)

    def make(shutdown_grace: str) -> NodeSidecars:
        instances = [{"name": "deaf", "upstream": tls_origin.url, "listen": "127.0.0.1:0"}]
        run = node_run(binary, shutdown_grace=shutdown_grace, instances=instances)
        run.start()
        return run

    return make


async def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes, float]:
    started = time.monotonic()
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(timeout=client_timeout) as session,
        session.post(url, json=body) as response,
    ):
        payload = await response.read()
        return response.status, payload, time.monotonic() - started


# --- the main job ----------------------------------------------------------------------------


def test_end_to_end_as_gym_does_it(
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., IdleRelay],
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    wait_until: Callable[..., Any],
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
            _post(f"{base_url}/slow?first_byte={wait:g}", {"input": "hi"}, timeout=wait + 20)
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
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    managers: list[H2PingSidecarManager],
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
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    managers.append(manager)
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
    + _LISTEN_THEN_READY
)


def test_instances_start_together_not_one_after_another(
    tls_origin: TlsH2Origin, log_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """Three children that each take 1 s to get ready: one startup in total, not three."""
    binary = fake_binary(tmp_path / "slow-ready", _SLOW_BUT_READY)
    config = gym_config(
        tls_origin.url,
        tls_origin.ca_file,
        log_dir,
        cache_dir,
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


# --- failure paths ---------------------------------------------------------------------------


def test_invalid_config_starts_nothing(
    tls_origin: TlsH2Origin, cache_dir: Path, log_dir: Path, sidecar_binary: Path
) -> None:
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir, ping_interval="6m")
    before = snapshot(config)
    with pytest.raises(ValidationError, match=r"sidecar\.ping_interval: '6m'"):
        start_h2_ping_sidecar(config)
    assert snapshot(config) == before
    assert run_records(log_dir) == []
    assert_nothing_left(log_dir)


def test_missing_go_and_no_prebuilt(
    tls_origin: TlsH2Origin, log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(buildcache, "find_go", lambda: None)
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, tmp_path / "empty-cache")
    before = snapshot(config)
    with pytest.raises(SidecarError, match="no Go toolchain and no prebuilt h2-ping-sidecar"):
        start_h2_ping_sidecar(config)
    assert snapshot(config) == before
    assert run_records(log_dir) == []


def test_manager_starts_again_after_stop_and_after_a_failed_start(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    managers: list[H2PingSidecarManager],
) -> None:
    """As NeMo Gym's can: each start() after stop() or a failure is a new run."""

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        instances = [{"name": "nvcf", "upstream": tls_origin.url, "listen": f"127.0.0.1:{port}"}]
        config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir, instances=instances)
        parsed = h2_ping_sidecar_config_from_global_config(config)
        manager = H2PingSidecarManager(
            parsed, parsed.instances, sidecar_binary, resolve_log_dir(parsed, config)
        )
        managers.append(manager)
        with pytest.raises(SidecarError, match="already in use"):
            manager.start()  # the port is taken: a failed start
    failed_run = manager.run_id
    manager.start()  # the port is free now
    with pytest.raises(SidecarError, match="already running; call stop"):
        manager.start()
    manager.check()
    first_run = manager.run_id
    manager.stop()
    manager.start()
    manager.check()
    manager.stop()
    runs = {
        run.run_id: (run.outcome, [record.state for record in records])
        for run, records in run_records(log_dir)
    }
    assert len({failed_run, first_run, manager.run_id}) == 3
    assert runs == {
        failed_run: ("failed", ["failed"]),
        first_run: ("ended", ["stopped"]),
        manager.run_id: ("ended", ["stopped"]),
    }
    assert_nothing_left(log_dir)


def test_port_in_use_names_the_holder(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    managers: list[H2PingSidecarManager],
) -> None:
    # Held by a process the database does not know.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = gym_config(
            tls_origin.url,
            tls_origin.ca_file,
            log_dir,
            cache_dir,
            instances=[{"name": "nvcf", "upstream": tls_origin.url, "listen": f"127.0.0.1:{port}"}],
        )
        before = snapshot(config)
        with pytest.raises(SidecarError) as caught:
            start_h2_ping_sidecar(config)
    first_line = str(caught.value).splitlines()[0]
    assert first_line == (
        f"sidecar.instances[0].listen: '127.0.0.1:{port}' is already in use by another process; "
        "stop it or choose another port (or port 0)"
    )
    # The first line is ours; the proxy's own words follow in the log tail, as under Gym.
    assert str(caught.value).count("\n") >= 1 and "address already in use" in str(caught.value)
    assert snapshot(config) == before
    assert_nothing_left(log_dir)

    # Held by a run the database knows: the error names that run and instance.
    holder_config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir)
    holder_manager = start_h2_ping_sidecar(holder_config)
    assert holder_manager is not None
    managers.append(holder_manager)
    (taken,) = [instance.listen for instance in holder_manager.instances_actual]
    clash = gym_config(
        tls_origin.url,
        tls_origin.ca_file,
        log_dir,
        cache_dir,
        instances=[{"name": "second", "upstream": tls_origin.url, "listen": taken}],
    )
    before = snapshot(clash)
    with pytest.raises(SidecarError) as caught:
        start_h2_ping_sidecar(clash)
    assert f"is already in use by run {holder_manager.run_id} instance 'nvcf'" in str(caught.value)
    assert snapshot(clash) == before
    holder_manager.check()  # the holder is unharmed


def test_child_exits_before_ready(
    tls_origin: TlsH2Origin, log_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    binary = fake_binary(tmp_path / "early-exit", 'echo "fatal: upstream refused us" >&2\nexit 3')
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir, binary=str(binary))
    before = snapshot(config)
    with pytest.raises(SidecarError) as caught:
        start_h2_ping_sidecar(config)
    message = str(caught.value)
    assert "h2-ping-sidecar 'nvcf'" in message
    assert "exited with code 3 before it was ready" in message.splitlines()[0]
    assert "fatal: upstream refused us" in message
    assert snapshot(config) == before
    ((run, (record,)),) = run_records(log_dir)
    assert (run.outcome, record.state, record.exit_code) == ("failed", "failed", 3)
    assert states_path(log_dir, record.id) == ["configured", "building", "spawned", "failed"]
    assert_nothing_left(log_dir)


def test_startup_timeout(tls_origin: TlsH2Origin, log_dir: Path, tmp_path: Path, cache_dir: Path) -> None:
    # Never writes its ready file: what a proxy stuck before binding looks like to us.
    binary = fake_binary(tmp_path / "never-ready", "echo starting\nexec sleep 60")
    config = gym_config(
        tls_origin.url,
        tls_origin.ca_file,
        log_dir,
        cache_dir,
        binary=str(binary),
        startup_timeout_seconds=0.5,
    )
    before = snapshot(config)
    started = time.monotonic()
    with pytest.raises(SidecarError, match=r"not ready after 0\.5s \(startup_timeout_seconds\)") as caught:
        start_h2_ping_sidecar(config)
    assert time.monotonic() - started < 10
    assert "starting" in str(caught.value)
    assert snapshot(config) == before
    ((_, (record,)),) = run_records(log_dir)
    assert record.state == "failed"
    assert record.exit_code == -signal.SIGKILL
    assert_nothing_left(log_dir)


def test_stale_ready_file_is_not_readiness(
    log_dir: Path, tmp_path: Path, node_run: Callable[..., NodeSidecars]
) -> None:
    binary = fake_binary(tmp_path / "never-ready", "exec sleep 60")
    sidecars = node_run(binary, run_id="stale0000000", startup_timeout_seconds=0.3)
    stale = log_dir / f"h2ping-nvcf-{socket.gethostname()}-stale0000000.ready"
    stale.write_text(json.dumps({"pid": os.getpid(), "listen": "127.0.0.1:9"}))
    with pytest.raises(SidecarError, match="not ready after"):
        sidecars.start()
    assert_nothing_left(log_dir)


def test_unwritable_log_fails_the_start_naming_it_and_leaves_nothing(
    tls_origin: TlsH2Origin, log_dir: Path, node_run: Callable[..., NodeSidecars]
) -> None:

    instances = [
        {"name": "first", "upstream": tls_origin.url, "listen": "127.0.0.1:0"},
        {"name": "second", "upstream": tls_origin.url, "listen": "127.0.0.1:0"},
    ]
    sidecars = node_run(run_id="nolog0000000", instances=instances)
    # A directory where the second instance's log must go: creating it fails.
    blocked = log_dir / f"h2ping-second-{host_name()}-nolog0000000.log"
    blocked.mkdir(parents=True)
    with pytest.raises(SidecarError) as raised:
        sidecars.start()
    assert str(raised.value) == (
        f"sidecar.log_dir: cannot create '{blocked}' (file exists); set sidecar.log_dir to a writable folder"
    )
    assert_nothing_left(log_dir)
    assert run_records(log_dir) == []  # no run row: nothing was started
    assert [path for path in log_dir.glob("*.log") if path.is_file()] == []  # the first log went too


@pytest.mark.parametrize("fault", ["read-only file system", "no space left on device"])
def test_log_dir_that_breaks_after_the_database_opened_fails_in_one_line(
    make_tmpfs: Callable[..., Path], node_run: Callable[..., NodeSidecars], fault: str
) -> None:
    """A long-lived launcher keeps its database open; the log dir then turns read-only or fills up."""
    small_tmpfs = make_tmpfs("2m", options="nr_inodes=64")  # 64 inodes: a full log dir is a loop away

    log_dir = small_tmpfs / "logs"
    store = Store.open(str(log_dir))
    try:
        if fault == "read-only file system":
            # A read-only bind mount over the log dir: the open database keeps its descriptors
            # (a tmpfs will not turn read-only while a file is open for writing).
            subprocess.run(["mount", "--bind", str(log_dir), str(log_dir)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(log_dir)], check=True)
        else:
            for index in range(1000):  # bounded: the tmpfs has 64 inodes
                try:
                    (small_tmpfs / f"filler-{index}").touch()
                except OSError:
                    break
        sidecars = node_run(store=store, logs=log_dir)
        with pytest.raises(SidecarError) as raised:
            sidecars.start()
        message = str(raised.value)
        assert "\n" not in message
        assert (
            message.startswith(f"sidecar.log_dir: cannot create '{log_dir}/h2ping-")
            and f"({fault})" in message
        )
        assert store.list_runs("all") == []
        assert list(log_dir.glob("*.log")) == [] and list(log_dir.glob("*.ready*")) == []
        assert not [
            child
            for child in psutil.Process().children(recursive=True)
            if str(log_dir) in " ".join(_cmdline(child))
        ]
    finally:
        store.close()
        if fault == "read-only file system":
            subprocess.run(["umount", str(log_dir)], check=False)


_INTERRUPTED_START = """
import json, sys
from omegaconf import OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
config = OmegaConf.create(json.loads(sys.argv[1]))
before = OmegaConf.to_container(config)
try:
    start_h2_ping_sidecar(config)
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "unchanged": OmegaConf.to_container(config) == before}))
    sys.exit(130)
print(json.dumps({"interrupted": False}))
"""


def test_keyboard_interrupt_during_start_stops_the_child(
    tls_origin: TlsH2Origin,
    log_dir: Path,
    tmp_path: Path,
    cache_dir: Path,
    process_registry: ProcessRegistry,
    wait_until: Callable[..., Any],
) -> None:
    pid_file = tmp_path / "child.pid"
    binary = fake_binary(tmp_path / "slow-start", f'echo $$ > "{pid_file}"\nexec sleep 60')
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir, binary=str(binary))
    launcher = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_START, json.dumps(OmegaConf.to_container(config))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process_registry.add(launcher)
    child_pid = int(
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "fake child pid")
    )
    process_registry.add_pid(child_pid)
    child = psutil.Process(child_pid)
    os.kill(launcher.pid, signal.SIGINT)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, err
    assert json.loads(out.strip().splitlines()[-1]) == {"interrupted": True, "unchanged": True}
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    ((run, (record,)),) = run_records(log_dir)
    assert run.ended_at is not None
    assert record.state == "stopped"
    assert states_path(log_dir, record.id) == ["configured", "building", "spawned", "draining", "stopped"]
    assert_nothing_left(log_dir)


def test_keyboard_interrupt_after_the_proxy_is_ready(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupt while the config is being rewritten: the ready proxy is stopped, config untouched."""

    calls: list[int] = []
    real = launcher.rewrite_base_urls

    def interrupt_the_second(config: DictConfig, instances: Any) -> Any:
        # The first call is the dry run on a copy, before any process; the second one runs
        # once the proxy is ready.
        calls.append(1)
        if len(calls) == 1:
            return real(config, instances)
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "rewrite_base_urls", interrupt_the_second)
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir)
    before = snapshot(config)
    with pytest.raises(KeyboardInterrupt):
        start_h2_ping_sidecar(config)
    assert calls == [1, 1]
    assert snapshot(config) == before
    ((_, (record,)),) = run_records(log_dir)
    assert states_path(log_dir, record.id) == FULL_HISTORY
    assert_nothing_left(log_dir)


def test_killed_sidecar_is_reported_with_exit_code_and_log(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    wait_until: Callable[..., Any],
    managers: list[H2PingSidecarManager],
) -> None:
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir)
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    managers.append(manager)
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
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    wait_until: Callable[..., Any],
    managers: list[H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = gym_config(
        tls_origin.url,
        tls_origin.ca_file,
        log_dir,
        cache_dir,
        restart={"max_restarts": 2, "backoff": "100ms"},
    )
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    managers.append(manager)
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


# --- many runs at once -----------------------------------------------------------------------

_CONCURRENT_RUN = """
import json, sys, time
from omegaconf import OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
config = OmegaConf.create(json.loads(sys.argv[1]))
started = time.monotonic()
manager = start_h2_ping_sidecar(config)
took = time.monotonic() - started
print("RESULT " + json.dumps({"run_id": manager.run_id, "took": took,
      "listens": [i.listen for i in manager.instances_actual],
      "base_url": config.policy_model.responses_api_models.openai_model.base_url}), flush=True)
sys.stdin.read()
manager.stop()
"""


def test_eight_runs_on_a_cold_shared_cache_build_once(
    tls_origin: TlsH2Origin,
    go_tool: Path,
    sidecar_binary: Path,
    log_dir: Path,
    tmp_path: Path,
    process_registry: ProcessRegistry,
) -> None:
    # A `go` that counts builds, first on PATH, so every run finds it before the venv's.
    counter = tmp_path / "builds.log"
    wrapper_dir = tmp_path / "gobin"
    wrapper_dir.mkdir()
    fake_binary(
        wrapper_dir / "go",
        f'if [ "$1" = build ]; then echo "$$ $*" >> "{counter}"; fi\nexec "{go_tool}" "$@"',
    )
    cold_cache = tmp_path / "cold-cache"
    env = dict(os.environ, PATH=f"{wrapper_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cold_cache, startup_timeout_seconds=60)
    payload = json.dumps(OmegaConf.to_container(config))
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT_RUN, payload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(8)
    ]
    for run in runs:
        process_registry.add(run)
    results = []
    for run in runs:
        assert run.stdout is not None
        for line in run.stdout:
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT ") :]))
                break
        else:
            run.wait(30)
            pytest.fail(
                f"run exited {run.returncode} without starting:\n{run.stderr.read() if run.stderr else ''}"
            )

    assert counter.read_text().count("\n") == 1
    binaries = {path for path in cold_cache.rglob("h2-ping-sidecar") if path.is_file()}
    assert len(binaries) == 1
    (binary,) = binaries
    leftovers = [path.name for path in binary.parent.iterdir() if path.name != binary.name]
    assert not [name for name in leftovers if "build" in name or "tmp" in name], leftovers
    records = [(run, instances) for run, instances in run_records(log_dir)]
    assert len(records) == 8
    for _, (record,) in records:
        assert record.state == "ready"
        assert record.binary == str(binary)
    listens = {listen for result in results for listen in result["listens"]}
    assert len(listens) == 8
    for result in results:
        host, _, port = result["listens"][0].rpartition(":")
        assert http11_request(host, int(port), "/echo").status == 200

    for run in runs:
        assert run.stdin is not None
        run.stdin.close()
    for run in runs:
        assert run.wait(30) == 0, run.stderr.read() if run.stderr else ""
    assert {record.state for _, (record,) in run_records(log_dir)} == {"stopped"}
    assert_nothing_left(log_dir)


def test_store_is_per_host_under_the_log_dir(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
    managers: list[H2PingSidecarManager],
) -> None:
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir)
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    managers.append(manager)
    assert manager.log_dir == str(log_dir)
    store = Store.open(log_dir)
    try:
        run = store.get_run(manager.run_id or "")
        assert run is not None and run.owner_pid == os.getpid()
        (record,) = store.instances_of(run.run_id)
        assert record.log_path == str(log_dir / f"h2ping-nvcf-{socket.gethostname()}-{run.run_id}.log")
        assert record.ready_path is not None and Path(record.ready_path).exists()
    finally:
        store.close()
    manager.stop()
    assert not Path(record.ready_path).exists()


@pytest.mark.parametrize("allow", [False, True])
def test_a_listen_off_loopback_runs_with_gyms_warning_unless_allowed(
    allow: bool,
    tls_origin: TlsH2Origin,
    cache_dir: Path,
    log_dir: Path,
    managers: list[H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Gym config with a non-loopback listen runs here as it runs under Gym, with Gym's
    warning on stdout; allow_non_loopback (ours) says it is meant and silences it."""
    instances = [{"name": "wide", "upstream": tls_origin.url, "listen": "0.0.0.0:0"}]
    config = gym_config(
        tls_origin.url, tls_origin.ca_file, log_dir, cache_dir, instances=instances, allow_non_loopback=allow
    )
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    managers.append(manager)
    printed = capsys.readouterr().out
    assert ("not a loopback address" in printed) is not allow, printed
    (listen,) = [instance.listen for instance in manager.instances_actual]
    port = int(listen.rsplit(":", 1)[1])
    assert http11_request("127.0.0.1", port, "/echo").status == 200
