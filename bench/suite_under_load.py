"""The suite on a starved machine: the README's test command run N times while busy loops hold
every core; a table of each run (pass or fail, duration, the tests that failed).

Usage: ``.venv/bin/python bench/suite_under_load.py [--runs 3] [--busy 3] [--no-readme]
[-- PYTEST_ARGS...]``. The command is the README's ``.venv/bin/pytest`` (this interpreter's
pytest, from the repo root), plus ``PYTEST_ARGS`` when given (a few files, to try the script:
``-- tests/integration/test_ready.py``), plus a JUnit XML report per run in a temp dir, which
is where the failing tests' names come from. ``--busy`` CPU-bound loops start before the first
run and are stopped after the last, whatever happened. Writes
``bench/results/suite_under_load.md`` and, for the whole suite only (no ``PYTEST_ARGS``), the
README section (``--no-readme``: neither). Exit status 0 only if every run passed.

Must not change the suite's own settings (its ``pyproject.toml`` options apply as they are) or
leave a process behind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness.busy import busy_loops  # noqa: E402
from bench.harness.tables import load_average, markdown_table, text_table  # noqa: E402
from bench.readme import results_path, update_readme  # noqa: E402

# A run that takes longer than this is stopped and reported as hung.
RUN_DEADLINE_SECONDS = 3 * 3600


def failed_tests(junit: Path) -> list[str]:
    """The node ids of the tests that failed or errored in one run's JUnit XML report."""
    if not junit.exists():
        return []
    failed = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").replace(".", "/")
            failed.append(f"{module}.py::{case.get('name')}" if module else str(case.get("name")))
    return failed


def one_run(index: int, pytest_args: list[str], work: Path) -> list[str]:
    """Run the command once; the table row: run, result, duration, load, summary, failing tests."""
    junit = work / f"run-{index}.xml"
    argv = [sys.executable, "-m", "pytest", *pytest_args, f"--junitxml={junit}", "-p", "no:cacheprovider"]
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=RUN_DEADLINE_SECONDS,
        )
        # pytest's "=== N passed ... in S ===" line; output after it (a warning printed at exit,
        # stderr is merged) must not stand in for it, as a "-----" rule once did.
        summaries = [line for line in done.stdout.splitlines() if line.startswith("=") and " in " in line]
        code, tail = done.returncode, summaries[-1:] or done.stdout.strip().splitlines()[-1:] or [""]
    except subprocess.TimeoutExpired:
        code, tail = -1, [f"hung: stopped after {RUN_DEADLINE_SECONDS} s"]
    took = time.monotonic() - began
    failed = failed_tests(junit)
    print(f"run {index}: exit {code} in {took:.0f} s; {tail[0]}", file=sys.stderr, flush=True)
    named = ", ".join(failed[:8]) + (f" (+{len(failed) - 8} more)" if len(failed) > 8 else "")
    return [
        str(index),
        "pass" if code == 0 else f"FAIL (exit {code})",
        f"{took:.0f}",
        load_average(),
        tail[0].strip("= "),
        named or ("none" if code == 0 else "see the run's output"),
    ]


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in args_in:
        at = args_in.index("--")
        args_in, pytest_args = args_in[:at], args_in[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=3, help="CPU-bound loops running meanwhile")
    parser.add_argument("--no-readme", action="store_true", help="print only; write no results")
    args = parser.parse_args(args_in)
    header = ["run", "result", "duration (s)", "load at the end", "pytest's summary", "failing tests"]
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="suite-under-load-") as tmp, busy_loops(args.busy):
        rows = [one_run(index + 1, pytest_args, Path(tmp)) for index in range(args.runs)]
    print(text_table(header, rows))
    command = " ".join(
        ["python bench/suite_under_load.py", f"--runs {args.runs}", f"--busy {args.busy}"]
        + (["--", *pytest_args] if pytest_args else [])
    )
    report = (
        f"`{command}` ({started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, {args.busy} busy loops):\n\n"
        + markdown_table(header, rows)
    )
    if not args.no_readme:
        results_path("suite_under_load").write_text(f"# The suite under load\n\n{report}\n")
        if not pytest_args:  # the README's figures are the whole suite's
            update_readme("suite_under_load", report)
    return 0 if all(row[1] == "pass" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
