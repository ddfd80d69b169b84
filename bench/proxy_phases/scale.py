"""Phase 2, scale: ``n`` concurrent one-connection requests, each waiting for its first byte
behind a relay that drops connections idle 3 s. ``scale`` is 2,000 waits of 5 s; ``scale-metrics``
(issue 12) 10,000 waits of 10 s with -metrics-listen on and /metrics scraped while all are in
flight, beside an idle sidecar scraped at the same moments (this machine's share of a scrape).

Owns the held-waits figures (ok, lost/duplicated, peak RSS, handshakes vs connections used) and
the scrape figures; ``scale_once`` is also the paired phase's. Must not leave its processes
running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.harness.children import Children, cpu_seconds, mem_kib
from bench.harness.http1 import Outcome, held_waits
from bench.harness.targets import start_origin, start_sidecar
from bench.harness.waits import wait_until


def phase_scale(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, Any]:
    return scale_once(kids, work, sidecar_bin, origin_bin, args.scale_requests, "5s", "sidecar-scale")


def phase_scale_metrics(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, Any]:
    """Issue 12's scale row: the scale phase at `--metrics-scale-requests` waits of
    `--metrics-scale-wait` with -metrics-listen on, /metrics scraped while all are in flight."""
    return scale_once(
        kids,
        work,
        sidecar_bin,
        origin_bin,
        args.metrics_scale_requests,
        args.metrics_scale_wait,
        "sidecar-scale-metrics",
        metrics=True,
    )


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a /metrics answer, read by prometheus-client's parser (so a format error
    fails the phase), keyed `name` or `name{label="value",...}` as written in the exposition."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def timed_scrape(address: str) -> tuple[float, dict[str, float]]:
    """(seconds from connect to the last byte, parsed samples) of one GET /metrics on a fresh
    connection, as a Prometheus server's first scrape makes it."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return time.perf_counter() - t0, parse_metrics(text)


async def scrape_all_in_flight(address: str, control: str, n: int, deadline_s: float) -> dict[str, Any]:
    """Scrapes /metrics every 50 ms until one reports `n` requests in flight, then times up to
    ten more, 0.5 s apart, while they still report `n`: a Prometheus server scrapes at any
    moment of a wait, the first seconds (the proxy still forwarding the last requests) as the
    quiet rest. Each timed scrape is followed at once by one of `control`, an idle sidecar's
    /metrics: what a scrape takes on this shared machine at that moment with nothing in flight.

    The scrape that first sees `n` was started while the proxy was still taking requests in
    and waited behind that work; it is reported apart, as "during the intake". Runs in a
    thread: the event loop meanwhile only waits for answers seconds away, so the timing is the
    proxy's, not this process's GIL."""
    first: tuple[float, dict[str, float]] | None = None
    timed: list[tuple[float, dict[str, float]]] = []
    idle: list[float] = []
    most = 0.0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and len(timed) < 10:
        took, m = await asyncio.to_thread(timed_scrape, address)
        in_flight = m["h2ping_requests_in_flight"]
        most = max(most, in_flight)
        if in_flight >= n:
            if first is None:
                first = (took, m)
            else:
                timed.append((took, m))
                idle.append((await asyncio.to_thread(timed_scrape, control))[0])
        elif first is not None:
            break  # the first answers are coming back: no longer all in flight
        await asyncio.sleep(0.05 if first is None else 0.5)
    if first is None or not timed:
        return {"reached": False, "in_flight_max": most}
    took, m = timed[0]
    return {
        "reached": True,
        "intake_scrape_ms": first[0] * 1000,
        "in_flight": m["h2ping_requests_in_flight"],
        "oldest_age_s": m["h2ping_oldest_request_age_seconds"],
        "scrape_ms": [round(t * 1000, 2) for t, _ in timed],
        "scrape_ms_median": statistics.median(t for t, _ in timed) * 1000,
        "scrape_ms_max": max(t for t, _ in timed) * 1000,
        "control_ms": [round(t * 1000, 2) for t in idle],
        "control_ms_median": statistics.median(idle) * 1000,
        "control_ms_max": max(idle) * 1000,
        "scrapes": len(timed),
    }


def scale_once(
    kids: Children,
    work: Path,
    sidecar_bin: Path,
    origin_bin: Path,
    n: int,
    wait: str,
    name: str,
    *,
    metrics: bool = False,
    extra_flags: Sequence[str] = (),
) -> dict[str, Any]:
    """`n` concurrent one-connection requests, each waiting `wait` for its first byte behind a
    relay that drops connections idle 3 s: outcome, peak RSS, handshakes vs connections used.
    With `metrics`, the sidecar runs with -metrics-listen, /metrics is scraped once all `n`
    are in flight (`scrape_all_in_flight`, beside an idle control sidecar) and once after the
    last answer (dials, PINGs). `extra_flags` go to the sidecar as given (bench/traffic.py's
    access log).

    The origin is fresh and its counters are not reset: the sidecar's start-up dial (right
    after its ready file, pooled for the first requests) is one of the handshakes counted."""
    origin = start_origin(kids, origin_bin, work, relay_idle="3s")
    extra = ("-metrics-listen", "127.0.0.1:0") if metrics else ()
    sc = start_sidecar(
        kids,
        sidecar_bin,
        work,
        origin.relay,
        origin.ca,
        "-ping-interval",
        "1s",
        *extra,
        *extra_flags,
        name=name,
    )
    maddr: str = json.loads((work / f"{name}.ready").read_text()).get("metrics", "")
    control = ""
    if metrics:
        # The control dials a port bound but never listening: its one start-up dial is refused,
        # so it adds nothing to the origin's handshake count.
        with socket.socket() as refused:
            refused.bind(("127.0.0.1", 0))
            up = f"127.0.0.1:{refused.getsockname()[1]}"
            start_sidecar(kids, sidecar_bin, work, up, origin.ca, *extra, name=f"{name}-idle")
            control = json.loads((work / f"{name}-idle.ready").read_text())["metrics"]
            wait_until(
                lambda: timed_scrape(control)[1]['h2ping_upstream_dials_total{result="error"}'] == 1,
                10,
                "the idle sidecar's refused start-up dial",
            )
    wait_s = float(wait.removesuffix("s"))  # the flags take whole seconds: "5s", "10s"

    async def main() -> tuple[Outcome, dict[str, Any]]:
        during = (lambda: scrape_all_in_flight(maddr, control, n, wait_s + 5)) if metrics else None
        return await held_waits(sc.listen, n, wait, timeout=wait_s + 110, while_waiting=during)

    cpu0 = cpu_seconds(sc.proc.pid)
    t0 = time.monotonic()
    out, during = asyncio.run(asyncio.wait_for(main(), timeout=wait_s + 170))
    wall = time.monotonic() - t0
    cpu = cpu_seconds(sc.proc.pid) - cpu0
    st = origin.stats()
    hwm = mem_kib(sc.proc.pid, "VmHWM")
    ids = st["by_id"]
    res = {
        "ok": out.ok,
        "n": n,
        "wait": wait,
        "errors": out.errors,
        "wall_s": wall,
        "p50_s": out.pct(50),
        "p99_s": out.pct(99),
        "cpu_s": cpu,
        "peak_rss_mib": hwm / 1024,
        "handshakes": st["handshakes"],
        "conns_with_requests": st["conns_with_requests"],
        "relay_drops": st["relay_drops"],
        "lost": sum(1 for i in range(n) if ids.get(f"s{i}", 0) == 0),
        "dup": sum(1 for v in ids.values() if v > 1),
    }
    if metrics:
        _, after = timed_scrape(maddr)
        res["during"] = during
        res["after"] = {
            "dials_ok": after['h2ping_upstream_dials_total{result="ok"}'],
            "dials_error": after['h2ping_upstream_dials_total{result="error"}'],
            "pings_sent": after["h2ping_pings_sent_total"],
            "ping_acks": after["h2ping_ping_acks_total"],
            "requests": after["h2ping_requests_total"],
            "responses_200": after.get('h2ping_responses_total{code="200"}', 0.0),
            "in_flight": after["h2ping_requests_in_flight"],
        }
    kids.stop(sc.proc)
    kids.stop(origin.proc)
    return res
