"""``sidecar-fsm demo`` as a new user runs it: the failure, the success, the history, nothing left."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

SCRIPT = Path(sys.executable).with_name("sidecar-fsm")


def sidecars_started_since(binary: Path, since: float) -> list[int]:
    found = []
    for process in psutil.process_iter(["exe", "create_time"]):
        if process.info["exe"] == str(binary.resolve()) and process.info["create_time"] >= since - 1:
            found.append(process.pid)
    return found


def test_demo_shows_failure_success_and_history(
    cache_dir: Path, sidecar_binary: Path, tmp_path: Path
) -> None:
    started = time.time()
    begin = time.monotonic()
    done = subprocess.run(
        [str(SCRIPT), "demo", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - begin
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert elapsed < 30, f"demo took {elapsed:.1f}s with a warm cache"
    assert "\x1b[" not in out  # not a terminal: no colour

    # The direct request is dropped at the idle limit...
    assert re.search(r"FAILED  after 2\.\ds: ", out), out
    assert "the relay dropped it" in out
    # ...the same request through the sidecar, at the rewritten URL, succeeds after 3x the limit.
    assert re.search(r"base_url: https://localhost:\d+ -> http://127\.0\.0\.1:\d+", out), out
    assert re.search(r"OK      status 200, \d+ bytes after 6\.\ds", out), out
    assert "the relay dropped 0 connections" in out
    # ...and the persisted history of the instance, oldest first.
    transitions = re.findall(r"^\s+\d{4}-\d\d-\d\d \S+\s+\+\S+\s+demo\s+(\w+)\s+(\w+)\s+(\w+)", out, re.M)
    assert transitions == [
        ("configured", "building", "build"),
        ("building", "spawned", "spawn"),
        ("spawned", "ready", "ready"),
        ("ready", "draining", "drain"),
        ("draining", "stopped", "stop"),
    ], out
    assert out.rstrip().endswith("nothing left running")
    assert sidecars_started_since(sidecar_binary, started) == []
    assert list(tmp_path.iterdir()) == []  # no state or cache left in the working directory
