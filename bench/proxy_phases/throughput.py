"""Phase 1, throughput: requests/s, p50/p99 and proxy CPU per request with wrk (HTTP/1.1
keep-alive) at each ``--conc``, for the sidecar, HAProxy (HTTP/1.1 -> h2 over TLS to the same
origin) and the origin's own HTTP/1.1 listener, the three rotated each repetition.

Owns the throughput figures and the sidecar/HAProxy ratios (medians of per-repetition ratios).
Must not leave its three processes running.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.harness.children import Children
from bench.harness.targets import (
    WrkResult,
    need_tool,
    run_wrk,
    start_haproxy,
    start_origin,
    start_sidecar,
    wrk_script,
)


def phase_throughput(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, dict[int, dict[str, float]]]:
    wrk = need_tool("wrk")
    lua = wrk_script(work)
    origin = start_origin(kids, origin_bin, work)
    sc = start_sidecar(kids, sidecar_bin, work, origin.tls, origin.ca, name="sidecar-tput")
    hp, hp_addr = start_haproxy(kids, work, origin.tls, origin.ca, args.haproxy_threads)
    targets = {
        "sidecar": (sc.listen, sc.proc.pid),
        "haproxy": (hp_addr, hp.pid),
        "direct": (origin.h1, origin.proc.pid),
    }
    for addr, pid in targets.values():  # warm up: connections, TLS sessions, heaps
        run_wrk(wrk, lua, addr, 16, 1, pid, origin.proc.pid)
    raw: dict[str, dict[int, list[WrkResult]]] = {t: {c: [] for c in args.conc} for t in targets}
    names = list(targets)
    for rep in range(args.reps):
        for c in args.conc:
            # Rotate the order each repetition: noise from the other tenants of this machine
            # then falls on every target alike instead of always on the first.
            for t in names[rep % 3 :] + names[: rep % 3]:
                addr, pid = targets[t]
                raw[t][c].append(run_wrk(wrk, lua, addr, c, args.duration, pid, origin.proc.pid))
    out: dict[str, dict[int, dict[str, float]]] = {}
    for t, per_c in raw.items():
        out[t] = {}
        for c, results in per_c.items():
            out[t][c] = {
                "rps": statistics.median(r.rps for r in results),
                "p50_ms": statistics.median(r.p50_ms for r in results),
                "p99_ms": statistics.median(r.p99_ms for r in results),
                "cpu_us": statistics.median(r.cpu_us_per_req for r in results),
                "origin_cpu": statistics.median(r.origin_cpu_share for r in results),
                "errors": sum(r.errors for r in results),
            }
    # Ratios pair the sidecar and HAProxy runs of one repetition (seconds apart), then take the
    # median: load from other tenants of the machine drifts over minutes, so a ratio of two
    # medians taken from different moments is noisier than the median of paired ratios.
    metrics = (("rps", "rps"), ("p50_ms", "p50_ms"), ("p99_ms", "p99_ms"), ("cpu_us", "cpu_us_per_req"))
    for c in args.conc:
        for key, attr in metrics:
            pairs = [
                getattr(s_, attr) / getattr(h_, attr)
                for s_, h_ in zip(raw["sidecar"][c], raw["haproxy"][c], strict=True)
                if getattr(h_, attr)
            ]
            if pairs:
                out["sidecar"][c][key + "_ratio"] = statistics.median(pairs)
                out["sidecar"][c][key + "_ratio_min"] = min(pairs)
                out["sidecar"][c][key + "_ratio_max"] = max(pairs)
    for p in (sc.proc, hp, origin.proc):
        kids.stop(p)
    return out
