"""Soak: the real proxy under mixed traffic and recurring faults for a long time; nothing lost, nothing leaks.

Usage: ``.venv/bin/python bench/soak.py [--minutes 30 | --seconds S] [--fault-every S]
[--workers N] [--profiles DIR] [--no-readme]``. One proxy (the build cache's binary, ``-max-conn-age 30s``,
``-ping-interval 1s -ping-timeout 2s``) in front of the lab: a ``FaultRelay`` that drops
connections idle for 5 s, and behind it the lab's TLS HTTP/2 origin, which sends a graceful
GOAWAY on every connection every 20 s. Every ``--fault-every`` seconds (default: 180, or a
quarter of a shorter run) comes a fault, blackhole (4 s) and origin restart (2 s down) in turn.

Traffic (``--workers`` concurrent loops, one connection per request as aiohttp opens them):
long waits (``/slow``, 1-8 s to the first byte, body checked byte for byte), SSE (``/sse``, every
event checked), POSTs of random bodies up to 64 KiB (``/echo``: the origin's length and sha256 of
what it received must be the body's), and clients that leave a 20-s wait after up to 2 s.

Every completed 200 must be byte-exact (``mismatched`` must be 0); a 502 is allowed only while
a fault is on or within its detection time after (``ping_interval + ping_timeout`` plus slack);
a request that does not end by its own deadline is ``stuck`` (must be 0). The proxy writes its
traffic record (``-traffic-file``) and access log (``-access-log``, rotated at 16 MiB) as a
launched run does; after its drain, the final record's ``requests`` and the access log's lines
(every rotated file) must both equal the requests the soak sent. Every 5 s (2 s in
runs under 5 minutes) the proxy's RSS, descriptors, threads, goroutines (when its /metrics has
``go_goroutines``) and upstream connections are sampled; at minute 10 (or the middle of a
shorter run) and at the end, traffic pauses until nothing is in flight, one request leaves the
proxy one upstream connection (so both hold the same), and a quiet sample is taken: the
end's must be within 10 % of minute 10's (counts: 10 % or 1, whichever is more). With
``--profiles DIR`` the proxy runs with ``-pprof`` and each quiet sample also saves its heap
profile (live objects, after a GC) as ``DIR/heap-reference.pb.gz`` and ``DIR/heap-end.pb.gz``;
the report then carries ``go tool pprof -top -diff_base`` of the two (what the end holds that
the reference did not). Writes
``bench/results/soak.md``, ``bench/results/soak.svg`` (the samples over time, drawn here, no
plotting library) and the README section. Exit status 0 only if every check passed.

Must not touch bench/proxy.py, bind anything but loopback, or leave a process behind: the
proxy runs with ``-exit-with-pid`` and is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.readme import results_path, update_readme  # noqa: E402
from bench.soakplot import svg_plot  # noqa: E402
from sidecar_fsm.base import buildcache  # noqa: E402
from sidecar_fsm.lab import FaultRelay, TlsH2Origin  # noqa: E402
from sidecar_fsm.run import traffic  # noqa: E402

PING_INTERVAL, PING_TIMEOUT = 1.0, 2.0
DETECTION = PING_INTERVAL + PING_TIMEOUT + 3.0  # a 502 this long after a fault is still its own
GOAWAY_EVERY = 20.0
RELAY_IDLE = 5.0
TRAFFIC_FILE, ACCESS_LOG = "proxy.traffic.json", "proxy.access.log"


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    fault_windows: list[tuple[float, float]] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    sent: int = 0  # requests whose head reached the proxy's socket: what its record must count

    def in_fault(self, started: float, ended: float) -> bool:
        return any(start <= ended and started <= end + DETECTION for start, end in self.fault_windows)


# --- one request --------------------------------------------------------------------------------


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return status, b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def slow_body(delay: str, size: int) -> bytes:
    first = f"slow: first byte after {float(delay):g}s\n".encode()
    return (first + b"." * max(0, size - len(first)))[: max(size, 1)]


def sse_body(n: int) -> bytes:
    return b"".join(f"id: {i}\ndata: {json.dumps({'i': i, 'n': n})}\n\n".encode() for i in range(n))


def pick(rng: random.Random) -> tuple[str, str, bytes, Any, float]:
    """(kind, request line target, body, what to check the answer against, its own deadline)."""
    roll = rng.random()
    if roll < 0.35:
        delay, size = f"{rng.uniform(1, 8):.1f}", rng.randint(64, 20_000)
        return "wait", f"/slow?first_byte={delay}&size={size}", b"", slow_body(delay, size), float(delay)
    if roll < 0.55:
        n = rng.randint(2, 6)
        return "sse", f"/sse?n={n}&interval=0.5", b"", sse_body(n), n * 0.5
    if roll < 0.9:
        body = rng.randbytes(rng.randint(1, 64 * 1024))
        return "post", "/echo", body, (len(body), hashlib.sha256(body).hexdigest()), 0.0
    return "leave", "/slow?first_byte=20", b"", None, rng.uniform(0.2, 2.0)


def matches(kind: str, expected: Any, body: bytes) -> bool:
    if kind == "post":
        answer = json.loads(body)
        return bool((answer["body_length"], answer["body_sha256"]) == expected and answer["method"] == "POST")
    return bool(body == expected)


async def one_request(address: str, rng: random.Random, tally: Tally) -> bool:
    """One request of a random kind, its outcome tallied; False if it failed."""
    kind, target, body, expected, seconds = pick(rng)
    host, port = address.rsplit(":", 1)
    method = "POST" if body else "GET"
    head = f"{method} {target} HTTP/1.1\r\nHost: {address}\r\n"
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    started = time.monotonic()
    deadline = (seconds if kind == "leave" else seconds + DETECTION + 15.0) + 10.0
    writer: asyncio.StreamWriter | None = None
    try:
        reader, opened = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10)
        writer = opened
        opened.write(head.encode() + b"\r\n" + body)
        tally.sent += 1
        if kind == "leave":
            await asyncio.sleep(seconds)
            tally.outcomes["left"] += 1
            return True
        status, got = await asyncio.wait_for(read_response(reader), deadline)
    except asyncio.TimeoutError:
        tally.outcomes["stuck"] += 1
        tally.unexpected.append(f"stuck: {kind} {target} after {time.monotonic() - started:.1f}s")
        return False
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        # A response cut off after its 200 head (the upstream went away mid-stream) cannot be
        # turned into a 502; it is allowed only around a fault, like a 502.
        outcome = "truncated" if isinstance(error, asyncio.IncompleteReadError) else type(error).__name__
        record(tally, kind, outcome, started, f"{kind} {target}: {error!r}"[:200])
        return False
    finally:
        if writer is not None:
            writer.close()
    if status == 200:
        if matches(kind, expected, got):
            tally.outcomes[f"{kind} ok"] += 1
            return True
        tally.outcomes["mismatched"] += 1
        tally.unexpected.append(f"mismatched: {kind} {target}: {len(got)} bytes")
        return False
    record(tally, kind, str(status), started, f"{status} {kind} {target}: {got[:160]!r}")
    return False


def record(tally: Tally, kind: str, outcome: str, started: float, detail: str) -> None:
    if tally.in_fault(started, time.monotonic()):
        tally.outcomes[f"{outcome} in a fault"] += 1
    else:
        tally.outcomes[f"{outcome} outside faults"] += 1
        tally.unexpected.append(detail)


# --- the proxy's figures ------------------------------------------------------------------------


def one_probe(address: str) -> None:
    """One small request through the proxy, so that it holds one upstream connection."""
    with urllib.request.urlopen(f"http://{address}/echo", timeout=30) as response:
        response.read()


def scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def sample(pid: int, metrics_address: str, t: float) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    metrics = scrape(metrics_address)
    return {
        "t": round(t, 1),
        "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
        "goroutines": metrics.get("go_goroutines"),
        "upstream_connections": metrics["h2ping_upstream_connections"],
        "in_flight": metrics["h2ping_requests_in_flight"],
        "ping_timeouts": metrics['h2ping_upstream_errors_total{kind="ping_timeout"}'],
    }


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Lab:
    origin: TlsH2Origin
    relay: FaultRelay
    proxy: subprocess.Popen[bytes]
    listen: str
    metrics: str


def save_heap(metrics_address: str, path: Path) -> None:
    """The proxy's heap profile of live objects (``-pprof``: a GC first) into ``path``."""
    url = f"http://{metrics_address}/debug/pprof/heap?gc=1"
    with urllib.request.urlopen(url, timeout=30) as response:
        path.write_bytes(response.read())


def heap_diff(reference: Path, end: Path, lines: int = 15) -> str:
    """``go tool pprof -top -diff_base``: what the end's heap holds beyond the reference's."""
    go = buildcache.find_go()
    if go is None:
        return "go tool pprof: no go found"
    done = subprocess.run(
        [str(go), "tool", "pprof", "-top", "-sample_index=inuse_space", f"-diff_base={reference}", str(end)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        return f"go tool pprof failed ({done.returncode}): {done.stderr.strip()[-500:]}"
    return "\n".join(done.stdout.strip().splitlines()[: lines + 6])


def start_lab(work: Path, binary: Path | None = None, pprof: bool = False) -> Lab:
    binary = binary or buildcache.ensure_binary(buildcache.user_cache_dir())
    origin = TlsH2Origin().start()
    relay = FaultRelay("127.0.0.1", origin.port, idle=RELAY_IDLE).start()
    ready = work / "proxy.ready"
    argv = [str(binary), "-listen", "127.0.0.1:0", "-upstream", f"https://localhost:{relay.port}"]
    argv += ["-ca-file", str(origin.ca_file), "-ready-file", str(ready), "-metrics-listen", "127.0.0.1:0"]
    argv += ["-ping-interval", f"{PING_INTERVAL:g}s", "-ping-timeout", f"{PING_TIMEOUT:g}s"]
    argv += ["-max-conn-age", "30s", "-exit-with-pid", str(os.getpid())]
    argv += ["-pprof"] if pprof else []
    # The traffic record and the access log as a launched run writes them (issue 31): the
    # record is checked against the soak's own count at the end, and the access log rotates
    # at 16 MiB with enough backups that no line of two hours is cut away.
    argv += ["-traffic-file", str(work / TRAFFIC_FILE), "-access-log", str(work / ACCESS_LOG)]
    argv += ["-log-max-bytes", str(16 * 1024 * 1024), "-log-backups", "200"]
    with open(work / "proxy.log", "wb") as log:
        proxy = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if time.monotonic() > deadline or proxy.poll() is not None:
            raise SystemExit(f"soak: the proxy was not ready within 30s; see {work / 'proxy.log'}")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return Lab(origin, relay, proxy, info["listen"], info["metrics"])


async def run(args: argparse.Namespace, lab: Lab) -> dict[str, Any]:
    duration = args.seconds if args.seconds else args.minutes * 60.0
    fault_every = args.fault_every or min(180.0, duration / 4)
    # Minute 10; a short run's reference is its middle, once the Go heap has warmed up.
    reference_at = min(600.0, duration / 2)
    sample_every = 5.0 if duration >= 300 else 2.0
    tally, samples, quiet = Tally(), [], {}
    traffic = asyncio.Event()
    traffic.set()
    start = time.monotonic()
    end = start + duration
    rng = random.Random(args.seed)

    async def worker(index: int) -> None:
        own = random.Random(rng.random())
        while time.monotonic() < end:
            await traffic.wait()
            if not await one_request(lab.listen, own, tally):
                await asyncio.sleep(0.5)  # a client backs off after a failure, as Gym's retries do

    async def quiet_sample(name: str) -> None:
        traffic.clear()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (await asyncio.to_thread(scrape, lab.metrics))["h2ping_requests_in_flight"] == 0:
                break
            await asyncio.sleep(0.2)
        # Connections retired by age or GOAWAY close once their last stream ends; a quiet proxy
        # then holds none or one, by luck of the last GOAWAY's timing, and each holds a
        # goroutine and a descriptor (the 2-hour run of 2026-12-02 compared 0 with 1). One
        # request, then a settled one-connection state, makes both samples the same shape.
        for _ in range(5):
            await asyncio.sleep(1.0)
            await asyncio.to_thread(one_probe, lab.listen)
            tally.sent += 1
            await asyncio.sleep(0.5)
            settled = await asyncio.to_thread(scrape, lab.metrics)
            if settled["h2ping_upstream_connections"] == 1 and settled["h2ping_requests_in_flight"] == 0:
                break
        quiet[name] = await asyncio.to_thread(sample, lab.proxy.pid, lab.metrics, time.monotonic() - start)
        if args.profiles is not None:
            await asyncio.to_thread(save_heap, lab.metrics, args.profiles / f"heap-{name}.pb.gz")
        if name != "end":
            traffic.set()

    async def schedule() -> None:
        next_fault, next_goaway, next_sample = start + fault_every / 2, start + GOAWAY_EVERY, start
        took_reference, which = False, 0
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                samples.append(await asyncio.to_thread(sample, lab.proxy.pid, lab.metrics, now - start))
                next_sample += sample_every
            if not took_reference and now - start >= reference_at:
                await quiet_sample("reference")
                took_reference = True
            if now >= next_goaway:
                await asyncio.to_thread(lab.origin.goaway)
                next_goaway += GOAWAY_EVERY
            if now >= next_fault and end - now > DETECTION + 5:
                await fault(lab, tally, "blackhole" if which % 2 == 0 else "restart", start)
                which += 1
                next_fault += fault_every
            await asyncio.sleep(0.1)

    await asyncio.gather(schedule(), *(worker(i) for i in range(args.workers)))
    await quiet_sample("end")
    return {
        "duration_s": duration,
        "fault_every_s": fault_every,
        "reference_at_s": reference_at,
        "outcomes": dict(sorted(tally.outcomes.items())),
        "faults": tally.faults,
        "unexpected": tally.unexpected[:20],
        "samples": samples,
        "quiet": quiet,
        "origin": {"goaways": lab.origin.goaways, "connections": lab.origin.connections},
        "relay": {"idle_drops": lab.relay.drops, "connections": lab.relay.connections},
        "sent": tally.sent,
    }


def stop_proxy(proxy: subprocess.Popen[bytes]) -> None:
    """SIGTERM and the drain; the traffic file's last write happens after it."""
    if proxy.poll() is None:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(20)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait(5)


def read_outputs(work: Path) -> dict[str, Any]:
    """What the proxy wrote of its own traffic: the final record (read by the same parser the
    launcher imports it with) and the access log, every rotated file included."""
    out: dict[str, Any] = {}
    try:
        document = traffic.parse((work / TRAFFIC_FILE).read_bytes()).document
        shown = ("final", "requests", "responses_502", "client_disconnects", "goaways")
        out["record"] = {name: document[name] for name in shown}
    except (OSError, traffic.NotFigures) as exc:
        out["record_error"] = str(exc)
    lines = broken = 0
    files = sorted(work.glob(ACCESS_LOG + "*"))
    for path in files:
        for line in path.read_bytes().splitlines():
            lines += 1
            try:
                json.loads(line)
            except ValueError:
                broken += 1
    out["access_log"] = {"files": len(files), "lines": lines, "broken": broken}
    return out


async def fault(lab: Lab, tally: Tally, kind: str, start: float) -> None:
    began = time.monotonic()
    # Open-ended until the fault is over: a request failing during it is the fault's.
    tally.fault_windows.append((began, float("inf")))
    tally.faults.append((round(began - start, 1), kind))
    if kind == "blackhole":
        await asyncio.to_thread(lab.relay.blackhole)
        await asyncio.sleep(4.0)
        await asyncio.to_thread(lab.relay.heal)
    else:
        await asyncio.to_thread(lab.origin.go_down)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(lab.origin.come_back)
    tally.fault_windows[-1] = (began, time.monotonic())


# --- verdict and report -------------------------------------------------------------------------


def checks(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(what, figure, passed) for each promise of the soak."""
    outcomes = result["outcomes"]
    rows = [
        ("stuck requests", str(outcomes.get("stuck", 0)), outcomes.get("stuck", 0) == 0),
        (
            "in flight at the proxy when traffic paused (reference, end)",
            ", ".join(f"{q['in_flight']:g}" for q in result["quiet"].values()),
            all(q["in_flight"] == 0 for q in result["quiet"].values()),
        ),
        ("200s not byte-exact", str(outcomes.get("mismatched", 0)), outcomes.get("mismatched", 0) == 0),
        (
            "failures outside a fault",
            str(sum(v for k, v in outcomes.items() if k.endswith("outside faults"))),
            not any(k.endswith("outside faults") for k in outcomes),
        ),
    ]
    record, access = result.get("record"), result.get("access_log", {})
    rows.append(
        (
            "requests in the proxy's final traffic record vs sent by the soak",
            f"{record['requests']} vs {result['sent']}" if record else result.get("record_error", "none"),
            record is not None and bool(record["final"]) and record["requests"] == result["sent"],
        )
    )
    rows.append(
        (
            "access-log lines vs sent (lines not JSON)",
            f"{access.get('lines', 0)} vs {result['sent']} ({access.get('broken', 0)}; "
            f"{access.get('files', 0)} files)",
            access.get("lines") == result["sent"] and access.get("broken") == 0,
        )
    )
    ref, last = result["quiet"].get("reference"), result["quiet"].get("end")
    for key, unit in (("rss_mib", 0.0), ("fds", 1.0), ("upstream_connections", 1.0), ("goroutines", 1.0)):
        if ref is None or last is None or ref.get(key) is None or last.get(key) is None:
            rows.append((f"{key} at the end vs reference", "not measured", key == "goroutines"))
            continue
        allowed = max(0.10 * ref[key], unit)
        rows.append(
            (
                f"{key} at the end vs reference (within 10 %)",
                f"{last[key]:g} vs {ref[key]:g}",
                abs(last[key] - ref[key]) <= allowed,
            )
        )
    return rows


def report(result: dict[str, Any], command: str, svg_name: str) -> str:
    rows = checks(result)
    outcomes = ", ".join(f"{k} {v}" for k, v in result["outcomes"].items())
    faults = ", ".join(f"{kind} at {t:g}s" for t, kind in result["faults"]) or "none"
    lines = [
        f"`{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average "
        f"{os.getloadavg()[0]:.2f} at the end): {result['duration_s'] / 60:g} min, faults every "
        f"{result['fault_every_s']:g} s ({faults}); origin GOAWAYs {result['origin']['goaways']}, "
        f"relay idle drops {result['relay']['idle_drops']}.",
        "",
        f"Requests: {outcomes}.",
        "",
        "| check | figure | pass? |",
        "|---|--:|--:|",
        *[f"| {what} | {figure} | {'yes' if ok else 'NO'} |" for what, figure, ok in rows],
        "",
        f"OS threads (not goroutines) at the reference and the end: "
        f"{result['quiet']['reference']['threads']} and {result['quiet']['end']['threads']}."
        if "reference" in result["quiet"]
        else "",
        f"Over time: [results/{svg_name}](results/{svg_name}); every sample: `--json FILE.json`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=0.0, help="overrides --minutes (short runs)")
    parser.add_argument("--fault-every", type=float, default=0.0, help="seconds; default 180 or a quarter")
    parser.add_argument("--workers", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-readme", action="store_true", help="print only; write no results")
    parser.add_argument("--json", type=Path, help="also write the whole result here")
    parser.add_argument("--binary", type=Path, help="the proxy (default: the build cache's)")
    parser.add_argument(
        "--profiles", type=Path, help="run the proxy with -pprof; save and compare heap profiles here"
    )
    args = parser.parse_args(argv)
    if args.profiles is not None:
        args.profiles.mkdir(parents=True, exist_ok=True)
    given = list(argv if argv is not None else sys.argv[1:])
    # Paths are this machine's: the committed report names their role, never a path.
    for index, word in enumerate(given[:-1]):
        if word in ("--profiles", "--json"):
            given[index + 1] = "DIR" if word == "--profiles" else "FILE.json"
    command = "python bench/soak.py " + " ".join(given)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        lab = start_lab(work, args.binary, pprof=args.profiles is not None)
        try:
            result = asyncio.run(run(args, lab))
        finally:
            stop_proxy(lab.proxy)
            lab.relay.stop()
            lab.origin.stop()
        result.update(read_outputs(work))
    rows = checks(result)
    summary = report(result, command.strip(), "soak.svg")
    if args.profiles is not None and {"reference", "end"} <= result["quiet"].keys():
        diff = heap_diff(args.profiles / "heap-reference.pb.gz", args.profiles / "heap-end.pb.gz")
        result["heap_diff"] = diff
        summary += f"\n\nHeap at the end minus the reference (live objects after a GC):\n\n```\n{diff}\n```"
    print(summary)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    if not args.no_readme:
        results = results_path("soak")
        results.with_suffix(".svg").write_text(svg_plot(result))
        results.write_text(
            "# Soak\n\n"
            + summary
            + "\n\n![samples over time](soak.svg)\n\n"
            + "Every sample: the run's `--json FILE.json`, not committed.\n"
        )
        update_readme("soak", summary)
    return 0 if all(ok for _, _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
