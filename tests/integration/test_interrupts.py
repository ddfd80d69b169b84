"""Ctrl-C (and, to the CLI, SIGTERM) at every named step of a start: out within 1 s, nothing left.

Each case is a real launcher process (``start_h2_ping_sidecar`` or ``sidecar-fsm start``) with the
real proxy, two instances in front of the lab's origin and a model base_url to rewrite; the crash
point of ``crashpoints.POINTS`` sends the signal to its own process at exactly that step. Then:
``KeyboardInterrupt`` out of the API (exit 130 from the CLI) within 1 s of the signal, no process
left, no run or instance live in the database, the caller's config as it was. The machinery is
``bench/interrupt_hunt.py``'s, which also runs hundreds of random-moment starts on a loaded
machine. A process started with SIGINT ignored (``nohup``, a script's background job) keeps
ignoring it while starting and supervising; SIGTERM still stops it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ProcessRegistry, wait_until
from omegaconf import OmegaConf
from querycluster import open_files

from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager, start_h2_ping_sidecar
from sidecar_fsm.run import crashpoints
from sidecar_fsm.state.dbfile import database_files

# bench/ is not installed with the package: the repo root makes it importable however pytest runs.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import interrupt_hunt  # noqa: E402

# Every point a start of this config passes, in order (``:n`` the n-th hit). The failure-path
# points of a start are hit only by a start that fails anyway (below: a port clash).
START_POINTS = [
    "binary-resolved",
    "store-opened",
    "logs-created",
    "run-recorded",
    "launched:1",
    "spawn-recorded:1",
    "launched:2",
    "spawn-recorded:2",
    "ready-recorded",
    "targets-written",
    "upstreams-checked",
    "rewritten",
    "started",
]
# Points of a stop, a supervision or a reap: a start never passes them (stop-recorded only when
# a start is cut before a launch, which the cases above do too).
NOT_A_START = {
    "launch-failed-recorded": "a binary that cannot be executed: the API refuses it before the start",
    "restart-recorded": "supervision",
    "traffic-recorded": "supervision (the first check() after the start)",
    "drain-recorded": "stop",
    "sigterm-sent": "stop",
    "sigkill-sent": "stop",
    "stopped-recorded": "stop",
    "stop-recorded": "stop",
    "run-ended": "stop",
    "reap-drain-recorded": "reap",
    "reap-ended": "reap",
    "reap-failed-recorded": "reap",
    "reap-run-ended": "reap",
    "stop-requested": "sidecar-fsm stop",
}


def test_every_point_of_a_start_is_interrupted_here() -> None:
    named = {point.partition(":")[0] for point in START_POINTS} | {"fail-recorded"}
    assert sorted(named | set(NOT_A_START)) == sorted(crashpoints.POINTS)


@pytest.fixture
def start_config(sidecar_binary: Path, tls_origin: TlsH2Origin, log_dir: Path) -> dict[str, Any]:
    """The config every case starts; a test may change it before ``interrupt_start`` reads it."""
    return interrupt_hunt.start_config(sidecar_binary, tls_origin.url, tls_origin.ca_file, log_dir)


InterruptStart = Callable[..., None]


@pytest.fixture
def interrupt_start(
    start_config: dict[str, Any], log_dir: Path, process_registry: ProcessRegistry
) -> InterruptStart:
    """``interrupt_start(kind, sig, point, plain=False)``: one start of ``start_config``, cut by
    ``sig`` at ``point``, held to the promise of this file (out within 1 s, nothing left, the
    config as it was, 130 from the CLI). Every case asserts the same verdict; only where the
    signal lands differs."""

    def interrupt(kind: str, sig: signal.Signals, point: str, *, plain: bool = False) -> None:
        result = interrupt_hunt.run_start(
            kind, sig, start_config, log_dir, point=point, track=process_registry.add, plain=plain
        )
        assert result.outcome == "interrupted", result.describe()
        assert result.answer_seconds is not None and result.answer_seconds <= 1.0, result.describe()
        assert result.left == [], result.describe()
        assert result.unchanged is True, result.describe()
        if result.kind == "cli":
            assert result.code == 130, result.describe()

    return interrupt


@pytest.mark.parametrize("point", START_POINTS)
def test_ctrl_c_at_each_point_of_an_api_start(point: str, interrupt_start: InterruptStart) -> None:
    interrupt_start("api", signal.SIGINT, point)


@pytest.mark.parametrize("point", ["rewritten", "started"])
def test_ctrl_c_after_the_rewrite_of_a_plain_dict_puts_it_back(
    point: str, interrupt_start: InterruptStart
) -> None:
    interrupt_start("api", signal.SIGINT, point, plain=True)


# The CLI's two stop signals take turns over the points: each point once, each signal at half.
@pytest.mark.parametrize(
    ("point", "sig"),
    [(point, (signal.SIGTERM, signal.SIGINT)[index % 2]) for index, point in enumerate(START_POINTS)],
    ids=[f"{point}-{('SIGTERM', 'SIGINT')[index % 2]}" for index, point in enumerate(START_POINTS)],
)
def test_a_signal_at_each_point_of_a_cli_start_exits_130(
    point: str, sig: signal.Signals, interrupt_start: InterruptStart
) -> None:
    interrupt_start("cli", sig, point)


@pytest.mark.parametrize("kind", ["api", "cli"])
def test_ctrl_c_while_a_failing_start_records_its_failure(
    kind: str, start_config: dict[str, Any], interrupt_start: InterruptStart
) -> None:
    """The second instance cannot bind its port: SIGINT as its failure is committed."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        start_config["sidecar"]["instances"][1]["listen"] = f"127.0.0.1:{holder.getsockname()[1]}"
        interrupt_start(kind, signal.SIGINT, "fail-recorded")


@pytest.mark.parametrize(
    "second", ["drain-recorded:1", "drain-recorded:2", "sigterm-sent:1", "stopped-recorded:1", "run-ended"]
)
def test_a_second_ctrl_c_while_the_interrupted_start_stops_its_sidecars(
    second: str, interrupt_start: InterruptStart
) -> None:
    """Ctrl-C twice, as impatient users do: the second lands in the cleanup the first began."""
    interrupt_start("api", signal.SIGINT, f"ready-recorded@SIGINT,{second}@SIGINT")


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_start_begun_with_sigint_ignored_keeps_ignoring_it_and_sigterm_stops_it(
    start_config: dict[str, Any],
    log_dir: Path,
    tmp_path: Path,
    process_registry: ProcessRegistry,
) -> None:
    """As ``nohup`` or a script's ``&`` starts it: a SIGINT while starting (sent at a point of the
    start by the start itself) and one while supervising change nothing; SIGTERM drains it."""
    config_file = tmp_path / "gym.yaml"
    config_file.write_text(yaml.safe_dump(start_config))
    env = {**os.environ, crashpoints.ENV_VAR: "spawn-recorded:1@SIGINT"}
    start = subprocess.Popen(
        [sys.executable, "-m", "sidecar_fsm", "start", str(config_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignoring_sigint,
    )
    process_registry.add(start)
    assert start.stdout is not None
    seen: list[str] = []

    def supervising() -> bool:
        line = start.stdout.readline() if start.stdout else ""
        seen.append(line)
        return "supervising" in line or (line == "" and start.poll() is not None)

    wait_until(supervising, 60, lambda: f"the start to supervise; saw {seen}")
    assert start.poll() is None, start.communicate()
    start.send_signal(signal.SIGINT)
    start.send_signal(signal.SIGTERM)
    _, err = start.communicate(timeout=60)
    assert "SIGINT at spawn-recorded" in err  # the start's own SIGINT was sent, and ignored
    assert start.returncode == 0, err
    # The first stop signal it took is the SIGTERM: the SIGINT sent before it changed nothing
    # (caught, it would have been the one to start the drain, and SIGTERM its "again").
    assert "SIGTERM: draining the sidecars" in err, err
    assert "SIGINT: draining" not in err and "again" not in err, err
    assert interrupt_hunt.leftovers(log_dir) == []


# Each reader's exit once it has the signal: top ends its display and exits 0 on either; logs -f
# ends on Ctrl-C (0 in its loop, 130 "interrupted" just before it) and dies of SIGTERM; a query is
# cancelled by Ctrl-C (130) and dies of SIGTERM.
READERS = {
    ("top", signal.SIGINT): {0},
    ("top", signal.SIGTERM): {0},
    ("logs", signal.SIGINT): {0, 130},
    ("logs", signal.SIGTERM): {-signal.SIGTERM},
    ("query", signal.SIGINT): {130},
    ("query", signal.SIGTERM): {-signal.SIGTERM},
}
FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def test_top_logs_and_query_end_within_a_second_of_sigint_or_sigterm(
    start_config: dict[str, Any],
    log_dir: Path,
    process_registry: ProcessRegistry,
    managers: list[H2PingSidecarManager],
) -> None:
    manager = start_h2_ping_sidecar(OmegaConf.create(start_config))
    assert manager is not None
    managers.append(manager)
    (database,) = database_files(log_dir)
    argv = {
        "top": ["top", "--interval", "0.2"],
        "logs": ["logs", "-f", str(manager.run_id)],
        "query": ["query", FOREVER, "--timeout", "60"],
    }
    took = {}
    for (command, sig), codes in READERS.items():
        reader = subprocess.Popen(
            [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(log_dir), *argv[command]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        process_registry.add(reader)
        assert reader.stdout is not None
        if command == "query":  # it prints nothing until it is done: wait until it reads
            reading = lambda pid=reader.pid: any(str(database) in f.path for f in open_files(pid))  # noqa: E731
            wait_until(reading, 30, "the query")
        else:  # a frame of top, the proxies' first log lines
            assert reader.stdout.readline(), reader.communicate()
        sent = time.monotonic()
        reader.send_signal(sig)
        _, err = reader.communicate(timeout=30)
        took[(command, sig.name)] = time.monotonic() - sent
        assert reader.returncode in codes, (command, sig.name, err)
        assert b"Traceback" not in err, err
    assert max(took.values()) <= 1.0, took
