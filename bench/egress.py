"""What the egress proxy's tunnel costs (issue 24): requests/s and CPU per request at c=16, the
upstream dialled directly and through a CONNECT tunnel in a local tinyproxy.

Owns this one comparison only; the building blocks (origin, sidecar start, wrk, /proc readings,
child cleanup) are bench/harness's. Four sidecars run side by side against one origin, named
``https://0.0.0.0:PORT`` (Go proxies it, unlike a loopback address; Linux connects it to the local
host): "tinyproxy" with HTTPS_PROXY set to a tinyproxy, "go-relay" to a minimal Go CONNECT proxy
built here (the tunnel's own cost, without a proxy's), "direct" and "direct-again" with NO_PROXY
naming the upstream (the second's distance from the first is the noise of the machine). They are measured
in interleaved rounds whose order rotates; figures are medians over the rounds. tinyproxy's own CPU
per request is measured beside the sidecar's: it is what the tunnel adds on the host. Writes the
report to bench/results/egress.md and its table, with the command, into bench/README.md
(bench:egress).

Must not touch go/ (it builds into a temp dir), bind anything but loopback, or leave a process
behind: every child is ended in a finally.

Run: .venv/bin/python bench/egress.py [--reps 5] [--duration 3] [--no-readme]   (about 90 s)
Needs wrk and tinyproxy (apt-get install -y wrk tinyproxy) and Go (.venv/bin/go).
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.harness.binaries import cached_program, go_tool, origin_binary, sidecar_binary  # noqa: E402
from bench.harness.children import Children, cpu_seconds, free_port  # noqa: E402
from bench.harness.targets import WRK_LUA, run_wrk, start_origin, start_sidecar  # noqa: E402
from bench.harness.waits import BenchError, wait_until  # noqa: E402
from bench.readme import update_readme  # noqa: E402

REPORT = REPO / "bench" / "results" / "egress.md"
MODES = ("direct", "tinyproxy", "go-relay", "direct-again")
_TINYPROXY_ATTEMPTS = 5

# A minimal CONNECT proxy (Go standard library, built into the temp dir): the tunnel with no
# proxy of note in it, so the "go-relay" row tells what the tunnel itself costs and the
# "tinyproxy" row what that proxy adds. It exits when its stdin (a pipe we never write) closes.
GO_CONNECT_PROXY = r"""package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr())
	go func() { io.Copy(io.Discard, os.Stdin); os.Exit(0) }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go tunnel(c)
	}
}

func tunnel(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	up, err := net.Dial("tcp", req.Host)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { io.Copy(up, br); up.Close() }()
	io.Copy(c, up)
}
"""


def start_go_relay(kids: Children, work: Path) -> str:
    """Build and start GO_CONNECT_PROXY; its listen address."""
    src = work / "connect-proxy"
    src.mkdir()
    (src / "go.mod").write_text("module connectproxy\n\ngo 1.24\n")
    (src / "main.go").write_text(GO_CONNECT_PROXY)
    relay = cached_program(src, "connect-proxy")
    p = kids.start([str(relay)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], 10)
    line = p.stdout.readline().decode().strip() if ready else ""
    if not line:
        raise BenchError("connect-proxy: no address line within 10s")
    return line


def start_tinyproxy(kids: Children, tinyproxy: str, work: Path) -> tuple[int, int, Path]:
    """tinyproxy on a free loopback port: (pid, port, log). It has no port 0, so a port lost to a
    race between our probe and its bind is retried with another."""
    for attempt in range(_TINYPROXY_ATTEMPTS):
        port, log = free_port(), work / f"tinyproxy-{attempt}.log"
        conf = work / f"tinyproxy-{attempt}.conf"
        # No ConnectPort line: CONNECT to any port (the origin's is random). Timeout above any
        # pause between rounds, so the tunnel is the same one all run long.
        conf.write_text(
            f'Port {port}\nListen 127.0.0.1\nTimeout 3600\nLogFile "{log}"\nLogLevel Info\n'
            "MaxClients 100\nAllow 127.0.0.1\n"
        )
        p = kids.start([tinyproxy, "-d", "-c", str(conf)])

        def settled(p: subprocess.Popen[bytes] = p, log: Path = log) -> bool:
            return p.poll() is not None or (
                log.exists() and "Accepting connections" in log.read_text(errors="replace")
            )

        wait_until(settled, 10, "tinyproxy")
        if p.poll() is None:
            return p.pid, port, log
    raise BenchError(f"tinyproxy: did not start in {_TINYPROXY_ATTEMPTS} attempts; see {work}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run (default 3)")
    parser.add_argument("--conns", type=int, default=16, help="wrk connections (default 16)")
    parser.add_argument("--c1-reps", type=int, default=3, help="rounds of 2 s at c=1 for latency (default 3)")
    parser.add_argument(
        "--no-readme",
        action="store_true",
        help="a trial run: write neither bench/README.md nor bench/results/egress.md",
    )
    args = parser.parse_args(argv)
    wrk, tinyproxy = shutil.which("wrk"), shutil.which("tinyproxy")
    if wrk is None or tinyproxy is None:
        print(
            "bench: needs wrk and tinyproxy; apt-get update && apt-get install -y wrk tinyproxy",
            file=sys.stderr,
        )
        return 2
    go_tool()  # fails here, naming what to install, before anything starts
    command = " ".join([".venv/bin/python bench/egress.py", *(sys.argv[1:] if argv is None else argv)])
    load_before = Path("/proc/loadavg").read_text().split()[0]
    kids = Children()
    work = Path(tempfile.mkdtemp(prefix="bench-egress-"))
    try:
        origin_bin, sidecar_bin = origin_binary(), sidecar_binary()
        lua = work / "report.lua"
        lua.write_text(WRK_LUA)
        origin = start_origin(kids, origin_bin, work)
        upstream = "0.0.0.0:" + origin.tls.rsplit(":", 1)[1]
        tp_pid, tp_port, tp_log = start_tinyproxy(kids, tinyproxy, work)
        base = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "no_proxy")}
        go_relay = start_go_relay(kids, work)
        proxy = {"HTTPS_PROXY": f"http://127.0.0.1:{tp_port}"}
        envs = {
            "direct": {**base, **proxy, "NO_PROXY": "0.0.0.0"},
            "tinyproxy": {**base, **proxy},
            "go-relay": {**base, "HTTPS_PROXY": f"http://{go_relay}"},
            "direct-again": {**base, **proxy, "NO_PROXY": "0.0.0.0"},
        }
        sidecars = {
            mode: start_sidecar(
                kids,
                sidecar_bin,
                work,
                upstream,
                origin.ca,
                env=envs[mode],
                name=f"sidecar-{mode}",
            )
            for mode in MODES
        }
        for sc in sidecars.values():  # warm up: connections, TLS sessions, heaps
            run_wrk(wrk, lua, sc.listen, args.conns, 1, sc.proc.pid, origin.proc.pid)
        tunnels = tp_log.read_text(errors="replace").count("Established connection to host")
        if tunnels != 1:
            raise BenchError(f"tinyproxy opened {tunnels} tunnels after warm-up; want 1 (its sidecar's)")
        rps: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        p99: dict[str, list[float]] = {m: [] for m in MODES}
        tp_cpu: list[float] = []
        for rep in range(args.reps):
            for mode in MODES[rep % len(MODES) :] + MODES[: rep % len(MODES)]:
                sc = sidecars[mode]
                t0 = cpu_seconds(tp_pid)
                r = run_wrk(wrk, lua, sc.listen, args.conns, args.duration, sc.proc.pid, origin.proc.pid)
                if r.errors:
                    print(f"bench: {mode}: {r.errors} wrk errors", file=sys.stderr)
                    return 1
                rps[mode].append(r.rps)
                cpu[mode].append(r.cpu_us_per_req)
                p99[mode].append(r.p99_ms)
                if mode == "tinyproxy":
                    tp_cpu.append((cpu_seconds(tp_pid) - t0) / (r.rps * args.duration) * 1e6)
        # One request at a time: the latency a hop adds, which at c=16 hides in the queueing.
        c1_p50: dict[str, list[float]] = {m: [] for m in MODES}
        for rep in range(args.c1_reps):
            for mode in MODES[rep % len(MODES) :] + MODES[: rep % len(MODES)]:
                sc = sidecars[mode]
                c1_p50[mode].append(run_wrk(wrk, lua, sc.listen, 1, 2, sc.proc.pid, origin.proc.pid).p50_ms)
    finally:
        kids.close()
    med = {
        m: (statistics.median(rps[m]), statistics.median(cpu[m]), statistics.median(p99[m])) for m in MODES
    }
    d_rps, d_cpu, _ = med["direct"]
    rows = [
        "| route | req/s (median) | ratio to direct | per-round ratio, median | sidecar CPU µs/req"
        " | ratio to direct | p99 ms | p50 ms at c=1 | tinyproxy CPU µs/req |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for m in MODES:
        m_rps, m_cpu, m_p99 = med[m]
        # A round's runs are seconds apart, so load drifting over minutes cancels out of it.
        paired = statistics.median(a / b for a, b in zip(rps[m], rps["direct"], strict=True))
        extra = f"{statistics.median(tp_cpu):.1f}" if m == "tinyproxy" else "-"
        rows.append(
            f"| {m} | {m_rps:,.0f} | {m_rps / d_rps:.3f} | {paired:.3f} | {m_cpu:.1f} | {m_cpu / d_cpu:.3f}"
            f" | {m_p99:.2f} | {statistics.median(c1_p50[m]):.2f} | {extra} |"
        )
    load_after = Path("/proc/loadavg").read_text().split()[0]
    summary = "\n".join(
        [
            f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_before}"
            f" before, {load_after} after): {args.reps} interleaved rounds of {args.duration:g} s, wrk"
            f" -c{args.conns}, four sidecars against one origin (`https://0.0.0.0:PORT`), the order rotated"
            " each round. tinyproxy: HTTPS_PROXY to a local tinyproxy (one CONNECT tunnel carries the h2"
            " connection); go-relay: the same through a minimal Go CONNECT proxy (the tunnel's own cost);"
            " direct, direct-again: NO_PROXY names the upstream (their distance is the noise floor)."
            " CPU per request: the process's utime+stime over the run / requests. p50 at c=1: median of"
            f" {args.c1_reps} rounds of 2 s with one connection.",
            "",
            *rows,
        ]
    )
    print(summary)
    shutil.rmtree(work, ignore_errors=True)
    if args.no_readme:  # a trial run: the figures of record stay as they are
        return 0
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    per_round = "\n".join(
        f"- {m}: req/s {', '.join(f'{v:,.0f}' for v in rps[m])}; sidecar CPU µs/req"
        f" {', '.join(f'{v:.1f}' for v in cpu[m])}"
        for m in MODES
    )
    REPORT.write_text(
        "# What the egress proxy's tunnel costs (bench/egress.py)\n\n" + summary + "\n\nPer round:\n\n"
        f"{per_round}\n- tinyproxy CPU µs/req (its rounds): {', '.join(f'{v:.1f}' for v in tp_cpu)}\n"
    )
    update_readme("egress", summary + "\n\nPer-round figures: [results/egress.md](results/egress.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
