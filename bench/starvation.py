"""Starvation does not fail healthy waits: thousands of long waits through the idle relay while
busy loops hold every core, with a short ``-ping-timeout``; no PING timeout, no 502.

Usage: ``.venv/bin/python bench/starvation.py [--requests 3000] [--wait 30] [--busy 3]
[--ping-interval 1s] [--ping-timeout 2s] [--relay-idle 5] [--no-readme]``. In a process of its
own (so the client's event loop does not starve it further), the lab's TLS HTTP/2 origin behind
the lab's ``IdleRelay``, which drops any connection silent for ``--relay-idle`` seconds: a wait
longer than that survives only if the proxy's PINGs keep its connection busy. The proxy is the
build cache's binary, in front of the relay. ``--busy`` CPU-bound loops start first; then every
wait is connected, then every request written (one connection each, as aiohttp opens them: the
proxy holds them all at once), and each must answer 200 after ``--wait`` seconds. A PING
timeout or a 502 here is false: the upstream is alive, only the machine is slow. Prints a
table; writes ``bench/results/starvation.md`` and the README section. Exit status 0 only if
every wait got its 200 and no PING timed out.

Must not bind anything but loopback or leave a process behind (``Children`` ends them all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness.binaries import sidecar_binary  # noqa: E402
from bench.harness.busy import busy_loops  # noqa: E402
from bench.harness.children import Children, raise_nofile  # noqa: E402
from bench.harness.tables import load_average, markdown_table, text_table  # noqa: E402
from bench.harness.waits import BenchError, wait_until  # noqa: E402
from bench.latepings import LOST, scrape, waits  # noqa: E402
from bench.readme import results_path, update_readme  # noqa: E402

# The lab's origin behind its idle relay, in a process of its own: prints where the relay is
# and the CA, serves until stdin closes, then prints what the relay and the origin saw.
LAB = """
import json, sys
from pathlib import Path
from sidecar_fsm.lab import IdleRelay, TlsH2Origin, make_ca_and_cert
certs = make_ca_and_cert(Path(sys.argv[1]))
with TlsH2Origin(certs) as origin:
    relay = IdleRelay("127.0.0.1", origin.port, idle=float(sys.argv[2])).start()
    try:
        print(json.dumps({"relay": relay.port, "ca": str(certs.ca_pem)}), flush=True)
        sys.stdin.read()
        print(json.dumps({"idle_drops": relay.drops, "relay_connections": relay.connections}), flush=True)
    finally:
        relay.stop()
"""


def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    binary = sidecar_binary()
    with busy_loops(args.busy), Children() as kids:
        lab = kids.start(
            [sys.executable, "-c", LAB, str(work / "ca"), str(args.relay_idle)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert lab.stdout is not None and lab.stdin is not None
        ready, _, _ = select.select([lab.stdout], [], [], 60)
        if not ready:
            raise BenchError("starvation: the lab did not start within 60 s")
        info = json.loads(lab.stdout.readline())
        ready_file, log = work / "proxy.ready", work / "proxy.log"
        with open(log, "wb") as log_out:
            kids.start(
                [
                    str(binary),
                    "-listen",
                    "127.0.0.1:0",
                    "-upstream",
                    f"https://localhost:{info['relay']}",
                    "-ca-file",
                    info["ca"],
                    "-ready-file",
                    str(ready_file),
                    "-metrics-listen",
                    "127.0.0.1:0",
                    "-ping-interval",
                    args.ping_interval,
                    "-ping-timeout",
                    args.ping_timeout,
                    "-exit-with-pid",
                    str(os.getpid()),
                ],
                stderr=log_out,
            )
        wait_until(ready_file.exists, 30, "the proxy's ready file")
        proxy = json.loads(ready_file.read_text())
        load_before = load_average()
        began = time.monotonic()
        path = f"/slow?first_byte={args.wait:g}"
        outcomes = asyncio.run(waits(proxy["listen"], args.requests, path, args.wait, None))
        took = time.monotonic() - began
        load_after = load_average()
        metrics = scrape(proxy["metrics"])
        lab.stdin.close()
        relay = json.loads(lab.stdout.readline() or "{}")
    lost = [match.group(0) for match in LOST.finditer(log.read_text(errors="replace"))]
    return {
        "outcomes": dict(outcomes),
        "took_s": round(took, 1),
        "load": f"{load_before} -> {load_after}",
        "pings_sent": metrics["h2ping_pings_sent_total"],
        "ping_acks": metrics["h2ping_ping_acks_total"],
        "ping_timeouts": metrics['h2ping_upstream_errors_total{kind="ping_timeout"}'],
        "upstream_dials": sum(v for k, v in metrics.items() if k.startswith("h2ping_upstream_dials_total")),
        "idle_drops": relay.get("idle_drops"),
        "lost_pings": lost[:5],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to each first byte")
    parser.add_argument("--busy", type=int, default=3, help="CPU-bound loops running meanwhile")
    parser.add_argument("--ping-interval", default="1s")
    parser.add_argument("--ping-timeout", default="2s")
    parser.add_argument("--relay-idle", type=float, default=5.0, help="the relay's idle limit (s)")
    parser.add_argument("--no-readme", action="store_true", help="print only; write no results")
    args = parser.parse_args(argv)
    raise_nofile()
    with tempfile.TemporaryDirectory(prefix="starvation-") as tmp:
        result = run(args, Path(tmp))
    outcomes = result["outcomes"]
    assert isinstance(outcomes, dict)
    ok = int(outcomes.get("ok", 0))
    bad_gateway = sum(int(n) for what, n in outcomes.items() if str(what).startswith("502"))
    other = args.requests - ok - bad_gateway
    passed = ok == args.requests and result["ping_timeouts"] == 0
    header = ["waits", "200", "502", "other", "PING timeouts", "PINGs sent", "acks", "idle drops", "wall (s)"]
    row = [
        str(args.requests),
        str(ok),
        str(bad_gateway),
        str(other),
        f"{result['ping_timeouts']:g}",
        f"{result['pings_sent']:g}",
        f"{result['ping_acks']:g}",
        str(result["idle_drops"]),
        f"{result['took_s']:g}",
    ]
    print(text_table(header, [row]))
    print(json.dumps(result))
    command = (
        f"python bench/starvation.py --requests {args.requests} --wait {args.wait:g} --busy {args.busy} "
        f"--ping-interval {args.ping_interval} --ping-timeout {args.ping_timeout} "
        f"--relay-idle {args.relay_idle:g}"
    )
    report = "\n".join(
        [
            f"`{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
            f"{args.busy} busy loops, load average "
            f"{result['load']}): {'pass' if passed else 'FAIL'}.",
            "",
            markdown_table(header, [row]),
            "",
            *([f"Other outcomes: {outcomes}."] if other else []),
            *([f"Lost PINGs (the proxy's log): {result['lost_pings']}."] if result["lost_pings"] else []),
        ]
    )
    details = json.dumps(result, indent=1)
    if not args.no_readme:
        results_path("starvation").write_text(f"# Starvation\n\n{report}\n\n```json\n{details}\n```\n")
        update_readme("starvation", report)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
