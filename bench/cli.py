"""How fast the command line answers: ``--help``, ``status`` of one live run, ``status`` of nothing.

Owns this one comparison (issue 29): each command as a user runs it, the installed
``sidecar-fsm`` script in a fresh process, timed from spawn to exit, beside ``python -c pass``
(the interpreter's own start, the floor no command can go under) in interleaved rounds, so
the noise of this shared machine falls on every row alike. ``status`` reads a live run of one
instance with metrics on, which this script starts through the launcher against the lab's TLS
HTTP/2 origin (so ``status`` scrapes a real ``/metrics``), and a log dir that does not exist.
Targets on an idle machine, medians: ``--help`` <= 100 ms, ``status`` (live) <= 250 ms,
``status`` (no log dir) <= 150 ms. Writes the table into bench/README.md and README.md
(bench:cli) and bench/results/cli.md.

Must not bind anything but loopback or leave a process behind: the run and the origin are
stopped in a finally.

Run: .venv/bin/python bench/cli.py [--reps 9] [--no-readme]   (about half a minute idle)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from omegaconf import OmegaConf  # noqa: E402

from bench.harness.tables import load_average, markdown_table, text_table  # noqa: E402
from bench.readme import results_path, update_readme  # noqa: E402
from sidecar_fsm.base.buildcache import user_cache_dir  # noqa: E402
from sidecar_fsm.lab import TlsH2Origin  # noqa: E402
from sidecar_fsm.launcher import start_h2_ping_sidecar  # noqa: E402

SCRIPT = Path(sys.executable).parent / "sidecar-fsm"
# (row, target ms on an idle machine or None)
Case = tuple[str, float | None]


def timed(argv: list[str], expect: set[int]) -> tuple[float, float]:
    """(wall ms from spawn to exit, CPU ms user + system) of ``argv``, whose exit code must be
    one of ``expect``. The CPU time barely moves with the machine's load; the wall time is what
    a user waits."""
    began = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    took = (time.perf_counter() - began) * 1000
    child.returncode = os.waitstatus_to_exitcode(status)
    child.stderr.close()
    if child.returncode not in expect:
        raise SystemExit(f"{' '.join(argv)}: exit {child.returncode}\n{stderr.decode()}")
    return took, (usage.ru_utime + usage.ru_stime) * 1000


def measure(reps: int, live_log_dir: Path, missing: Path) -> list[tuple[Case, list[tuple[float, float]]]]:
    cases: list[tuple[Case, list[str], set[int]]] = [
        (("python -c pass", None), [sys.executable, "-c", "pass"], {0}),
        (("sidecar-fsm --help", 100.0), [str(SCRIPT), "--help"], {0}),
        (
            ("sidecar-fsm status (one live run, metrics on)", 250.0),
            [str(SCRIPT), "--log-dir", str(live_log_dir), "status"],
            {0},
        ),
        (
            ("sidecar-fsm status (no log dir)", 150.0),
            [str(SCRIPT), "--log-dir", str(missing), "status"],
            {1},
        ),
    ]
    samples: list[list[tuple[float, float]]] = [[] for _ in cases]
    for round_ in range(reps):
        # Alternating order: a slow spell of the machine does not land on one row only.
        order = list(range(len(cases))) if round_ % 2 == 0 else list(reversed(range(len(cases))))
        for index in order:
            _, argv, expect = cases[index]
            samples[index].append(timed(argv, expect))
    return [(case, values) for (case, _, _), values in zip(cases, samples, strict=True)]


def report(results: list[tuple[Case, list[tuple[float, float]]]], reps: int) -> tuple[str, str]:
    floor = statistics.median(wall for wall, _ in results[0][1])
    header = ["command", "median ms", "min ms", "x python -c pass", "CPU ms", "target (idle)"]
    rows = []
    for (name, target), values in results:
        walls = [wall for wall, _ in values]
        median = statistics.median(walls)
        rows.append(
            [
                f"`{name}`" if name != "python -c pass" else name,
                f"{median:.0f}",
                f"{min(walls):.0f}",
                f"{median / floor:.1f}x",
                f"{statistics.median(cpu for _, cpu in values):.0f}",
                "-" if target is None else f"<= {target:g} ms" + ("" if median <= target else " (missed)"),
            ]
        )
    facts = (
        f"medians of {reps}, interleaved; wall time from spawn to exit, CPU user + system; load average "
        f"{load_average()} on {os.cpu_count()} cores"
    )
    return text_table(header, [[c.strip("`") for c in row] for row in rows]) + "\n" + facts, (
        markdown_table(header, rows) + f"\n\n{facts}; `bench/cli.py`."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--no-readme", action="store_true", help="print only; leave the READMEs alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch:
        work = Path(scratch)
        origin = TlsH2Origin().start()
        try:
            config = OmegaConf.create(
                {
                    "cache_dir": str(user_cache_dir()),
                    "sidecar": {
                        "enabled": True,
                        "instances": [{"name": "bench", "upstream": origin.url, "listen": "127.0.0.1:0"}],
                        "ca_file": str(origin.ca_file),
                        "log_dir": str(work / "logs"),
                        "shutdown_grace": "1s",
                        "rewrite_base_urls": False,
                        "metrics": True,
                    },
                }
            )
            with contextlib.redirect_stdout(io.StringIO()):
                manager = start_h2_ping_sidecar(config)
            assert manager is not None
            try:
                timed([str(SCRIPT), "--log-dir", str(work / "logs"), "status"], {0})  # warm the page cache
                results = measure(args.reps, work / "logs", work / "no-such-dir")
            finally:
                manager.stop()
        finally:
            origin.stop()
    plain, markdown = report(results, args.reps)
    print(plain)
    results_path("cli").write_text(f"# bench/cli.py\n\n{markdown}\n")
    if not args.no_readme:
        update_readme("cli", markdown)
        update_readme("cli", markdown, REPO / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
