"""Warm starts of two or more checkouts side by side: how a change to the launcher is judged.

    .venv/bin/python bench/launcher_pair.py --checkout before=DIR --checkout after=DIR
                                            [--rounds 5] [--repeats 7]

Each checkout (e.g. ``git archive REV | tar -x -C DIR``) runs its own bench/launcher.py with
``--skip-cold`` (warm figures only, its own temp cache and origins), so it imports its own
``sidecar_fsm``; the checkouts take turns, their order rotated each round, because this
machine's speed moves by tens of percent from one minute to the next. Prints each figure's
median over the rounds (each round's figure is that run's median) and the median of the
per-round ratios to the first checkout. Writes nothing into the README: the figures go to the
commit that makes the change.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

# bench/launcher.py's rows read here: name -> short label.
ROWS = {
    "warm start_h2_ping_sidecar, 4 instances (median)": "warm start, 4 instances ms",
    "warm start_h2_ping_sidecar, 1 instance (median)": "warm start, 1 instance ms",
    "of which cache lookup, resolve_binary (median)": "cache lookup ms",
    "warm stop(), 4 idle sidecars (median)": "warm stop, 4 instances ms",
}
_ROW = re.compile(r"^\s*(?P<name>\S.*?)\s{2,}(?P<ms>[0-9.]+) ms")


def one_run(checkout: Path, repeats: int) -> dict[str, float]:
    """One bench/launcher.py run of ``checkout``: each row's median in ms."""
    script = checkout / "bench" / "launcher.py"
    argv = [sys.executable, str(script), "--repeats", str(repeats), "--skip-cold", "--out", "", "--no-readme"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=checkout)
    if done.returncode != 0:
        raise SystemExit(f"{script}: exit {done.returncode}\n{done.stderr[-2000:]}")
    found: dict[str, float] = {}
    for line in done.stdout.splitlines():
        match = _ROW.match(line)
        if match is not None and match["name"] in ROWS:
            found[ROWS[match["name"]]] = float(match["ms"])
    if len(found) != len(ROWS):
        raise SystemExit(f"{script}: rows missing from its table:\n{done.stdout}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each checkout (default 5)")
    parser.add_argument("--repeats", type=int, default=7, help="warm starts per run (default 7)")
    args = parser.parse_args()
    checkouts: dict[str, Path] = {}
    for item in args.checkout:
        label, _, path = item.partition("=")
        if not label or not (Path(path) / "bench" / "launcher.py").is_file():
            parser.error(f"--checkout '{item}': want LABEL=DIR of a checkout with bench/launcher.py")
        checkouts[label] = Path(path).resolve()
    labels = list(checkouts)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    for round_index in range(args.rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            runs[label].append(one_run(checkouts[label], args.repeats))
    base = labels[0]
    print(f"{args.rounds} rounds x {args.repeats} warm starts per checkout, order rotated each round")
    print("| figure | " + " | ".join(labels) + " |")
    print("|---|" + "--:|" * len(labels))
    for row in ROWS.values():
        cells = []
        for label in labels:
            median = statistics.median(run[row] for run in runs[label])
            ratio = statistics.median(
                a[row] / b[row] for a, b in zip(runs[label], runs[base], strict=True) if b[row] > 0
            )
            cells.append(f"{median:.1f} ({ratio:.2f}x)")
        print(f"| {row} | " + " | ".join(cells) + " |")
    for label in labels:
        print(
            f"{label}: {checkouts[label]}; 4-instance starts per round: "
            + ", ".join(f"{run['warm start, 4 instances ms']:.1f}" for run in runs[label])
        )


if __name__ == "__main__":
    main()
