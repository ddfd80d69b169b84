"""The profile phase: where the sidecar's CPU goes under wrk c=16 (pprof, grouped by package)
and where its memory goes with 2,000 requests in flight (MemStats, goroutines by entry
function, heap sites), from a build of go/ plus net/http/pprof (``binaries.profiling_variant``).

Owns the "Where the time goes" and "Where the memory goes" sections of results/proxy.md. Must
not build into go/ or leave its processes (wrk included) running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness.binaries import go_tool, profiling_variant
from bench.harness.children import Children, free_port, mem_kib
from bench.harness.http1 import Outcome, one_shot
from bench.harness.targets import Sidecar, need_tool, start_origin, start_sidecar, wrk_script

BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    (
        "network I/O syscalls (read, write, epoll)",
        ("syscall.", "internal/runtime/syscall", "runtime/internal/syscall", "internal/poll.", "net."),
    ),
    ("TLS record crypto", ("crypto/", "vendor/golang.org/x/crypto")),
    (
        "HTTP/2 client (framing, hpack, flow control)",
        ("net/http/internal/http2", "net/http.http2", "vendor/golang.org/x/net/http2"),
    ),
    (
        "HTTP/1.1 server and ReverseProxy",
        ("net/http", "net/textproto", "net/url", "bufio.", "net/http/httputil"),
    ),
    ("the sidecar's own code (package main)", ("main.",)),
    (
        "GC and allocation",
        (
            "runtime.gc",
            "runtime.mallocgc",
            "runtime.scanobject",
            "runtime.greyobject",
            "runtime.findObject",
            "runtime.markBits",
            "runtime.(*gc",
            "runtime.(*mspan)",
            "runtime.(*mheap)",
            "runtime.(*mcache)",
            "runtime.(*mcentral)",
            "runtime.memclr",
            "runtime.heapBits",
            "runtime.spanOf",
            "runtime.typePointers",
            "runtime.scanblock",
            "runtime.bgsweep",
            "runtime.sweepone",
            "runtime.wbBuf",
            "runtime.(*gcWork)",
            "runtime.nextFreeFast",
            "runtime.makeslice",
            "runtime.newobject",
            "runtime.growslice",
            "runtime.(*pageAlloc)",
            "runtime.deductAssistCredit",
            "runtime.gcDrain",
        ),
    ),
    ("scheduler, netpoll, futex", ("runtime.",)),
]


def bucket_of(fn: str) -> str:
    for label, prefixes in BUCKETS:
        if fn.startswith(prefixes):
            return label
    return "other"


def phase_profile(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, Any]:
    """A CPU profile of the profiling variant (go/ plus pprof; ``sidecar_bin`` is not it) under
    wrk c=16, then ``memory_snapshot``."""
    wrk = need_tool("wrk")
    go = str(go_tool())
    binary = profiling_variant(work)
    origin = start_origin(kids, origin_bin, work)
    pport = free_port()
    env = dict(os.environ, BENCH_PPROF_ADDR=f"127.0.0.1:{pport}")
    sc = start_sidecar(kids, binary, work, origin.tls, origin.ca, env=env, name="sidecar-pprof")
    lua = wrk_script(work)
    seconds = max(5, int(args.duration))
    prof = work / "cpu.pprof"
    load = kids.start([wrk, "-t2", "-c16", f"-d{seconds + 2}s", "-s", str(lua), f"http://{sc.listen}/"])
    try:
        time.sleep(1)  # profile the steady state, not the connection set-up
        url = f"http://127.0.0.1:{pport}/debug/pprof/profile?seconds={seconds}"
        with urllib.request.urlopen(url, timeout=seconds + 20) as r:
            prof.write_bytes(r.read())
    finally:
        # wrk runs 2 s past the profile and then exits by itself; it is ended only if stuck.
        with contextlib.suppress(subprocess.TimeoutExpired):
            load.wait(seconds + 20)
        kids.stop(load)
    top = subprocess.run(
        [go, "tool", "pprof", "-top", "-nodecount=100000", str(binary), str(prof)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    mem = memory_snapshot(args, go, binary, sc, pport, work)
    kids.stop(sc.proc)
    kids.stop(origin.proc)
    flat: dict[str, float] = {}
    rows: list[tuple[float, float, str]] = []
    total = 0.0
    for line in top.splitlines():
        parts = line.split()
        if len(parts) < 6 or not parts[0][0].isdigit() or not parts[1].endswith("%"):
            continue
        fl, cum = to_seconds(parts[0]), to_seconds(parts[3])
        name = " ".join(parts[5:])
        rows.append((fl, cum, name))
        flat[bucket_of(name)] = flat.get(bucket_of(name), 0.0) + fl
        total += fl
    cum_top = sorted(rows, key=lambda r: -r[1])
    return {
        "mem": mem,
        "total_s": total,
        "buckets": sorted(
            ((k, v / total * 100 if total else 0.0) for k, v in flat.items()), key=lambda kv: -kv[1]
        ),
        "flat_top": [(name, fl / total * 100 if total else 0.0) for fl, _, name in rows[:12]],
        "cum_top": [
            (name, cum / total * 100 if total else 0.0)
            for _, cum, name in cum_top
            if not name.startswith(("runtime.", "internal/runtime", "syscall.", "internal/poll", "net.(*"))
        ][:14],
        "cum_main": [
            (name, cum / total * 100 if total else 0.0)
            for _, cum, name in cum_top
            if name.startswith("main.")
        ][:8],
    }


def goroutine_kinds(text: str, min_count: int) -> list[tuple[int, str]]:
    """(count, entry function) of the goroutine groups of a debug=1 goroutine profile that
    hold at least `min_count` goroutines; the entry is the bottom frame of the stack."""
    kinds: dict[str, int] = {}
    count, entry = 0, ""

    def flush() -> None:
        if count and entry:
            kinds[entry] = kinds.get(entry, 0) + count

    for line in text.splitlines():
        m = re.match(r"^(\d+) @ ", line)
        if m:
            flush()
            count, entry = int(m.group(1)), ""
        elif line.startswith("#\t") and line.count("\t") >= 3:
            entry = line.split("\t")[2].rsplit("+", 1)[0]
    flush()
    return sorted(((c, e) for e, c in kinds.items() if c >= min_count), reverse=True)


def memory_snapshot(
    args: argparse.Namespace, go: str, binary: Path, sc: Sidecar, pport: int, work: Path
) -> dict[str, Any]:
    """Where the memory of the scale phase goes: `scale_requests` one-connection clients wait
    5 s on the profiling sidecar (no relay); 3.5 s in, with every request in flight, the Go
    runtime's MemStats, the goroutine count, VmRSS and the heap profile are read."""
    n = args.scale_requests
    heap = work / "heap.pprof"
    snap: dict[str, Any] = {}

    def fetch(path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{pport}{path}", timeout=20) as r:
            data: bytes = r.read()
            return data

    async def main() -> Outcome:
        out = Outcome()
        clients = asyncio.gather(
            *(one_shot(sc.listen, f"/wait?first_byte=5s&id=m{i}", out, timeout=60) for i in range(n))
        )
        await asyncio.sleep(3.5)
        snap["rss_mib"] = mem_kib(sc.proc.pid, "VmRSS") / 1024
        text = (await asyncio.to_thread(fetch, "/debug/pprof/heap?debug=1")).decode()
        for line in text.splitlines():
            if line.startswith("# ") and " = " in line:
                k, _, v = line[2:].partition(" = ")
                if k in ("Sys", "HeapInuse", "HeapAlloc", "HeapSys", "NumGC", "HeapIdle"):
                    snap[k] = int(v.split()[0])
                elif k == "Stack":  # "# Stack = inuse / sys"
                    snap["StackInuse"] = int(v.split()[0])
        goroutines = (await asyncio.to_thread(fetch, "/debug/pprof/goroutine?debug=1")).decode()
        snap["goroutines"] = int(goroutines.split("total ", 1)[1].split()[0])
        snap["goroutine_kinds"] = goroutine_kinds(goroutines, min_count=n // 2)
        heap.write_bytes(await asyncio.to_thread(fetch, "/debug/pprof/heap"))
        await clients
        return out

    out = asyncio.run(asyncio.wait_for(main(), timeout=60))
    snap["ok"], snap["n"] = out.ok, n
    top = subprocess.run(
        [go, "tool", "pprof", "-sample_index=inuse_space", "-top", "-nodecount=10", str(binary), str(heap)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    snap["heap_top"] = [
        ln.strip() for ln in top.splitlines() if ln.strip() and ln.strip()[0].isdigit() and "%" in ln
    ][:10]
    return snap


def to_seconds(v: str) -> float:
    for suffix, mul in (("ms", 1e-3), ("us", 1e-6), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0), ("min", 60.0)):
        if v.endswith(suffix):
            return float(v[: -len(suffix)]) * mul
    return float(v)
