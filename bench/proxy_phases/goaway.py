"""Phase 3, GOAWAY churn: 1,000 POSTs of 1 KiB at concurrency 50 against an origin that drains
every connection after 5 requests (graceful GOAWAY): byte-exact echoes and p99, for the sidecar,
HAProxy, and the sidecar under the same load without GOAWAY ("calm", what churn costs).

Owns the churn figures. That the origin's GOAWAY mode is graceful (in-flight requests finish)
is bench/origin's own test (origin_test.go), not a check here. Must not leave its processes
running.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness.children import Children
from bench.harness.http1 import Outcome, echo_load, one_shot
from bench.harness.targets import start_haproxy, start_origin, start_sidecar


def phase_goaway(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, dict[str, Any]]:
    """`goaway_reps` runs per proxy, each on a fresh origin and proxy, interleaved; the p99
    shown is the median of the runs' p99s (one stalled moment of a shared machine moves a
    single run's p99 by 0.1-0.2 s), and every request of every run must succeed."""
    # "calm" is the sidecar under the same load with no GOAWAY at all: what churn costs is the
    # difference, whatever this machine's other tenants add to both.
    runs: dict[str, list[dict[str, Any]]] = {"sidecar": [], "haproxy": [], "calm": []}
    for _ in range(args.goaway_reps):
        for who in ("sidecar", "haproxy", "calm"):
            origin = start_origin(kids, origin_bin, work, goaway_every=0 if who == "calm" else 5)
            if who == "calm":
                sc = start_sidecar(kids, sidecar_bin, work, origin.tls, origin.ca, name="sidecar-calm")
                proc, addr = sc.proc, sc.listen
            elif who == "sidecar":
                sc = start_sidecar(kids, sidecar_bin, work, origin.tls, origin.ca, name="sidecar-goaway")
                proc, addr = sc.proc, sc.listen
            else:
                proc, addr = start_haproxy(
                    kids, work, origin.tls, origin.ca, args.haproxy_threads, name="haproxy-goaway"
                )
            # One warm-up request each: the target is about churn (re-sends after GOAWAY), not
            # the first dial of a fresh proxy, which the start phase reports on its own.
            asyncio.run(one_shot(addr, "/wait?first_byte=0s", Outcome(), 10))
            origin.reset()
            t0 = time.monotonic()
            out = asyncio.run(asyncio.wait_for(echo_load(addr, 1000, 50, 1024, timeout=30), timeout=90))
            wall = time.monotonic() - t0
            st = origin.stats()
            runs[who].append(
                {
                    "ok": out.ok,
                    "errors": out.errors,
                    "p50_s": out.pct(50),
                    "p99_s": out.pct(99),
                    "wall_s": wall,
                    "goaways": st["goaways"],
                    "handshakes": st["handshakes"],
                    "dup": sum(1 for v in st["by_id"].values() if v > 1),
                }
            )
            kids.stop(proc)
            kids.stop(origin.proc)
    res: dict[str, dict[str, Any]] = {}
    for who, rs in runs.items():
        errors: dict[str, int] = {}
        for r in rs:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        res[who] = {
            "ok": sum(r["ok"] for r in rs),
            "n": 1000 * len(rs),
            "errors": errors,
            "p50_s": statistics.median(r["p50_s"] for r in rs),
            "p99_s": statistics.median(r["p99_s"] for r in rs),
            "p99s": [round(r["p99_s"], 3) for r in rs],
            "goaways": sum(r["goaways"] for r in rs),
            "handshakes": sum(r["handshakes"] for r in rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "dup": sum(r["dup"] for r in rs),
        }
    return res
