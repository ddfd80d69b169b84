"""The proxy's GET /metrics as a Prometheus server reads it: the real binary, the lab's TLS HTTP/2
origin behind the idle-dropping relay, and every scrape parsed by prometheus-client's own parser.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from helpers import http11_request, wait_until
from prometheus_client.parser import text_string_to_metric_families

from sidecar_fsm.base import buildcache
from sidecar_fsm.lab import TlsH2Origin

# Every name SPEC fixes, with its type as prometheus-client reports it (counters lose _total).
FAMILIES = {
    "h2ping_requests_in_flight": "gauge",
    "h2ping_oldest_request_age_seconds": "gauge",
    "h2ping_requests": "counter",
    "h2ping_responses": "counter",
    "h2ping_client_disconnects": "counter",
    "h2ping_upstream_connections": "gauge",
    "h2ping_upstream_dials": "counter",
    "h2ping_upstream_errors": "counter",
    "h2ping_upstream_up": "gauge",
    "h2ping_pings_sent": "counter",
    "h2ping_ping_acks": "counter",
    "h2ping_ping_rtt_seconds": "gauge",
    "h2ping_goaways": "counter",
    "h2ping_retries": "counter",
    "h2ping_rotations": "counter",
    "h2ping_request_duration_seconds": "histogram",
    "h2ping_time_to_first_byte_seconds": "histogram",
    "h2ping_request_duration_max_seconds": "gauge",
    "h2ping_build_info": "gauge",
    # NVCF's 202s followed to the answer (issue 36).
    "h2ping_nvcf_pending": "counter",
    "h2ping_nvcf_polls": "counter",
    "h2ping_nvcf_outcomes": "counter",
    # The Prometheus Go client's names, so dashboards built for any Go service work.
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "go_goroutines": "gauge",
    "go_memstats_alloc_bytes": "gauge",
    "go_memstats_heap_inuse_bytes": "gauge",
    "go_memstats_sys_bytes": "gauge",
    "go_memstats_next_gc_bytes": "gauge",
}


def metrics_address(ready_path: Any) -> str:
    info = json.loads(ready_path.read_text())
    address: str = info["metrics"]
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0, info
    return address


def scrape(address: str) -> dict[str, float]:
    """GET /metrics, parsed by prometheus-client; samples keyed ``name{label="value"}``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert {name: family.type for name, family in families.items()} == FAMILIES
    samples: dict[str, float] = {}
    for family in families.values():
        assert family.documentation, family.name
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            assert key not in samples, key
            samples[key] = sample.value
    return samples


def test_metrics_follow_a_slow_request_kept_alive_through_the_relay(
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., Any],
    run_sidecar: Callable[..., Any],
) -> None:
    relay = idle_relay(tls_origin, idle=1.0)
    sidecar = run_sidecar(
        f"https://localhost:{relay.port}",
        "-ping-interval",
        "300ms",
        "-metrics-listen",
        "127.0.0.1:0",
        ca_file=tls_origin.ca_file,
    )
    address = metrics_address(sidecar.ready_path)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(http11_request, sidecar.host, sidecar.port, "/slow?first_byte=2.5", timeout=20)
        first = wait_until(
            lambda: (m := scrape(address))["h2ping_requests_in_flight"] == 1 and m,
            10,
            "the request in flight",
        )
        during = wait_until(
            lambda: (
                (m := scrape(address))["h2ping_pings_sent_total"] >= 2
                and m["h2ping_ping_acks_total"] == m["h2ping_pings_sent_total"]
                and m
            ),
            10,
            "PINGs sent and acknowledged while the request waits",
        )
        assert during["h2ping_requests_in_flight"] == 1
        assert during["h2ping_oldest_request_age_seconds"] > first["h2ping_oldest_request_age_seconds"]
        assert 0 < during["h2ping_ping_rtt_seconds"] < 1
        assert during["h2ping_upstream_up"] == 1
        response = pending.result(timeout=30)
    assert response.status == 200, response.body
    after = wait_until(
        lambda: (m := scrape(address))["h2ping_requests_in_flight"] == 0 and m, 10, "the request done"
    )
    assert after["h2ping_oldest_request_age_seconds"] == 0
    assert after["h2ping_requests_total"] == 1
    assert after['h2ping_responses_total{code="200"}'] == 1
    assert after['h2ping_upstream_dials_total{result="ok"}'] == 1
    assert after['h2ping_upstream_dials_total{result="error"}'] == 0
    assert after["h2ping_pings_sent_total"] <= tls_origin.pings
    assert relay.drops == 0


def test_metrics_show_a_closed_upstream_port_before_any_request(run_sidecar: Callable[..., Any]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    # Nothing listens there now: the start-up dial is refused.
    sidecar = run_sidecar(f"https://127.0.0.1:{closed}", "-metrics-listen", "127.0.0.1:0")
    ready_at = time.monotonic()
    address = metrics_address(sidecar.ready_path)
    samples = wait_until(
        lambda: (m := scrape(address))['h2ping_upstream_dials_total{result="error"}'] == 1 and m,
        2,
        "the start-up dial's error",
    )
    assert time.monotonic() - ready_at < 2
    assert samples["h2ping_upstream_up"] == 0
    assert samples['h2ping_upstream_errors_total{kind="dial"}'] == 1
    assert samples["h2ping_requests_total"] == 0
    # The build cache stamps the sources hash: a dashboard tells which sources each sidecar runs.
    (build_info,) = [key for key in samples if key.startswith("h2ping_build_info{")]
    assert f'version="{buildcache.sources_hash()}"' in build_info
    wait_until(lambda: "upstream check: " in sidecar.log(), 2, "the start-up check's log line")
    line = next(line for line in sidecar.log().splitlines() if "upstream check: " in line)
    assert "connection refused" in line
