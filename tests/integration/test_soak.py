"""The soak (bench/soak.py) for half a minute: mixed traffic through GOAWAYs, a blackhole and a restart.

The real proxy binary, the lab's origin and fault relay, run as the benchmark runs them (a
subprocess, its own process group of one proxy started with ``-exit-with-pid``). What a
half-minute run can promise is asserted: nothing stuck, every completed 200 byte-exact, failures
only around a fault, nothing left in flight when traffic pauses, and descriptors and upstream
connections where they were at the middle of the run. Memory is not: that is the Go heap
warming up (the 30-minute figures are in bench/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_half_minute_soak_loses_nothing_and_leaks_nothing(sidecar_binary: Path, tmp_path: Path) -> None:
    result_path = tmp_path / "soak.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "soak.py"), "--seconds", "30", "--no-readme"]
        + ["--json", str(result_path), "--binary", str(sidecar_binary)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result_path.exists(), run.stdout + run.stderr
    result = json.loads(result_path.read_text())
    outcomes = result["outcomes"]
    report = f"{outcomes}\n{result['unexpected']}\n{run.stdout}"
    assert outcomes.get("stuck", 0) == 0, report
    assert outcomes.get("mismatched", 0) == 0, report
    assert not [key for key in outcomes if key.endswith("outside faults")], report
    for kind in ("wait ok", "sse ok", "post ok", "left"):
        assert outcomes.get(kind, 0) > 0, report
    assert {kind for _, kind in result["faults"]} == {"blackhole", "restart"}, report
    assert result["origin"]["goaways"] >= 1
    reference, end = result["quiet"]["reference"], result["quiet"]["end"]
    assert reference["in_flight"] == end["in_flight"] == 0, report
    assert abs(end["fds"] - reference["fds"]) <= max(1, 0.1 * reference["fds"]), report
    assert abs(end["upstream_connections"] - reference["upstream_connections"]) <= 1, report
