"""Benchmark of the h2-ping-sidecar next to HAProxy and the origin directly (issue 2, item 6).

Measures the proxy's targets side by side in one run on loopback, one phase each (modules in
bench/proxy_phases/): throughput (wrk at c=1/16/128), scale (2,000 held waits; scale-metrics:
10,000 with /metrics scraped), goaway (POST churn against an origin draining every 5th
request), start (exec to ready file, idle RSS), longwait (first byte after 3x a relay's idle
limit) and profile (where the CPU and memory go). It prints one table, writes it with the
command into bench/README.md (bench:proxy) and the full report to bench/results/proxy.md.
Paired builds (``--phases paired --compare old=BIN --compare new=BIN``) measure binaries side
by side; their table goes to --report alone.

Owns the command line and the order of the phases; the parts are bench/harness's (children,
waits, the product's build cache for every binary). Must not touch go/, bind anything but
loopback, or leave a process behind: every child runs in its own session and all are ended
after each phase, whatever happened, and on SIGTERM.

Run: .venv/bin/python bench/proxy.py            (about 3-4 minutes; or python -m bench.proxy)
     .venv/bin/python bench/proxy.py --quick    (one short repetition, for tuning)
Needs wrk, haproxy (Debian: apt-get install -y wrk haproxy) and Go (.venv/bin/go).
Binaries come from the build cache (~/.cache/sidecar-fsm); logs, CA files and results.json go
to a fresh temp dir per run (removed after a clean run; --workdir keeps one). The origin's own
tests: cd bench/origin && go test .
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.harness.binaries import go_tool, origin_binary, sidecar_binary  # noqa: E402
from bench.harness.children import Children, raise_nofile  # noqa: E402
from bench.harness.tables import go_revision, load_average  # noqa: E402
from bench.harness.targets import INSTALL_HINT  # noqa: E402
from bench.harness.waits import BenchError  # noqa: E402
from bench.proxy_phases import PHASES  # noqa: E402
from bench.proxy_phases.goaway import phase_goaway  # noqa: E402
from bench.proxy_phases.longwait import phase_longwait  # noqa: E402
from bench.proxy_phases.paired import paired_report, phase_paired  # noqa: E402
from bench.proxy_phases.profile import phase_profile  # noqa: E402
from bench.proxy_phases.report import readme_summary, write_report  # noqa: E402
from bench.proxy_phases.scale import phase_scale, phase_scale_metrics  # noqa: E402
from bench.proxy_phases.start import phase_start  # noqa: E402
from bench.proxy_phases.table import build_table, render_text  # noqa: E402
from bench.proxy_phases.throughput import phase_throughput  # noqa: E402
from bench.readme import update_readme  # noqa: E402

DEFAULT_REPORT = REPO / "bench" / "results" / "proxy.md"

Phase = Callable[[argparse.Namespace, Children, Path, Path, Path], Any]
PHASE_FUNCTIONS: dict[str, Phase] = {
    "throughput": phase_throughput,
    "scale": phase_scale,
    "scale-metrics": phase_scale_metrics,
    "goaway": phase_goaway,
    "start": phase_start,
    "longwait": phase_longwait,
    "profile": phase_profile,
}
# What a phase may fail with and the run still go on to the next (reported as failed).
PHASE_ERRORS = (
    BenchError,
    OSError,
    subprocess.SubprocessError,
    TimeoutError,
    asyncio.TimeoutError,
    ValueError,
    KeyError,
)


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
    ap.add_argument(
        "--metrics-scale-requests",
        type=int,
        default=10000,
        help="concurrent waits of the scale-metrics phase (default 10000)",
    )
    ap.add_argument(
        "--metrics-scale-wait", default="10s", help="first-byte wait of the scale-metrics phase (default 10s)"
    )
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


def limits_problem(args: argparse.Namespace) -> str | None:
    """Why this process cannot hold the connections the chosen phases open, or None."""
    nofile = raise_nofile()
    if "paired" in args.phases and nofile < max(args.paired_scale, default=0) + 1000:
        return f"RLIMIT_NOFILE {nofile} is too low for --paired-scale; ulimit -n 20000"
    if "scale" in args.phases and nofile < 3 * args.scale_requests + 1000:
        return f"RLIMIT_NOFILE {nofile} is too low for the scale phase; ulimit -n 20000"
    # One descriptor per client connection here; the sidecar and the origin have their own.
    if "scale-metrics" in args.phases and nofile < args.metrics_scale_requests + 1000:
        return (
            f"RLIMIT_NOFILE {nofile} is too low for {args.metrics_scale_requests} waits;"
            f" ulimit -n {args.metrics_scale_requests + 1000} or --metrics-scale-requests lower"
        )
    return None


def run_paired(
    args: argparse.Namespace,
    kids: Children,
    work: Path,
    origin_bin: Path,
    results: dict[str, Any],
    command: str,
) -> int:
    """The paired builds alone; their table goes to --report (never the README)."""
    try:
        paired = phase_paired(args, kids, work, origin_bin)
    finally:
        kids.close()
    paired.update(
        load_before=results["load_before"],
        load_after=load_average(),
        reps=args.reps,
        duration=args.duration,
    )
    text = paired_report(paired, command)
    args.report.write_text(text)
    print(text)
    print(f"figures written to {args.report}")
    return 0


def run_phases(
    args: argparse.Namespace,
    kids: Children,
    work: Path,
    sidecar_bin: Path,
    origin_bin: Path,
    results: dict[str, Any],
) -> None:
    """Each chosen phase in turn; a failed phase is recorded in ``failed_phases`` and the next
    one runs. Children are ended after every phase, so a failed one leaves none behind."""
    for name in args.phases:
        t0 = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        try:
            results[name] = PHASE_FUNCTIONS[name](args, kids, work, sidecar_bin, origin_bin)
        except PHASE_ERRORS as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            results["failed_phases"].append(f"{name}: {msg}")
            print(f"bench: {name}: failed: {e}", file=sys.stderr)
        finally:
            kids.close()
        print(f"bench: {name} done in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)


def finish(args: argparse.Namespace, work: Path, results: dict[str, Any], command: str) -> None:
    """Print the table; write results.json, the report and (unless --no-readme) the README."""
    rows = build_table(results)
    print(render_text(rows))
    if results["failed_phases"]:
        print("failed phases: " + "; ".join(results["failed_phases"]))
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_report(args.report, results, rows, command, str(go_tool()))
    print(f"figures written to {args.report}")
    if not args.no_readme:
        update_readme("proxy", readme_summary(results, rows, command, args.report))
        print("figures written to bench/README.md")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [t for t in ("wrk", "haproxy") if shutil.which(t) is None]
    if missing:
        print(f"bench: {', '.join(missing)} not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    problem = limits_problem(args)
    if problem is not None:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    command = " ".join([".venv/bin/python bench/proxy.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        origin_bin = origin_binary()
        sidecar_bin = args.binary.resolve() if args.binary else sidecar_binary()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    # Logs, CA files and ready files of a run stay private: two runs at once (the proxy's author
    # tuning while the lead measures) must not swap each other's CA files.
    own_workdir = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-sidecar-")) if own_workdir else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    # SIGTERM (timeout(1), a CI cancel) must unwind through the `with` that ends the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.monotonic()
    results: dict[str, Any] = {
        "load_before": load_average(),
        "reps": args.reps,
        "duration": args.duration,
        "longwait_idle": args.longwait_idle,
        "haproxy_threads": args.haproxy_threads,
        "go_rev": go_revision(),
        "failed_phases": [],
    }
    with Children() as kids:
        if args.phases == ["paired"]:
            code = run_paired(args, kids, work, origin_bin, results, command)
            if own_workdir:
                shutil.rmtree(work, ignore_errors=True)
            return code
        run_phases(args, kids, work, sidecar_bin, origin_bin, results)
    results["wall_s"] = time.monotonic() - t_start
    results["load_after"] = load_average()
    finish(args, work, results, command)
    if own_workdir and not results["failed_phases"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work dir kept (logs, results.json): {work}")
    return 1 if results["failed_phases"] else 0


if __name__ == "__main__":
    sys.exit(main())
