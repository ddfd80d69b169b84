"""A real Prometheus server finds a live run's sidecars through the file_sd target file.

Prometheus (Debian's ``prometheus`` package; ``.ci/run`` installs it) runs with its own config,
storage and a loopback port of its choosing (``127.0.0.1:0``, read back from its socket), scrapes
every second, and is always ended by the fixture. The test reads its HTTP API as a dashboard
would: the in-flight gauge of each sidecar with the file's labels, the request-duration
histogram of the requests it sent, the process series; after the run stops, the targets are gone
from the file and from Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from helpers import ProcessRegistry, http11_request, terminate_and_reap, wait_until
from omegaconf import OmegaConf
from querycluster import README, Run, write_config

from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import start_h2_ping_sidecar
from sidecar_fsm.state.hostname import host_name

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
)


class PrometheusServer:
    """A Prometheus process and its HTTP API at ``address``."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log
        self.address = ""

    def listening(self) -> str:
        """The loopback address Prometheus bound for its web port ('' until it has)."""
        if self.process.poll() is not None:
            raise AssertionError(
                f"prometheus exited {self.process.returncode}: {self.log.read_text()[-2000:]}"
            )
        for conn in psutil.Process(self.process.pid).net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.ip == "127.0.0.1":
                return f"127.0.0.1:{conn.laddr.port}"
        return ""

    def ready(self) -> bool:
        """True once /-/ready answers 200 (it says 503 while the TSDB opens)."""
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            document = json.loads(response.read())
        assert document["status"] == "success", document
        return document["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result


def readme_node_files(log_dir: Path, host: str) -> str:
    """The ``files`` of the README's per-node scrape config, on ``log_dir`` and ``host``."""
    section = README.read_text().split("**On a cluster**", 1)[1]
    files = re.search(r'- files: \["(.*?)"\]', section)
    assert files is not None, "the README's cluster Prometheus config"
    return files.group(1).replace("/path/to/log_dir", str(log_dir)).replace("$(hostname)", host)


@pytest.fixture
def prometheus(
    request: pytest.FixtureRequest, tmp_path: Path, log_dir: Path, process_registry: ProcessRegistry
) -> Iterator[PrometheusServer]:
    """Prometheus scraping every target file under ``log_dir`` each second; ended at teardown.

    Parametrized (indirect) with a host name, it reads only that host's file, as the README's
    per-node config does.
    """
    assert PROMETHEUS is not None
    host = getattr(request, "param", None)
    files = (
        log_dir / "sidecar-fsm" / "prometheus" / "*.json"
        if host is None
        else readme_node_files(log_dir, host)
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "h2-ping-sidecar",
                        "file_sd_configs": [{"files": [str(files)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                "--web.listen-address=127.0.0.1:0",
                "--log.level=warn",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    process_registry.add(process)
    server = PrometheusServer(process, log)
    try:
        server.address = wait_until(server.listening, 30, "prometheus to listen")
        wait_until(server.ready, 30, "prometheus to be ready")
        yield server
    finally:
        terminate_and_reap(process, 15)


def test_prometheus_scrapes_every_sidecar_of_a_live_run_through_the_target_file(
    prometheus: PrometheusServer,
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., Any],
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
) -> None:
    relay = idle_relay(tls_origin, idle=5.0)
    upstreams = {"policy": tls_origin.url, "judge": f"https://localhost:{relay.port}"}
    config = OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "sidecar": {
                "enabled": True,
                "instances": [
                    {"name": name, "upstream": url, "listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0"}
                    for name, url in upstreams.items()
                ],
                "ca_file": str(tls_origin.ca_file),
                "log_dir": str(log_dir),
                "shutdown_grace": "2s",
                # PINGs keep the judge's connection through the relay, which drops it after 5 s idle.
                "ping_interval": "1s",
                "rewrite_base_urls": False,
            },
        }
    )
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    try:
        listen = {inst.name: inst.listen for inst in manager.instances_actual}
        for _ in range(3):
            host, port = listen["policy"].rsplit(":", 1)
            assert http11_request(host, int(port), "/echo", timeout=20).status == 200

        def in_flight() -> list[dict[str, Any]]:
            series = prometheus.query("h2ping_requests_in_flight")
            return series if len(series) == 2 else []

        series = wait_until(in_flight, 30, "both sidecars scraped")
        labels = {s["metric"]["sidecar"]: s["metric"] for s in series}
        for name, url in upstreams.items():
            got = labels[name]
            assert got["run"] == manager.run_id
            assert got["upstream"] == url.removeprefix("https://")
            assert got["host"] == host_name()
            assert got["job"] == "h2-ping-sidecar"
            assert float(next(s for s in series if s["metric"]["sidecar"] == name)["value"][1]) == 0

        def counted() -> list[dict[str, Any]]:
            found = prometheus.query('h2ping_request_duration_seconds_count{sidecar="policy"}')
            return found if found and float(found[0]["value"][1]) == 3 else []

        wait_until(counted, 30, "the three requests in the histogram")
        buckets = prometheus.query('h2ping_request_duration_seconds_bucket{sidecar="policy",le="3600"}')
        assert [float(b["value"][1]) for b in buckets] == [3.0]
        rss = prometheus.query("process_resident_memory_bytes")
        assert len(rss) == 2 and all(float(s["value"][1]) > 1 << 20 for s in rss)
        ups = prometheus.query("h2ping_upstream_up")
        assert {s["metric"]["sidecar"]: s["value"][1] for s in ups} == {"policy": "1", "judge": "1"}
    finally:
        manager.stop()

    target_file = log_dir / "sidecar-fsm" / "prometheus" / f"{host_name()}.json"
    assert json.loads(target_file.read_text()) == []

    def no_targets() -> bool:
        return prometheus.api("targets", state="active")["activeTargets"] == []

    wait_until(no_targets, 30, "prometheus to drop the stopped sidecars")


@pytest.mark.parametrize("prometheus", ["node-a"], indirect=True)
def test_the_readmes_per_node_config_scrapes_only_its_own_nodes_sidecars(
    prometheus: PrometheusServer,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    log_dir: Path,
    tmp_path: Path,
    process_registry: ProcessRegistry,
) -> None:
    """Two nodes share one log dir; node-a's Prometheus, configured as the README shows, finds
    node-a's sidecars and never node-b's, whose loopback ports mean nothing on node-a."""
    runs = {
        host: Run(
            log_dir,
            write_config(tmp_path / f"{host}.yaml", tls_origin, sidecar_binary),
            host,
            process_registry,
        )
        for host in ("node-a", "node-b")
    }
    try:
        files = {
            host: json.loads((log_dir / "sidecar-fsm" / "prometheus" / f"{host}.json").read_text())
            for host in runs
        }
        assert all(len(entries) == 2 for entries in files.values())  # both nodes' sidecars are listed
        mine = sorted(target for entry in files["node-a"] for target in entry["targets"])

        def scraped() -> list[dict[str, Any]]:
            active = prometheus.api("targets", state="active")["activeTargets"]
            return active if len(active) == 2 and all(t["health"] == "up" for t in active) else []

        active = wait_until(scraped, 30, "node-a's two sidecars scraped")
        assert sorted(t["labels"]["instance"] for t in active) == mine
        assert {t["labels"]["host"] for t in active} == {"node-a"}
        assert {t["labels"]["run"] for t in active} == {runs["node-a"].run_id}
    finally:
        for run in runs.values():
            run.stop(expect=0)
