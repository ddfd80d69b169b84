"""Interleaved wrk rounds of several sidecars against one origin, and the figures made of them.

Owns the method bench/metrics.py and bench/traffic.py share to compare variants of the proxy on
this shared machine: every variant runs side by side, measured in rounds whose order rotates, so
the load of the other tenants falls on each alike; the figures are medians over the rounds, the
ratios of those medians and, beside them, the median of each round's own ratio (a round's runs
are seconds apart, so a drift over minutes cancels out of it); a second copy of the baseline
gives the noise floor. Also the Go benchmarks' medians (``go test -bench``), the finer measure
when the floor is above a cost. Must not start or stop a sidecar: callers own their children.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.harness.binaries import GO_DIR
from bench.harness.targets import Sidecar, run_wrk
from bench.harness.waits import BenchError


@dataclass
class Rounds:
    """Each mode's req/s and CPU µs per request, one figure per round, in mode order."""

    rps: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def medians(self) -> tuple[dict[str, float], dict[str, float]]:
        return (
            {mode: statistics.median(v) for mode, v in self.rps.items()},
            {mode: statistics.median(v) for mode, v in self.cpu.items()},
        )

    def paired(self, base: str) -> dict[str, tuple[float, float]]:
        """Per mode, the median over rounds of (req/s, CPU) divided by ``base``'s same round."""
        return {
            mode: (
                statistics.median(a / b for a, b in zip(self.rps[mode], self.rps[base], strict=True)),
                statistics.median(a / b for a, b in zip(self.cpu[mode], self.cpu[base], strict=True)),
            )
            for mode in self.rps
        }

    def noise(self, base: str, again: str) -> float:
        """The larger distance from 1 of ``again``'s two ratios to ``base``: two identical
        sidecars differ by this much here, so a smaller cost cannot be told from none."""
        med_rps, med_cpu = self.medians()
        return max(abs(med_rps[again] / med_rps[base] - 1), abs(med_cpu[again] / med_cpu[base] - 1))


def interleaved_rounds(
    wrk: str,
    lua: Path,
    sidecars: dict[str, Sidecar],
    origin_pid: int,
    *,
    reps: int,
    duration: float,
    conns: int,
) -> Rounds:
    """A 1-s warm-up of each sidecar (connections, TLS sessions, heaps), then ``reps`` rounds
    of wrk ``-c conns`` for ``duration`` s on each, the order rotated by one each round. A wrk
    error fails the run: a figure made of errors would compare nothing."""
    modes = tuple(sidecars)
    for sc in sidecars.values():
        run_wrk(wrk, lua, sc.listen, conns, 1, sc.proc.pid, origin_pid)
    rps: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
            sc = sidecars[mode]
            r = run_wrk(wrk, lua, sc.listen, conns, duration, sc.proc.pid, origin_pid)
            if r.errors:
                raise BenchError(f"{mode}: {r.errors} wrk errors")
            rps[mode].append(r.rps)
            cpu[mode].append(r.cpu_us_per_req)
    return Rounds(rps, cpu)


def go_bench_ns(go: Path, pattern: str) -> dict[str, float]:
    """Median ns/op of go/'s Go benchmarks matching ``pattern`` (5 runs each): CPU time on one
    core, far less sensitive to the other tenants of this machine than req/s."""
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false", GOTOOLCHAIN="local")
    r = subprocess.run(
        [str(go), "test", "-run", "^$", "-bench", pattern, "-count", "5", "."],
        cwd=GO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    found: dict[str, list[float]] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"Benchmark(\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op", line)
        if m:
            found.setdefault(m.group(1), []).append(float(m.group(2)))
    if r.returncode != 0 or not found:
        raise RuntimeError(f"go test -bench: failed: {r.stderr.strip()[-300:]}")
    return {name: statistics.median(v) for name, v in found.items()}
