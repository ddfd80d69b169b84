"""``sidecar-fsm demo`` as a new user runs it: the failure, the success, the history, nothing left;
and when a step really fails (a neighbour kills its sidecar), the story says which and why."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
from helpers import SIDECAR_FSM, ProcessRegistry, wait_until


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
        [str(SIDECAR_FSM), "demo", "--cache-dir", str(cache_dir)],
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
    # NVCF past its window: directly a 202 with the metadata body, through the sidecar the completion.
    assert re.search(
        r'FAILED  status 202 after 1\.\ds: \{"reqId": "[0-9a-f-]{36}", "status": "in-progress"\}', out
    ), out
    assert re.search(r'OK      status 200 after 3\.\ds: the completion \(\{"id": "chatcmpl-', out), out
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
    # The scratch folder is removed after a success: its database is not named as if it stayed.
    assert ".db" not in out and "(removed with the scratch folder; --log-dir DIR keeps it)" in out
    assert sidecars_started_since(sidecar_binary, started) == []
    assert list(tmp_path.iterdir()) == []  # no state or cache left in the working directory


def test_demo_that_fails_says_which_step_and_why_and_keeps_its_scratch_folder(
    cache_dir: Path, sidecar_binary: Path, tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    """A neighbour kills the demo's sidecar (kill -9 by pid) while the slow request waits on it."""
    scratch_root = tmp_path / "tmp"  # TMPDIR: where the demo makes its scratch folder
    scratch_root.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    output = tmp_path / "demo.out"
    started = time.time()
    with open(output, "wb") as out:
        demo = subprocess.Popen(
            [str(SIDECAR_FSM), "demo", "--cache-dir", str(cache_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=work,
            env={**os.environ, "TMPDIR": str(scratch_root)},
        )
    process_registry.add(demo)

    def text() -> str:
        return output.read_text(errors="replace")

    wait_until(lambda: "(the rewritten base_url" in text() or demo.poll() is not None, 90, "step 4's request")
    assert demo.poll() is None, text()
    (sidecar,) = sidecars_started_since(sidecar_binary, started)
    process_registry.add_pid(sidecar)
    os.kill(sidecar, signal.SIGKILL)

    assert demo.wait(timeout=60) == 1, text()
    out = text()
    assert "Traceback" not in out
    assert re.search(r"^  FAILED  after \d+\.\ds: ", out, re.M), out
    result = out[out.index("result:") :].splitlines()
    assert result[0] == "result: the demo failed at step [4/5] the same request through a sidecar:"
    why = result[1].strip()
    assert why.startswith("the request through the sidecar failed after "), why
    assert "demo" in why and re.search(r"-9|SIGKILL|killed", why), why
    # The scratch folder is kept and named, with the sidecar's log and the state database in it.
    (scratch,) = scratch_root.glob("sidecar-fsm-demo-*")
    assert result[2] == f"kept its scratch folder for a look: {scratch}"
    (log,) = scratch.glob("h2ping-demo-*.log")
    (database,) = scratch.glob("sidecar-fsm/*.db")
    assert result[3] == (
        f"  it holds the sidecar's log {log.name}; the state database {database.relative_to(scratch)}"
    )
    assert result[-1] == "nothing left running"
    # The history it printed shows the instance failed, as the database says.
    assert re.search(r"^\s+\S+ \S+\s+\+\S+\s+demo\s+ready\s+failed\s+fail\s", out, re.M), out
    assert sidecars_started_since(sidecar_binary, started) == []
    assert list(work.iterdir()) == []
    history = subprocess.run(
        [str(SIDECAR_FSM), "history", result[4].split()[-1], "--log-dir", str(scratch), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout)["instances"][0]["state"] == "failed"


def test_demo_that_cannot_build_says_so_in_words_and_leaves_no_folder(tmp_path: Path) -> None:
    """The cache is a path through a file: step 1 fails for real, before anything is started."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache should be\n")
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    done = subprocess.run(
        [str(SIDECAR_FSM), "demo", "--cache-dir", str(blocker / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(scratch_root)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    result = done.stdout[done.stdout.index("result:") :].splitlines()
    assert result[0] == "result: the demo failed at step [1/5] the proxy binary:"
    assert "Not a directory" in result[1] and str(blocker) in result[1], result[1]
    assert result[2:] == ["nothing left running"]
    assert list(scratch_root.iterdir()) == []  # nothing worth keeping: no folder left
    assert blocker.read_text() == "a file where the cache should be\n"
