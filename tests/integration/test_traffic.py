"""Traffic figures end to end: the real proxy writes them, the launcher brings them in.

The real Go binary, the lab's TLS HTTP/2 origin (and one that offers only HTTP/1.1, so its
requests are 502s of kind ``alpn``), real processes and signals and a real SQLite file read
through ``traffic_summary``: a normal stop, a launcher killed with SIGKILL whose sidecars exit by
themselves then ``reap``, a proxy killed with SIGKILL, a restart, a corrupt traffic file. The
figures never hold a header, a query string or userinfo.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clirun import StartedCli, cli_json
from helpers import http11_request, sidecar_cli, wait_until
from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.lab import CertPaths, TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager
from sidecar_fsm.run import traffic
from sidecar_fsm.state import query
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, open_all_hosts

SECRET_QUERY = "token=s3cr3t-query"
SECRET_HEADER = ("Authorization", "Bearer sk-s3cr3t-header")


def summary(log_dir: Path) -> dict[str, dict[str, Any]]:
    """``traffic_summary`` of every host, by instance name."""
    result = query.run_query(log_dir, "SELECT * FROM traffic_summary")
    return {row[2]: dict(zip(result.columns, row, strict=True)) for row in result.rows}


def send(listen: str, path: str, count: int, **kwargs: Any) -> list[int]:
    host, _, port = listen.rpartition(":")
    return [http11_request(host, int(port), path, timeout=15, **kwargs).status for _ in range(count)]


@pytest.fixture
def start_instances(
    lab_certs: CertPaths,
    log_dir: Path,
    cache_dir: Path,
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> Callable[..., H2PingSidecarManager]:
    """Factory: ``start_instances(instances, **block)`` → ``start_manager`` of a config of those
    instances trusting the lab CA, logging to ``log_dir``, ``upstream_check`` off."""

    def start(instances: list[dict[str, Any]], **block: Any) -> H2PingSidecarManager:
        config = OmegaConf.create(
            {
                "cache_dir": str(cache_dir),
                "nemo_gym_log_dir": str(log_dir),
                "sidecar": {
                    "enabled": True,
                    "instances": instances,
                    "ca_file": str(lab_certs.ca_pem),
                    "shutdown_grace": "5s",
                    "upstream_check": "off",
                    **block,
                },
            }
        )
        return start_manager(config)

    return start


def test_a_stop_gives_final_figures_equal_to_what_the_clients_sent(
    make_tls_origin: Callable[..., TlsH2Origin],
    start_instances: Callable[..., H2PingSidecarManager],
    log_dir: Path,
) -> None:
    origin, http1 = make_tls_origin(), make_tls_origin(h1_only=True)
    instances = [
        {"name": "policy", "upstream": origin.url, "listen": "127.0.0.1:0"},
        {"name": "judge", "upstream": http1.url, "listen": "127.0.0.1:0"},
    ]
    manager = start_instances(instances, access_log=True)
    policy, judge = (instance.listen for instance in manager.instances_actual)
    assert send(policy, f"/echo?{SECRET_QUERY}", 3, headers=[SECRET_HEADER]) == [200] * 3
    assert send(policy, "/slow?first_byte=0.3", 1) == [200]
    assert send(policy, "/nowhere", 1) == [404]
    assert send(judge, f"/echo?{SECRET_QUERY}", 2, headers=[SECRET_HEADER]) == [502] * 2
    manager.check()
    manager.stop()

    rows = summary(log_dir)
    got = rows["policy"]
    assert (got["requests"], got["responses_2xx"], got["responses_4xx"], got["responses_502"]) == (5, 4, 1, 0)
    assert (got["final"], got["processes"], got["upstream_errors"]) == (1, 1, 0)
    # The slow request's first byte came after 0.3 s: the longest duration and the p99 say so.
    assert 0.3 <= got["duration_max_s"] < 5 and got["duration_p99_s"] >= 0.3
    assert got["ttfb_p50_s"] is not None and got["ttfb_p50_s"] <= got["ttfb_p99_s"]
    bad = rows["judge"]
    assert (bad["requests"], bad["responses_502"], bad["final"]) == (2, 2, 1)
    # Each 502 has its kind; the proxy's own first upstream check after start counts too.
    assert bad["upstream_errors_alpn"] == bad["upstream_errors"] >= 2
    # Numbers only: no header value, query or credential reaches the figures or the database.
    (store,) = open_all_hosts(log_dir)
    store.close()
    written = sorted(log_dir.glob("*.traffic.json"))
    assert len(written) == 2 and all(path.exists() for path in written)
    for path in [*written, store.path, *log_dir.glob("sidecar-fsm/*.db-wal")]:
        data = path.read_bytes()
        assert b"s3cr3t" not in data and b"Bearer" not in data, path
    (access,) = [path for path in log_dir.glob("*.access.log") if "-policy-" in path.name]
    lines = [json.loads(line) for line in access.read_text().splitlines()]
    assert [line["path"] for line in lines] == ["/echo"] * 3 + ["/slow", "/nowhere"]
    assert b"s3cr3t" not in access.read_bytes()


def test_a_killed_launchers_sidecars_exit_by_themselves_and_reap_brings_their_final_figures(
    log_dir: Path, start_cli: Callable[..., StartedCli]
) -> None:
    started = start_cli()
    for count, inst in enumerate(started.instances, start=2):
        assert send(inst["listen"], "/echo", count) == [200] * count
    started.sigkill_and_wait_for_sidecars()
    # What the supervise loop imported while the run lived, never the figures after the drain.
    assert {row["final"] for row in summary(log_dir).values()} <= {0, None}

    (reaped,) = cli_json(log_dir, "reap")["runs"]
    assert reaped["run_id"] == started.run["run_id"]
    rows = summary(log_dir)
    assert {name: (row["requests"], row["responses_2xx"], row["final"]) for name, row in rows.items()} == {
        "policy": (2, 2, 1),
        "judge": (3, 3, 1),
    }
    history = sidecar_cli(log_dir, "history", started.run["run_id"])
    assert history.returncode == 0, history.stderr
    (line,) = [line for line in history.stdout.splitlines() if line.startswith("traffic policy:")]
    assert line.startswith("traffic policy: 2 requests, 0 502s")
    done = cli_json(log_dir, "history", started.run["run_id"])
    assert {inst["name"]: inst["traffic"]["requests"] for inst in done["instances"]} == {
        "policy": 2,
        "judge": 3,
    }
    status = sidecar_cli(log_dir, "status", "--all")
    assert status.returncode == 0, status.stderr
    assert "5 requests, 0 502s" in status.stdout


def test_a_corrupt_traffic_file_warns_once_and_breaks_nothing(
    log_dir: Path, start_cli: Callable[..., StartedCli]
) -> None:
    started = start_cli()
    assert send(started.instances[0]["listen"], "/echo", 1) == [200]
    started.sigkill_and_wait_for_sidecars()
    policy_log = next(inst["log_path"] for inst in started.instances if inst["name"] == "policy")
    corrupt = Path(traffic.traffic_path(policy_log))
    whole = corrupt.read_text()
    corrupt.write_text(whole[: len(whole) // 2])  # as a copy cut short would leave it

    reap = sidecar_cli(log_dir, "reap")
    assert reap.returncode == 0, reap.stderr
    warnings = [line for line in reap.stderr.splitlines() if "traffic figures" in line]
    assert warnings == [
        f"WARNING: traffic figures {corrupt} ignored: {warnings[0].split(' ignored: ', 1)[1]}"
    ]
    assert "not JSON" in warnings[0]
    rows = summary(log_dir)
    # The corrupt file is ignored: policy keeps what the supervise loop imported while it lived.
    assert rows["policy"]["final"] in (0, None) and rows["judge"]["final"] == 1
    for command in (
        ["status", "--all"],
        ["history", started.run["run_id"]],
        ["query", "SELECT * FROM traffic_summary"],
    ):
        done = sidecar_cli(log_dir, *command)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)
    pruned = sidecar_cli(log_dir, "prune", "--older-than", "0s")
    assert pruned.returncode == 0, pruned.stderr
    assert not corrupt.exists() and list(log_dir.glob("h2ping-*")) == []


def test_a_proxy_killed_with_sigkill_loses_at_most_its_last_interval(
    run_sidecar: Callable[..., Any], tls_origin: TlsH2Origin, log_dir: Path, tmp_path: Path
) -> None:
    interval = 0.3
    path = tmp_path / "sidecar-0.traffic.json"  # beside run_sidecar's sidecar-0.log
    sidecar = run_sidecar(
        tls_origin.url,
        "-traffic-file",
        str(path),
        "-traffic-interval",
        f"{interval}s",
        ca_file=tls_origin.ca_file,
    )
    assert send(sidecar.listen, "/echo", 4) == [200] * 4
    done_at = time.time()

    def caught_up() -> Any:
        if not path.exists():
            return None
        figures = traffic.parse(path.read_bytes())
        return figures if figures.as_of >= done_at - 0.01 and figures.document["requests"] == 4 else None

    wait_until(caught_up, interval + 5, "a write after the requests")
    caught = time.time()
    sidecar.process.send_signal(signal.SIGKILL)
    sidecar.process.wait(10)
    assert caught - done_at <= interval + 2  # the figures were at most one interval behind

    with Store.open(log_dir) as store:
        store.create_run("killed", os.getpid(), None, {})
        record = store.create_instance(
            "killed", "policy", sidecar.listen, tls_origin.url, None, str(sidecar.log_path), None
        )
        machine = InstanceMachine(store, record.id)
        machine.fire("build")
        machine.fire("spawn", pid=sidecar.process.pid, pid_start_time=1.0)
        traffic.import_instances(store, [store.get_instance(record.id)])
    row = summary(log_dir)["policy"]
    assert (row["requests"], row["responses_2xx"], row["final"]) == (4, 4, 0)


def test_a_restart_adds_both_processes_figures(
    tls_origin: TlsH2Origin,
    start_instances: Callable[..., H2PingSidecarManager],
    log_dir: Path,
) -> None:
    instances = [{"name": "policy", "upstream": tls_origin.url, "listen": "127.0.0.1:0"}]
    manager = start_instances(instances, restart={"max_restarts": 1, "backoff": "100ms"})
    (listen,) = [instance.listen for instance in manager.instances_actual]
    assert send(listen, "/echo", 2) == [200] * 2

    def record() -> Any:
        (store,) = open_all_hosts(log_dir)
        try:
            (run,) = store.list_runs()
            (inst,) = store.instances_of(run.run_id)
            return inst
        finally:
            store.close()

    first = record().pid
    os.kill(first, signal.SIGTERM)  # it drains, writes its final figures and exits 0

    def restarted() -> Any:
        manager.check()
        inst = record()
        return inst if inst.pid != first and inst.state == "ready" else None

    wait_until(restarted, 20, "the restart")
    # Taken before the new process was spawned: the first process's final figures.
    assert (summary(log_dir)["policy"]["requests"], summary(log_dir)["policy"]["final"]) == (2, 1)
    assert send(listen, "/echo", 3) == [200] * 3
    manager.stop()
    row = summary(log_dir)["policy"]
    assert (row["requests"], row["responses_2xx"], row["processes"], row["final"]) == (5, 5, 2, 1)
