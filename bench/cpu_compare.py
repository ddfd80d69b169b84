"""Two (or more) sidecar binaries side by side in one run: CPU µs per request, requests/s, p50,
p99 and peak RSS under wrk keep-alive GET / at c=16 and c=128 (issue 38's table), and the p50
each adds over the origin called directly over HTTP/2 (h2load, one stream per connection).

Each concurrency gets fresh sidecars (so VmHWM is that load's peak), one bench origin for all,
a warm-up, then ``--reps`` rounds whose order rotates (A B, B A, ...). CPU is utime+stime from
/proc/PID/stat over each run divided by the requests wrk completed. A figure is the median over
the rounds; a ratio is the median of each round's own ratio to the first binary (a round's runs
are seconds apart, so a drift of the machine's other load over minutes cancels out of it). A
label starting with ``gym`` is a proxy with NeMo Gym's flags (bench/harness/targets.py
start_gym_sidecar). Prints a markdown table; writes nothing into the repository.

Owns this comparison only. Must not bind anything but loopback or leave a process behind
(every child is ended with its Children, also on SIGTERM).

Run: .venv/bin/python bench/cpu_compare.py --compare old=BIN --compare new=BIN [--reps 3 --duration 5]
     [--flags '-metrics-listen 127.0.0.1:0 ...'] (extra flags for our binaries, e.g. the launcher's)
"""

from __future__ import annotations

import argparse
import shlex
import signal
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
from bench.harness.binaries import origin_binary  # noqa: E402
from bench.harness.children import Children, mem_kib, raise_nofile  # noqa: E402
from bench.harness.tables import load_average  # noqa: E402
from bench.harness.targets import (  # noqa: E402
    Sidecar,
    WrkResult,
    need_tool,
    run_wrk,
    start_gym_sidecar,
    start_origin,
    start_sidecar,
    wrk_script,
)
from bench.harness.waits import BenchError  # noqa: E402

CONCURRENCIES = (16, 128)


Run = tuple[dict[str, list[WrkResult]], dict[str, float], float]


def measure(args: argparse.Namespace, work: Path, conns: int) -> Run:
    """Fresh sidecars for one concurrency: every round's wrk result, each peak RSS (MiB), and
    the direct HTTP/2 p50 (ms, median of rounds run after the sidecars')."""
    wrk = need_tool("wrk")
    lua = wrk_script(work)
    names = list(args.compare)
    with Children() as kids:
        origin = start_origin(kids, origin_binary(), work)
        scs: dict[str, Sidecar] = {}
        for k, b in args.compare.items():
            if k.startswith("gym"):
                scs[k] = start_gym_sidecar(kids, b, work, origin.tls, name=f"cmp-{k}-{conns}")
            else:
                scs[k] = start_sidecar(
                    kids, b, work, origin.tls, origin.ca, *args.flags, name=f"cmp-{k}-{conns}"
                )
        for sc in scs.values():  # warm up: connections, TLS sessions, heaps
            run_wrk(wrk, lua, sc.listen, conns, 1, sc.proc.pid, origin.proc.pid)
        raw: dict[str, list[WrkResult]] = {k: [] for k in names}
        for rep in range(args.reps):
            for k in names[rep % len(names) :] + names[: rep % len(names)]:
                r = run_wrk(wrk, lua, scs[k].listen, conns, args.duration, scs[k].proc.pid, origin.proc.pid)
                if r.errors:
                    raise BenchError(f"{k} c={conns}: {r.errors} wrk errors")
                raw[k].append(r)
        rss = {k: mem_kib(sc.proc.pid, "VmHWM") / 1024 for k, sc in scs.items()}
        direct = [direct_p50_ms(origin.tls, conns, args.duration, work) for _ in range(args.reps)]
    return raw, rss, statistics.median(direct)


def direct_p50_ms(origin: str, conns: int, duration: float, work: Path) -> float:
    """p50 of the origin called directly over HTTP/2 with TLS: h2load, ``conns`` connections of
    one stream each (wrk's shape), its per-request log read back (h2load prints no median)."""
    log = work / "h2load.log"
    argv = [
        need_tool("h2load"),
        f"-c{conns}",
        "-m1",
        f"-D{duration:g}",
        f"--log-file={log}",
        f"https://{origin}/",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
    rows = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
    times = [int(r[2]) / 1000 for r in rows if len(r) >= 3 and r[1] == "200"]
    if done.returncode != 0 or not times:
        raise BenchError(f"h2load {' '.join(argv)}: failed: {done.stderr.strip()[-300:]}")
    return statistics.median(times)


def table(names: list[str], runs: dict[int, Run]) -> str:
    base = names[0]

    def cell(k: str, attr: str, fmt: str) -> str:
        parts = []
        for c in CONCURRENCIES:
            raw = runs[c][0]
            parts.append(format(statistics.median(getattr(r, attr) for r in raw[k]), fmt))
        return " / ".join(parts)

    def ratio(k: str, attr: str) -> str:
        parts = []
        for c in CONCURRENCIES:
            raw = runs[c][0]
            each = [getattr(a, attr) / getattr(b, attr) for a, b in zip(raw[k], raw[base], strict=True)]
            parts.append(f"{statistics.median(each):.2f}x")
        return " / ".join(parts)

    def rss(k: str) -> str:
        return " / ".join(f"{runs[c][1][k]:.1f}" for c in CONCURRENCIES)

    def rss_ratio(k: str) -> str:
        return " / ".join(f"{runs[c][1][k] / runs[c][1][base]:.2f}x" for c in CONCURRENCIES)

    cols = names + [f"{k} / {base}" for k in names[1:]]
    head = "| figure, c=16 / c=128 | " + " | ".join(cols) + " |"
    lines = [head, "|---|" + "--:|" * (2 * len(names) - 1)]
    for label, attr, fmt in (
        ("CPU µs/request", "cpu_us_per_req", ".1f"),
        ("requests/s", "rps", ",.0f"),
        ("p50 ms", "p50_ms", ".2f"),
        ("p99 ms", "p99_ms", ".2f"),
    ):
        cells = [cell(k, attr, fmt) for k in names] + [ratio(k, attr) for k in names[1:]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    added = [
        " / ".join(
            f"{statistics.median(r.p50_ms for r in runs[c][0][k]) - runs[c][2]:+.2f}" for c in CONCURRENCIES
        )
        for k in names
    ]
    lines.append("| p50 ms added over direct HTTP/2 | " + " | ".join(added) + " |" + " |" * (len(names) - 1))
    lines.append(
        "| peak RSS MiB | " + " | ".join([rss(k) for k in names] + [rss_ratio(k) for k in names[1:]]) + " |"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="LABEL=BINARY",
        help="a binary to measure (repeat; the first is the baseline of the ratios)",
    )
    ap.add_argument("--reps", type=int, default=3, help="rounds per concurrency (default 3)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    ap.add_argument("--flags", default="", help="extra flags for our binaries (not gym*), one shell string")
    a = ap.parse_args(argv)
    compare: dict[str, Path] = {}
    for item in a.compare:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).is_file():
            ap.error(f"--compare: '{item}' must be LABEL=BINARY with an existing binary")
        compare[label] = Path(path).resolve()
    if len(compare) < 2:
        ap.error("--compare: give two or more LABEL=BINARY")
    a.compare = compare
    a.flags = shlex.split(a.flags)
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_nofile()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = load_average()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        try:
            for c in CONCURRENCIES:
                runs[c] = measure(args, Path(tmp), c)
        except BenchError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 1
    names = list(args.compare)
    print(
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average before/after "
        f"{load_before} / {load_average()}; wrk GET / keep-alive, {args.reps} rounds x {args.duration:g} s "
        "per binary and concurrency, order rotated; medians, ratios = median of per-round ratios."
    )
    for k, b in args.compare.items():
        flags = f" {' '.join(args.flags)}" if args.flags and not k.startswith("gym") else ""
        print(f"- `{k}`: {b}{flags}")
    print()
    print(table(names, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
