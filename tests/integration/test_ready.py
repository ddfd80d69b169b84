"""ready.wait_all_ready on real children that bind a socket and write the ready file like go/ready.go."""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import kill_and_reap, wait_until

from sidecar_fsm.base import procs, ready
from sidecar_fsm.base.ready import ReadyInfo, ReadyWait

# argv: ready_path delay_seconds [exit_code]. Binds first, waits `delay`, then writes the file
# the way the Go proxy does (temp file + rename) and stores the CLOCK_MONOTONIC time of the
# rename (system-wide, so comparable with the parent's) beside it. With exit_code, exits
# instead of becoming ready.
CHILD = r"""
import json, os, socket, sys, time
ready_path, delay = sys.argv[1], float(sys.argv[2])
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
time.sleep(delay)
if len(sys.argv) > 3:
    sys.exit(int(sys.argv[3]))
host, port = sock.getsockname()
temp = f"{ready_path}.tmp-{os.getpid()}"
with open(temp, "w") as file:
    json.dump({"pid": os.getpid(), "listen": f"{host}:{port}"}, file)
os.replace(temp, ready_path)
renamed = time.monotonic()
with open(ready_path + ".renamed", "w") as file:
    file.write(repr(renamed))
time.sleep(60)
"""


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    kill_and_reap(started)


def _start(
    children: list[subprocess.Popen[bytes]], ready_path: Path, delay: float, exit_code: int | None = None
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", CHILD, str(ready_path), str(delay)]
    if exit_code is not None:
        argv.append(str(exit_code))
    process = procs.spawn(argv, dict(os.environ), str(ready_path) + ".log")
    children.append(process)
    return process


def test_read_ready_file_rejects_missing_partial_malformed_and_other_pids(tmp_path: Path) -> None:
    path = tmp_path / "x.ready"
    assert ready.read_ready_file(path, 5, "127.0.0.1:1250") is None
    for text in [
        '{"pid": 12',
        "[]",
        '{"pid": true, "listen": "a:1"}',
        '{"pid": 5}',
        '{"pid": 5, "listen": ""}',
        '{"pid": 6, "listen": "127.0.0.1:1250"}',  # another process's file
        "1",  # a bare pid caught half-way through being written
        "51",
        "\xff",
    ]:
        path.write_text(text)
        assert ready.read_ready_file(path, 5, "127.0.0.1:1250") is None, text
    path.write_text('{"pid": 5, "listen": "127.0.0.1:1250"}')
    assert ready.read_ready_file(path, 5) == ReadyInfo(5, "127.0.0.1:1250")
    path.write_text('{"pid": 5, "listen": "127.0.0.1:1250", "metrics": "127.0.0.1:9100"}')
    assert ready.read_ready_file(path, 5) == ReadyInfo(5, "127.0.0.1:1250", "127.0.0.1:9100")
    path.write_text('{"pid": 5, "listen": "127.0.0.1:1250", "route": "via egress proxy http://p:3128"}')
    assert ready.read_ready_file(path, 5) == ReadyInfo(
        5, "127.0.0.1:1250", None, "via egress proxy http://p:3128"
    )
    path.write_text('{"pid": 5, "listen": "127.0.0.1:1250", "route": 7}')  # not a route: none said
    assert ready.read_ready_file(path, 5) == ReadyInfo(5, "127.0.0.1:1250")


def test_bare_pid_form_counts_with_the_configured_listen(tmp_path: Path) -> None:
    """NeMo Gym's binary writes its pid in place: no JSON, no rename, the configured address."""
    path = tmp_path / "gym.ready"
    path.write_text("5\n")
    assert ready.read_ready_file(path, 5, "127.0.0.1:1250") == ReadyInfo(5, "127.0.0.1:1250")
    assert ready.read_ready_file(path, 5) is None  # the address is unknown without the config
    # Gym's launcher takes the file's existence as readiness and its test doubles write "1":
    # a whole line counts whatever the number; a line still being written does not.
    path.write_text("1\n")
    assert ready.read_ready_file(path, 5, "127.0.0.1:1250") == ReadyInfo(5, "127.0.0.1:1250")
    for text in ["1", "0\n", "\n"]:
        path.write_text(text)
        assert ready.read_ready_file(path, 5, "127.0.0.1:1250") is None, text


def test_bare_pid_written_in_place_in_pieces_counts_only_once_whole(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "pieces.ready"
    script = (
        "import os, sys, time\n"
        "pid = str(os.getpid())\n"
        "with open(sys.argv[1], 'w') as file:\n"
        "    file.write(pid[:-1]); file.flush(); time.sleep(0.5); file.write(pid[-1])\n"
        "time.sleep(60)\n"
    )
    child = procs.spawn([sys.executable, "-c", script, str(path)], dict(os.environ), str(path) + ".log")
    children.append(child)
    began = time.monotonic()
    outcome = ready.wait_all_ready([ReadyWait("g", str(path), child, "127.0.0.1:1250")], 20)["g"]
    assert outcome.info == ReadyInfo(child.pid, "127.0.0.1:1250")
    assert time.monotonic() - began >= 0.5


def test_ready_child_is_detected_with_its_bound_address(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "a.ready"
    child = _start(children, path, 0.2)
    outcome = ready.wait_all_ready([ReadyWait("a", str(path), child)], 20)["a"]
    assert outcome.info is not None and outcome.info.pid == child.pid
    assert outcome.info.listen.startswith("127.0.0.1:")
    assert outcome.exit_code is None and not outcome.timed_out
    assert child.poll() is None


def test_stale_ready_file_with_another_pid_is_ignored(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "stale.ready"
    path.write_text(json.dumps({"pid": os.getpid(), "listen": "127.0.0.1:1"}))  # left by another run
    child = _start(children, path, 0.3)
    began = time.monotonic()
    outcome = ready.wait_all_ready([ReadyWait("s", str(path), child)], 20)["s"]
    assert outcome.info is not None and outcome.info.pid == child.pid
    assert outcome.info.listen != "127.0.0.1:1"
    assert time.monotonic() - began >= 0.3

    # A stale file and a child that never becomes ready: a timeout, never readiness.
    other = tmp_path / "never.ready"
    other.write_text(json.dumps({"pid": os.getpid(), "listen": "127.0.0.1:1"}))
    slow = _start(children, other, 60)
    outcome = ready.wait_all_ready([ReadyWait("n", str(other), slow)], 0.3)["n"]
    assert outcome.timed_out and outcome.info is None and outcome.exit_code is None


def test_child_that_exits_first_reports_its_exit_code_at_once(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "dies.ready"
    child = _start(children, path, 0.1, exit_code=3)
    began = time.monotonic()
    outcome = ready.wait_all_ready([ReadyWait("d", str(path), child)], 30)["d"]
    assert outcome.exit_code == 3 and outcome.info is None and not outcome.timed_out
    assert time.monotonic() - began < 10  # woken by the exit, not by the 30 s deadline
    assert child.returncode == 3  # reaped


def test_timeout_is_reported_after_the_deadline(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "slow.ready"
    child = _start(children, path, 60)
    began = time.monotonic()
    outcome = ready.wait_all_ready([ReadyWait("t", str(path), child)], 0.5)["t"]
    elapsed = time.monotonic() - began
    assert outcome.timed_out and outcome.info is None and outcome.exit_code is None
    assert 0.5 <= elapsed < 1.5
    assert child.poll() is None  # waiting never ends the child: the caller decides


def test_mixed_outcomes_in_one_wait(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    waits = [
        ReadyWait("ok", str(tmp_path / "ok.ready"), _start(children, tmp_path / "ok.ready", 0.1)),
        ReadyWait("dies", str(tmp_path / "dies.ready"), _start(children, tmp_path / "dies.ready", 0.1, 4)),
        ReadyWait(
            "slow", str(tmp_path / "sub" / "slow.ready"), _start(children, tmp_path / "slow.ready", 60)
        ),
    ]
    # tmp_path/sub does not exist: that wait reads nothing until its deadline, the others go on.
    outcomes = ready.wait_all_ready(waits, 1.5)
    assert list(outcomes) == ["ok", "dies", "slow"]
    assert outcomes["ok"].info is not None
    assert outcomes["dies"].exit_code == 4
    assert outcomes["slow"].timed_out


def test_file_already_there_before_the_wait_is_seen(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "early.ready"
    child = _start(children, path, 0)
    wait_until((tmp_path / "early.ready.renamed").exists, 20, "the child to rename its ready file")
    began = time.monotonic()
    outcome = ready.wait_all_ready([ReadyWait("e", str(path), child)], 20)["e"]
    assert outcome.info is not None and outcome.info.pid == child.pid
    assert time.monotonic() - began < 0.1


def test_four_children_awaited_together_take_one_startup(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    delay = 1.0
    began = time.monotonic()
    waits = []
    for index in range(4):
        path = tmp_path / f"c{index}.ready"
        waits.append(ReadyWait(f"c{index}", str(path), _start(children, path, delay)))
    outcomes = ready.wait_all_ready(waits, 30)
    elapsed = time.monotonic() - began
    assert all(outcome.info is not None for outcome in outcomes.values())
    assert {outcome.info.pid for outcome in outcomes.values() if outcome.info} == {
        w.process.pid for w in waits
    }
    # Four startups in sequence would take 4 s; together they take one delay plus process start.
    assert elapsed < 2 * delay, f"4 children took {elapsed:.2f}s"


def _text_once_written(path: Path) -> str:
    """What ``path`` holds, or "" while it does not exist yet."""
    return path.read_text() if path.exists() else ""


def test_latency_from_rename_to_return(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    """The wait returns within a poll interval or so of the rename."""
    latencies = []
    for index in range(5):
        path = tmp_path / f"lat{index}.ready"
        child = _start(children, path, 0.15)
        outcome = ready.wait_all_ready([ReadyWait("l", str(path), child)], 20)["l"]
        returned = time.monotonic()
        assert outcome.info is not None
        stamp = Path(str(path) + ".renamed")
        wait_until(functools.partial(_text_once_written, stamp), 10, f"the rename time in {stamp}")
        latencies.append(returned - float(stamp.read_text()))
    median_ms = statistics.median(latencies) * 1000
    print(f"rename -> wait_all_ready returned: median {median_ms:.3f} ms, max {max(latencies) * 1000:.3f} ms")
    # Generous bound for a loaded 2-core machine: a few poll intervals.
    assert median_ms < 4 * ready.POLL_SECONDS * 1000 + 20
