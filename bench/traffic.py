"""What the traffic record and the access log cost the proxy (issue 28): requests/s and CPU per
request at c=16 with both off and both on, beside a second "off" sidecar for the noise floor;
then 10,000 concurrent 10-s waits with the access log off and on: every line written, peak RSS.

Owns this one comparison only; the building blocks (origin, sidecar start, wrk, /proc readings,
the held waits, child cleanup, the build cache) are bench/harness's and bench/proxy_phases/
scale.py's. The c=16 sidecars run side by side against one origin in interleaved rounds whose
order rotates, so the machine's noise falls on each alike; figures are medians over the rounds.
Writes the report to bench/results/traffic.md and its table, with the command, into
bench/README.md (bench:traffic).

Must not touch go/ (the binary comes from the build cache), bind anything but loopback, or leave
a process behind: every child is ended in a finally.

Run: .venv/bin/python bench/traffic.py [--reps 5] [--duration 3] [--no-readme]   (about 2 minutes)
Needs wrk (apt-get install -y wrk) and Go (.venv/bin/go).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.harness.binaries import go_tool, origin_binary, sidecar_binary  # noqa: E402
from bench.harness.children import Children  # noqa: E402
from bench.harness.rounds import Rounds, go_bench_ns, interleaved_rounds  # noqa: E402
from bench.harness.tables import load_average  # noqa: E402
from bench.harness.targets import start_origin, start_sidecar, wrk_script  # noqa: E402
from bench.harness.waits import BenchError  # noqa: E402
from bench.proxy_phases.scale import scale_once  # noqa: E402
from bench.readme import update_readme  # noqa: E402

REPORT = REPO / "bench" / "results" / "traffic.md"
# "off-again" is a second sidecar like "off": the spread between the two is the noise floor of
# this machine, against which the cost of "on" must be read.
MODES = ("off", "on", "off-again")
# Issue 28: the cost within the noise floor; at scale, peak RSS within 10 % of the run without.
RSS_TARGET = 0.10


def mode_flags(mode: str, work: Path) -> tuple[str, ...]:
    """Every sidecar has -metrics-listen, as the launcher starts them (metrics: true), so "on"
    differs from "off" by exactly the two new outputs. The record is rewritten every second
    (30 times the default) so that its writes fall inside the rounds."""
    flags: tuple[str, ...] = ("-metrics-listen", "127.0.0.1:0")
    if mode == "on":
        flags += ("-traffic-file", str(work / "on.traffic.json"), "-traffic-interval", "1s")
        flags += ("-access-log", str(work / "on.access.log"))
    return flags


@dataclass
class Measured:
    rounds: Rounds
    lines: int  # access log lines of "on" after its drain
    record: dict[str, Any]  # its final traffic record


def measure(args: argparse.Namespace, wrk: str, kids: Children, work: Path) -> Measured:
    binary = sidecar_binary()
    lua = wrk_script(work)
    origin = start_origin(kids, origin_binary(), work)
    sidecars = {
        mode: start_sidecar(
            kids, binary, work, origin.tls, origin.ca, *mode_flags(mode, work), name=f"sidecar-{mode}"
        )
        for mode in MODES
    }
    rounds = interleaved_rounds(
        wrk, lua, sidecars, origin.proc.pid, reps=args.reps, duration=args.duration, conns=args.conns
    )
    if kids.stop(sidecars["on"].proc) != 0:
        raise BenchError("sidecar-on: did not exit 0 after SIGTERM")
    lines = sum(1 for _ in (work / "on.access.log").open())
    record = json.loads((work / "on.traffic.json").read_text())
    kids.stop(origin.proc)
    return Measured(rounds, lines, record)


def scale_pair(args: argparse.Namespace, kids: Children, work: Path) -> dict[str, dict[str, Any]]:
    """The 10,000-wait scale run twice, access log off then on; both with -traffic-file (the
    launcher always passes it), so the access log is the one difference."""
    out: dict[str, dict[str, Any]] = {}
    for mode in ("off", "on"):
        flags = ["-traffic-file", str(work / f"scale-{mode}.traffic.json")]
        if mode == "on":
            flags += ["-access-log", str(work / "scale-on.access.log")]
        res = scale_once(
            kids,
            work,
            sidecar_binary(),
            origin_binary(),
            args.scale_requests,
            args.scale_wait,
            f"sidecar-scale-{mode}",
            extra_flags=flags,
        )
        if mode == "on":
            statuses: dict[int, int] = {}
            with (work / "scale-on.access.log").open() as f:
                for line in f:
                    status = json.loads(line)["status"]
                    statuses[status] = statuses.get(status, 0) + 1
            res["lines"] = sum(statuses.values())
            res["statuses"] = statuses
        out[mode] = res
    return out


def rows(m: Measured, scale: dict[str, dict[str, Any]], n: int) -> tuple[list[str], float]:
    med_rps, med_cpu = m.rounds.medians()
    paired = m.rounds.paired("off")
    noise = m.rounds.noise("off", "off-again")
    out = [
        "| c=16 | req/s (median) | ratio to off | CPU µs/req (median) | ratio to off"
        " | per-round ratios, median (req/s, CPU) | target | pass? |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for mode in MODES:
        r_rps, r_cpu = med_rps[mode] / med_rps["off"], med_cpu[mode] / med_cpu["off"]
        target, ok = "", ""
        if mode == "on":
            target = f"within the floor ({noise:.1%})"
            ok = "yes" if r_rps >= 1 - noise and r_cpu <= 1 + noise else "NO"
        elif mode == "off-again":
            target = "noise floor"
        out.append(
            f"| {mode} | {med_rps[mode]:,.0f} | {r_rps:.3f} | {med_cpu[mode]:.1f} | {r_cpu:.3f} "
            f"| {paired[mode][0]:.3f}, {paired[mode][1]:.3f} | {target} | {ok} |"
        )
    off, on = scale["off"], scale["on"]
    rss_ratio = on["peak_rss_mib"] / off["peak_rss_mib"]
    wait = off["wait"]
    out += [
        "",
        f"| {n:,} x {wait} waits | access log off | access log on | ratio | target | pass? |",
        "|---|--:|--:|--:|--:|--:|",
        f"| answered ok | {off['ok']:,} | {on['ok']:,} |  | all"
        f" | {'yes' if off['ok'] == on['ok'] == n else 'NO'} |",
        f"| lost / duplicated | {off['lost']}/{off['dup']} | {on['lost']}/{on['dup']} |  | 0/0"
        f" | {'yes' if off['lost'] + off['dup'] + on['lost'] + on['dup'] == 0 else 'NO'} |",
        f"| access log lines (status 200) | - | {on['lines']:,} ({on['statuses'].get(200, 0):,}) |  | {n:,}"
        f" | {'yes' if on['lines'] == n == on['statuses'].get(200, 0) else 'NO'} |",
        f"| peak RSS MiB | {off['peak_rss_mib']:.1f} | {on['peak_rss_mib']:.1f} | {rss_ratio:.3f}x"
        f" | <= {1 + RSS_TARGET:.2f}x | {'yes' if rss_ratio <= 1 + RSS_TARGET else 'NO'} |",
        f"| proxy CPU s | {off['cpu_s']:.2f} | {on['cpu_s']:.2f} | {on['cpu_s'] / off['cpu_s']:.2f}x |  |  |",
        f"| p99 s | {off['p99_s']:.2f} | {on['p99_s']:.2f} |  |  |  |",
    ]
    return out, noise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved c=16 rounds (default 5)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run (default 3)")
    parser.add_argument("--conns", type=int, default=16, help="wrk connections (default 16)")
    parser.add_argument("--scale-requests", type=int, default=10_000, help="concurrent waits (default 10000)")
    parser.add_argument("--scale-wait", default="10s", help="each wait's first byte after (default 10s)")
    parser.add_argument("--out", type=Path, default=REPORT, help=f"full report (default {REPORT})")
    parser.add_argument(
        "--no-readme", action="store_true", help="do not write the table into bench/README.md"
    )
    args = parser.parse_args(argv)
    wrk = shutil.which("wrk")
    if wrk is None:
        print("bench: wrk not installed; apt-get update && apt-get install -y wrk", file=sys.stderr)
        return 2
    command = " ".join([".venv/bin/python bench/traffic.py", *(sys.argv[1:] if argv is None else argv)])
    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="bench-traffic-"))
    try:
        with Children() as kids:
            rounds = measure(args, wrk, kids, work)
            scale = scale_pair(args, kids, work)
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ns = go_bench_ns(go_tool(), "AccessLog")
    line_ns = ns["AccessLog/logged"] - ns["AccessLog/counted"]
    med_cpu_off = statistics.median(rounds.rounds.cpu["off"])
    table, noise = rows(rounds, scale, args.scale_requests)
    rec = rounds.record
    summary = [
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_before}"
        f" before, {load_average()} after): {args.reps} interleaved rounds of {args.duration:g} s, wrk"
        f" -c{args.conns}, three sidecars against one origin, the order rotated each round.",
        "",
        "off: `-metrics-listen` only (as the launcher starts every proxy); on: the same plus"
        " `-traffic-file` rewritten every second (30 x the default) and `-access-log`; off-again:"
        ' a second "off", whose distance from off is this machine\'s noise floor'
        f" ({noise:.1%} this run, the larger of its two ratios' distances from 1).",
        "",
        *table,
        "",
        f'After its drain the "on" sidecar\'s access log held {rounds.lines:,} lines and its final'
        f" traffic record {rec['requests']:,} requests (final: {str(rec['final']).lower()}):"
        f" {'the same count' if rounds.lines == rec['requests'] else 'NOT the same count'}.",
        "Go benchmark (go/accesslog_test.go, median of 5): a counted request"
        f" {ns['AccessLog/counted']:.0f} ns,"
        f" with its access line {ns['AccessLog/logged']:.0f} ns: the line costs {line_ns:.0f} ns, about"
        f" {line_ns / 1000 / med_cpu_off * 100:.1f} % of the proxy's CPU per request (off, above).",
        "The scale rows: both sidecars with `-traffic-file`, the access log the one difference;"
        " bench/proxy_phases/scale.py's waits behind a relay that drops connections idle 3 s.",
    ]
    text = "\n".join(
        ["# What the traffic record and the access log cost (bench/traffic.py)", "", *summary, ""]
    )
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(
        json.dumps({"rps": rounds.rounds.rps, "cpu": rounds.rounds.cpu, "scale": scale}, indent=1)
    )
    print(text)
    if not args.no_readme:
        update_readme(
            "traffic",
            "\n".join([*summary, "", "Per-round figures: [results/traffic.json](results/traffic.json)."]),
        )
        print("table written to bench/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
