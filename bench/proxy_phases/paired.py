"""Paired builds (``--phases paired --compare old=BIN --compare new=BIN ...``): two or more
sidecar binaries measured side by side in one run, their runs rotated or alternated, ratios
against the first. How a change to go/ is judged; the table goes to ``--report`` alone, never
to the README. A label starting with ``gym`` is a proxy with NeMo Gym's contract
(tests/gymproxy built): it takes Gym's flags and is measured at c=16 only, the figure a
build of ours is held to against Gym's sidecar.

Owns the paired figures and their report. Must not leave its processes running.
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
from bench.harness.targets import (
    WrkResult,
    need_tool,
    run_wrk,
    start_gym_sidecar,
    start_origin,
    start_sidecar,
    wrk_script,
)
from bench.proxy_phases.scale import scale_once


def phase_paired(args: argparse.Namespace, kids: Children, work: Path, origin_bin: Path) -> dict[str, Any]:
    """Builds side by side in one run (`--compare LABEL=BINARY`, the first is the baseline):
    wrk c=16 with the builds' runs rotated in every repetition, then `--paired-scale` waits
    and GOAWAY churn with the builds alternated run by run. Ratios are build/baseline, the
    median of per-repetition ratios (runs seconds apart on this noisy machine)."""
    builds: dict[str, Path] = args.compare
    names = list(builds)
    wrk = need_tool("wrk")
    lua = wrk_script(work)
    res: dict[str, Any] = {"builds": {k: str(v) for k, v in builds.items()}}

    origin = start_origin(kids, origin_bin, work)
    scs = {
        k: start_gym_sidecar(kids, b, work, origin.tls, name=f"paired-{k}")
        if k.startswith("gym")
        else start_sidecar(kids, b, work, origin.tls, origin.ca, name=f"paired-{k}")
        for k, b in builds.items()
    }
    for sc in scs.values():  # warm up: connections, TLS sessions, heaps
        run_wrk(wrk, lua, sc.listen, 16, 1, sc.proc.pid, origin.proc.pid)
    raw: dict[str, list[WrkResult]] = {k: [] for k in names}
    for rep in range(args.reps):
        for k in names[rep % len(names) :] + names[: rep % len(names)]:
            raw[k].append(
                run_wrk(wrk, lua, scs[k].listen, 16, args.duration, scs[k].proc.pid, origin.proc.pid)
            )
    tput: dict[str, dict[str, float]] = {}
    for k in names:
        row = {
            "rps": statistics.median(r.rps for r in raw[k]),
            "p99_ms": statistics.median(r.p99_ms for r in raw[k]),
            "cpu_us": statistics.median(r.cpu_us_per_req for r in raw[k]),
            "errors": sum(r.errors for r in raw[k]),
        }
        for key, attr in (("rps", "rps"), ("p99_ms", "p99_ms"), ("cpu_us", "cpu_us_per_req")):
            row[key + "_ratio"] = statistics.median(
                getattr(a, attr) / getattr(b, attr) for a, b in zip(raw[k], raw[names[0]], strict=True)
            )
        tput[k] = row
    res["c16"] = tput
    kids.close()
    names = [k for k in names if not k.startswith("gym")]  # the rest is ours alone

    res["scale"] = {}
    for n in args.paired_scale:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
        for rep in range(args.paired_scale_reps):
            for k in names[rep % len(names) :] + names[: rep % len(names)]:
                runs[k].append(
                    scale_once(kids, work, builds[k], origin_bin, n, args.paired_wait, f"scale-{k}")
                )
                kids.close()
        res["scale"][n] = runs

    goaway: dict[str, list[float]] = {k: [] for k in names}
    goaway_ok: dict[str, int] = {k: 0 for k in names}
    for rep in range(args.goaway_reps):
        for k in names[rep % len(names) :] + names[: rep % len(names)]:
            origin = start_origin(kids, origin_bin, work, goaway_every=5)
            sc = start_sidecar(kids, builds[k], work, origin.tls, origin.ca, name=f"goaway-{k}")
            asyncio.run(one_shot(sc.listen, "/wait?first_byte=0s", Outcome(), 10))
            out = asyncio.run(asyncio.wait_for(echo_load(sc.listen, 1000, 50, 1024, timeout=30), timeout=90))
            goaway[k].append(out.pct(99))
            goaway_ok[k] += out.ok
            kids.close()
    res["goaway"] = {
        k: {"p99_s": statistics.median(v), "runs": v, "ok": goaway_ok[k]} for k, v in goaway.items()
    }
    return res


def paired_report(r: dict[str, Any], command: str) -> str:
    names = list(r["builds"])
    lines = [
        "# bench/proxy.py paired builds",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by `{command}`; load average "
        f"before/after {r['load_before']} / {r['load_after']}. Builds (the first is the baseline):",
        "",
    ]
    lines += [f"- `{k}`: {v}" for k, v in r["builds"].items()]
    lines += ["", "| metric | " + " | ".join(names) + " |", "|---|" + "--:|" * len(names)]
    c16 = r["c16"]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("c=16 req/s (ratio)", [f"{c16[k]['rps']:,.0f} ({c16[k]['rps_ratio']:.3f}x)" for k in names])
    row("c=16 CPU us/req (ratio)", [f"{c16[k]['cpu_us']:.1f} ({c16[k]['cpu_us_ratio']:.3f}x)" for k in names])
    row("c=16 p99 ms (ratio)", [f"{c16[k]['p99_ms']:.2f} ({c16[k]['p99_ms_ratio']:.3f}x)" for k in names])
    row("c=16 wrk errors", [str(c16[k]["errors"]) for k in names])
    ours = [k for k in names if not k.startswith("gym")]

    def ours_row(label: str, cell: Any) -> None:
        row(label, [cell(k) if k in ours else "-" for k in names])

    for n, runs in r["scale"].items():
        ours_row(
            f"{n} waits: peak RSS MiB, median (runs)",
            lambda k, runs=runs: (
                f"{statistics.median(x['peak_rss_mib'] for x in runs[k]):.1f} ("
                + ", ".join(f"{x['peak_rss_mib']:.1f}" for x in runs[k])
                + ")"
            ),
        )
        ours_row(f"{n} waits: ok", lambda k, runs=runs: " ".join(f"{x['ok']}/{x['n']}" for x in runs[k]))
        ours_row(
            f"{n} waits: TLS handshakes / conns used",
            lambda k, runs=runs: " ".join(f"{x['handshakes']}/{x['conns_with_requests']}" for x in runs[k]),
        )
        ours_row(
            f"{n} waits: sidecar CPU s", lambda k, runs=runs: " ".join(f"{x['cpu_s']:.2f}" for x in runs[k])
        )
    g = r["goaway"]
    ours_row(
        "GOAWAY/5 p99 s, median (runs)",
        lambda k: f"{g[k]['p99_s']:.3f} (" + ", ".join(f"{x:.3f}" for x in g[k]["runs"]) + ")",
    )
    ours_row("GOAWAY/5 byte-exact", lambda k: str(g[k]["ok"]))
    lines += [
        "",
        f"c=16: wrk, {r['reps']} x {r['duration']:g} s per build, the builds' order rotated each repetition, "
        "one origin for all. Waits: GET /wait behind a relay dropping connections idle 3 s, "
        "one connection per request, -ping-interval 1s; peak RSS = VmHWM. GOAWAY: origin drains "
        "each connection after 5 requests; 1000 POSTs of 1 KiB at concurrency 50.",
        "",
    ]
    return "\n".join(lines)
