"""Benchmark of the state store: persisted transitions per second, alone and 8 processes at once,
and the inspection queries against a database holding 100,000 history rows.

    .venv/bin/python bench/store.py [--transitions N] [--writers 8] [--history-rows 100000]
                                    [--repeat 200] [--baseline DIR] [--out bench/results/store.md]
                                    [--no-readme]

Targets (issues 3, 14): >= 2,000 persisted transitions/s from one process; 8 concurrent processes
together >= 0.7x the throughput of one; listing live runs and one instance's history < 10 ms each.

``--baseline DIR`` (a checkout of another revision, e.g. ``git archive REV | tar -x -C DIR``) runs
that revision's store in the same rounds, interleaved with this one's, so a before/after ratio
is measured under the same load.

Every transition goes through ``InstanceMachine.fire`` -> ``Store.record_transition`` (one
``BEGIN IMMEDIATE`` transaction each, as in production). Writers are this file run as
subprocesses; they prepare their instances, then wait on a barrier (a line on stdin), so the
clock covers only the transitions. Only the query database is filled with raw SQL (the bench's
own setup, not the code under test): 100,000 rows through the machine would take a minute.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# A writer of the --baseline revision imports that checkout's sidecar_fsm instead of this one's.
CODE = Path(os.environ.get("BENCH_STORE_CODE", REPO))
for entry in (str(REPO), str(CODE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from bench.readme import results_path, update_readme  # noqa: E402
from sidecar_fsm.state.fsm import InstanceMachine  # noqa: E402
from sidecar_fsm.state.store import Store, database_path  # noqa: E402

HOST = "bench"
LIFECYCLE = ("build", "spawn", "ready", "drain", "stop")


def writer(log_dir: str, tag: str, transitions: int) -> None:
    """Subprocess: prepare ``transitions / 5`` instances, wait for "go", drive them all, print the time."""
    store = Store.open(log_dir, host=HOST)
    store.create_run(tag, owner_pid=os.getpid(), owner_start_time=None, config_summary={})
    machines = [
        InstanceMachine(
            store,
            store.create_instance(tag, f"i{k}", "127.0.0.1:0", "https://x.example.com", None, None, None).id,
        )
        for k in range(transitions // len(LIFECYCLE))
    ]
    print("ready", flush=True)
    sys.stdin.readline()
    started, cpu = time.perf_counter(), time.process_time()
    for event in LIFECYCLE:
        facts: dict[str, Any] = {"pid": os.getpid()} if event == "spawn" else {}
        for machine in machines:
            machine.fire(event, **facts)
    print(f"{time.perf_counter() - started:.6f} {time.process_time() - cpu:.6f}", flush=True)
    store.close()


def run_writers(count: int, transitions: int, code: Path = REPO) -> tuple[float, float]:
    """Wall time from the barrier to the last writer's end, and the CPU time all writers used.

    ``count`` writers, each ``transitions`` transitions, on one fresh database, running the store
    of the checkout at ``code``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-store-") as log_dir:
        env = {**os.environ, "BENCH_STORE_CODE": str(code)}
        # The database exists before the writers start: their shared open is not what is timed.
        subprocess.run([sys.executable, __file__, "create", log_dir], env=env, check=True)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "writer", log_dir, f"w{n}", str(transitions)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for n in range(count)
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                if proc.stdout.readline() != "ready\n":
                    raise SystemExit("bench: a writer failed before the barrier; see its stderr above")
            started = time.perf_counter()
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            cpu = 0.0
            for proc in procs:
                assert proc.stdout is not None
                cpu += float(proc.stdout.readline().split()[1])
            wall = time.perf_counter() - started
        finally:
            for proc in procs:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=60)
        db = database_path(log_dir, HOST)
        with sqlite3.connect(db) as conn:
            stored = conn.execute("SELECT count(*) FROM transitions").fetchone()[0]
        if stored != count * (transitions // len(LIFECYCLE)) * len(LIFECYCLE):
            raise SystemExit(f"bench: {stored} transitions stored; expected every one")
        return wall, cpu


def fill(log_dir: str, history_rows: int) -> tuple[Store, list[int]]:
    """A database with ``history_rows`` transitions: 20 instances per run, 5 rows each, 1% of runs live."""
    store = Store.open(log_dir, host=HOST)
    conn = sqlite3.connect(store.path, isolation_level=None)
    per_instance, per_run = len(LIFECYCLE), 20
    instances = history_rows // per_instance
    runs = max(1, instances // per_run)
    now = time.time()
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO runs (run_id, host, owner_pid, started_at, ended_at, outcome) VALUES (?, ?, ?, ?, ?, ?)",
        [
            (
                f"run{r:06d}",
                HOST,
                1000 + r,
                now - (runs - r),
                None if r % 100 == 0 else now,
                None if r % 100 == 0 else "ended",
            )
            for r in range(runs)
        ],
    )
    conn.executemany(
        "INSERT INTO instances (id, run_id, name, listen, upstream, state, state_since) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                i + 1,
                f"run{i // per_run:06d}",
                f"i{i % per_run}",
                "127.0.0.1:0",
                "https://x.example.com",
                "stopped",
                now,
            )
            for i in range(instances)
        ],
    )
    states = ("configured", "building", "spawned", "ready", "draining", "stopped")
    conn.executemany(
        "INSERT INTO transitions (instance_id, source, dest, event, at) VALUES (?, ?, ?, ?, ?)",
        [
            (i + 1, states[step], states[step + 1], LIFECYCLE[step], now)
            for i in range(instances)
            for step in range(per_instance)
        ],
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return store, list(range(1, instances + 1))


def time_ms(call: object, repeat: int) -> tuple[float, float]:
    """Median and 95th percentile, in milliseconds, of ``repeat`` calls (after one warm-up)."""
    assert callable(call)
    call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


@dataclass
class Rounds:
    """Per round: transitions/s of 1 writer alone, of N writers together, and the N writers'
    CPU microseconds per transition (what waiting costs besides the work)."""

    singles: list[float] = field(default_factory=list)
    togethers: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    def add(self, writers: int, transitions: int, code: Path) -> None:
        self.singles.append(transitions / run_writers(1, transitions, code)[0])
        wall, cpu = run_writers(writers, transitions, code)
        self.togethers.append(writers * transitions / wall)
        self.cpu_us.append(cpu / (writers * transitions) * 1e6)

    def ratio(self) -> float:
        """N together against 1 alone: the median of each round's own ratio."""
        return statistics.median(t / s for s, t in zip(self.singles, self.togethers, strict=True))


def query_times(history_rows: int, repeat: int) -> tuple[int, tuple[float, float], tuple[float, float]]:
    """(live runs, list-live ms, one-history ms) on a store filled with ``history_rows`` rows."""
    with tempfile.TemporaryDirectory(prefix="bench-store-") as log_dir:
        store, instance_ids = fill(log_dir, history_rows)
        live = len(store.list_runs("live"))
        picks = random.Random(1).choices(instance_ids, k=repeat + 1)
        live_ms = time_ms(lambda: store.list_runs("live"), repeat)
        history_ms = time_ms(lambda: store.history(picks.pop()), repeat)
        store.close()
    return live, live_ms, history_ms


Row = tuple[str, str, str, bool]


def baseline_rows(args: argparse.Namespace, new: Rounds, old: Rounds) -> tuple[list[Row], str]:
    """The baseline's rows and the sentence naming its rounds."""
    baseline = f"baseline {args.baseline.name}"
    rows: list[Row] = [
        (
            f"{baseline}: transitions/s, 1 process",
            f"{statistics.median(old.singles):,.0f} (this one: "
            f"{statistics.median(n / o for n, o in zip(new.singles, old.singles, strict=True)):.2f}x)",
            "-",
            True,
        ),
        (
            f"{baseline}: transitions/s, {args.writers} processes together",
            f"{statistics.median(old.togethers):,.0f} ({old.ratio():.2f}x of 1; this one: "
            f"{statistics.median(n / o for n, o in zip(new.togethers, old.togethers, strict=True)):.2f}x)",
            "-",
            True,
        ),
        (
            f"{baseline}: CPU us per transition, {args.writers} processes together",
            f"{statistics.median(old.cpu_us):,.0f}",
            "-",
            True,
        ),
    ]
    context = (
        "; baseline rounds interleaved with these "
        f"(1 process: {', '.join(f'{v:,.0f}' for v in old.singles)}; "
        f"{args.writers} together: {', '.join(f'{v:,.0f}' for v in old.togethers)})"
    )
    return rows, context


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=3000, help="per writer (default 3000)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating 1-writer / N-writer rounds; medians are quoted"
    )
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--history-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200, help="query samples (default 200)")
    parser.add_argument(
        "--out", type=Path, default=results_path("store"), help="full report (default bench/results/store.md)"
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="do not write the figures into bench/README.md"
    )
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of another revision, measured in the same rounds"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    command = shlex.join([".venv/bin/python", "bench/store.py", *sys.argv[1:]])
    load_before = os.getloadavg()[0]
    new, old = Rounds(), Rounds()
    # Alternating rounds, so a burst of load from elsewhere on the machine hits both sides.
    for _ in range(args.rounds):
        new.add(args.writers, args.transitions, REPO)
        if args.baseline is not None:
            old.add(args.writers, args.transitions, args.baseline)
    single, together, ratio = statistics.median(new.singles), statistics.median(new.togethers), new.ratio()
    live, live_ms, history_ms = query_times(args.history_rows, args.repeat)
    rows: list[Row] = [
        ("transitions/s, 1 process", f"{single:,.0f}", ">= 2,000", single >= 2000),
        (
            f"transitions/s, {args.writers} processes together",
            f"{together:,.0f} ({ratio:.2f}x of 1, median per-round ratio)",
            ">= 0.7x of 1 process",
            ratio >= 0.7,
        ),
        (
            f"CPU us per transition, {args.writers} processes together",
            f"{statistics.median(new.cpu_us):,.0f}",
            "-",
            True,
        ),
        (
            f"list live runs ({live} live) ms, median / p95",
            f"{live_ms[0]:.2f} / {live_ms[1]:.2f}",
            "< 10",
            live_ms[0] < 10,
        ),
        (
            "one instance's history ms, median / p95",
            f"{history_ms[0]:.2f} / {history_ms[1]:.2f}",
            "< 10",
            history_ms[0] < 10,
        ),
    ]
    context = (
        f"{args.transitions:,} transitions per writer (build, spawn, ready, drain, stop), each its own "
        f"transaction; medians of {args.rounds} alternating rounds "
        f"(1 process: {', '.join(f'{v:,.0f}' for v in new.singles)}; "
        f"{args.writers} together: {', '.join(f'{v:,.0f}' for v in new.togethers)}); queries: "
        f"{args.history_rows:,} history rows, median of {args.repeat}; "
        f"{os.cpu_count()} CPUs (load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after), "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC"
    )
    if args.baseline is not None:
        more, said = baseline_rows(args, new, old)
        rows += more
        context += said
    write(args, command, rows, context)


def write(args: argparse.Namespace, command: str, rows: list[Row], context: str) -> None:
    """Print the table; the report to ``args.out`` and, unless --no-readme, the README section."""
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    print(f"$ {command}")
    for name, value, target, ok in rows:
        print(f"{name:<{width}}  {value:<{value_width}}  target {target:<20}  {'ok' if ok else 'MISSED'}")
    print(context)
    table = "\n".join(
        ["| measure | result | target | |", "|---|---|---|---|"]
        + [
            f"| {name} | {value} | {target} | {'ok' if ok else 'missed'} |"
            for name, value, target, ok in rows
        ]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"# State store benchmark\n\n`{command}`\n\n{table}\n\n{context}\n")
    print(f"written to {args.out}")
    if not args.no_readme:
        update_readme("store", f"`{command}`\n\n{table}\n\n{context}")
        print("figures written to bench/README.md")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "writer":
        writer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "create":
        Store.open(sys.argv[2], host=HOST).close()
    else:
        main()
