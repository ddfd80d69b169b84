"""What a proxy benchmark measures against: the bench origin, a sidecar, HAProxy, and wrk.

Owns starting each of them as a child of a ``Children`` (so it is ended with the rest) and
waiting until it serves: the origin prints its addresses on stdout, the sidecar renames its
ready file in, HAProxy's port accepts a connection. ``run_wrk`` is one wrk run with the CPU
the measured process spent meanwhile. Must not bind anything but loopback.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.children import Children, cpu_seconds, free_port
from bench.harness.waits import BenchError, wait_until

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


def need_tool(name: str) -> str:
    """The path of ``name`` on PATH; ``BenchError`` with the install line when it is missing."""
    found = shutil.which(name)
    if found is None:
        raise BenchError(f"{name}: not installed; {INSTALL_HINT}")
    return found


def wrk_script(work: Path) -> Path:
    """wrk's Lua report script (one JSON line: requests, latency percentiles, errors)."""
    lua = work / "report.lua"
    lua.write_text(WRK_LUA)
    return lua


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


def start_gym_sidecar(kids: Children, binary: Path, work: Path, upstream: str, name: str = "gym") -> Sidecar:
    """A proxy with NeMo Gym's contract (tests/gymproxy): Gym's flags only, a fixed port (its
    ready file is a bare pid, which names no port), the origin's certificate not verified
    (Gym's proxy has no -ca-file). Ended with ``kids``: it has no -exit-with-pid either."""
    ready = work / f"{name}.ready"
    ready.unlink(missing_ok=True)
    listen = f"127.0.0.1:{free_port()}"
    argv = [str(binary), "-listen", listen, "-upstream", f"https://{upstream}", "-insecure-skip-verify"]
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - handed to the child, closed below
    try:
        p = kids.start([*argv, "-ready-file", str(ready)], stderr=log)
    finally:
        log.close()
    wait_until(lambda: p.poll() is None and ready.exists() or p.poll() is not None, 10, "gym ready file")
    if p.poll() is not None:
        raise BenchError(f"{binary}: exited with {p.returncode} before ready")
    return Sidecar(p, listen)


def start_haproxy(
    kids: Children, work: Path, origin_addr: str, ca: str, threads: int, name: str = "haproxy"
) -> tuple[subprocess.Popen[bytes], str]:
    """HAProxy as an HTTP/1.1 -> h2-over-TLS proxy, configured to be fair and at its best: as
    many threads as the sidecar has GOMAXPROCS, certificate verified like the sidecar does,
    connections to the origin shared by all clients (http-reuse always, the sidecar's model)."""
    haproxy = need_tool("haproxy")
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
