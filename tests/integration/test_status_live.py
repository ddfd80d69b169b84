"""``status`` and ``top`` showing what each sidecar is doing, from its GET /metrics.

Real parts throughout: sidecars started by the launcher (the proxy from the build cache, with
``-metrics-listen 127.0.0.1:0``), the lab's TLS HTTP/2 origin behind the relay that drops idle
connections, the CLI run as a subprocess (``top`` on a pseudo-terminal), SIGSTOP for a sidecar
that cannot answer.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import ProcessRegistry, http11_request, wait_until
from omegaconf import OmegaConf

from sidecar_fsm import cli
from sidecar_fsm.lab import IdleRelay, TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager, start_h2_ping_sidecar
from sidecar_fsm.state.store import Store
from sidecar_fsm.view import live

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@contextmanager
def sidecars(
    log_dir: Path, cache_dir: Path, origin: TlsH2Origin, upstream: str, names: list[str], **block: Any
) -> Iterator[H2PingSidecarManager]:
    """A run started by the launcher, as Gym starts it; stopped at the end whatever happened."""
    config = OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "sidecar": {
                "enabled": True,
                "instances": [
                    {"name": name, "upstream": upstream, "listen": "127.0.0.1:0"} for name in names
                ],
                "ca_file": str(origin.ca_file),
                "ping_interval": "300ms",
                "shutdown_grace": "5s",
                "log_dir": str(log_dir),
                **block,
            },
        }
    )
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    try:
        yield manager
    finally:
        manager.stop()


def status_json(log_dir: Path) -> dict[str, dict[str, Any]]:
    """``sidecar-fsm status --json`` as a user runs it: the instances of the live runs, by name."""
    done = subprocess.run(
        [sys.executable, "-m", "sidecar_fsm", "status", "--json", "--log-dir", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 3), done.stderr  # 3: a live run needs attention
    return {inst["name"]: inst for run in json.loads(done.stdout)["runs"] for inst in run["instances"]}


def database_files(log_dir: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of the state database and its WAL; the -shm index is shared memory that
    readers touch by design (their read marks), so it is left out."""
    return {
        path.name: (path.stat().st_size, path.stat().st_mtime_ns)
        for path in (log_dir / "sidecar-fsm").iterdir()
        if path.name.endswith((".db", ".db-wal"))
    }


def test_the_launcher_records_the_metrics_address_only_when_asked(
    log_dir: Path, cache_dir: Path, sidecar_binary: Path, tls_origin: TlsH2Origin
) -> None:
    with sidecars(log_dir, cache_dir, tls_origin, tls_origin.url, ["on"]) as manager:
        with Store.open(log_dir) as store:
            (record,) = store.instances_of(str(manager.run_id))
        assert record.metrics is not None and record.metrics.startswith("127.0.0.1:")
        assert live.scrape_all({"on": record.metrics}, timeout=5)["on"].figures is not None
    with sidecars(log_dir, cache_dir, tls_origin, tls_origin.url, ["off"], metrics=False) as manager:
        with Store.open(log_dir) as store:
            (record,) = store.instances_of(str(manager.run_id))
        assert record.state == "ready" and record.metrics is None
        # No address, nothing asked: the figures are simply absent.
        assert status_json(log_dir)["off"]["live"] is None


def test_status_follows_a_slow_request_kept_alive_through_the_relay(
    log_dir: Path,
    cache_dir: Path,
    sidecar_binary: Path,
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., IdleRelay],
) -> None:
    relay = idle_relay(tls_origin, idle=1.0)
    with sidecars(log_dir, cache_dir, tls_origin, f"https://localhost:{relay.port}", ["policy"]) as manager:
        (policy,) = manager.instances_actual
        host, port = policy.listen.rsplit(":", 1)
        with ThreadPoolExecutor(1) as pool:
            # Longer than the relay's idle limit several times over: only PINGs keep it open.
            pending = pool.submit(http11_request, host, int(port), "/slow?first_byte=6", timeout=30)
            first = wait_until(
                lambda: (inst := status_json(log_dir)["policy"])["live"]["requests_in_flight"] == 1 and inst,
                10,
                "status to show the request in flight",
            )["live"]
            during = wait_until(
                lambda: (
                    (figures := status_json(log_dir)["policy"]["live"])["pings_sent"] >= 2
                    and figures["ping_acks"] == figures["pings_sent"]
                    and figures
                ),
                10,
                "status to show PINGs sent and acknowledged while the request waits",
            )
            assert first["answered"] is True and first["problem"] is None
            assert during["requests_in_flight"] == 1
            assert during["oldest_request_age_seconds"] > first["oldest_request_age_seconds"]
            assert during["upstream_up"] is True
            response = pending.result(timeout=30)
        assert response.status == 200, response.body
        after = wait_until(
            lambda: (
                (figures := status_json(log_dir)["policy"]["live"])["requests_in_flight"] == 0 and figures
            ),
            10,
            "status to show nothing in flight",
        )
        assert after["oldest_request_age_seconds"] == 0 and after["requests_total"] == 1
        assert relay.drops == 0


def test_a_stopped_sidecar_reads_no_answer_needs_attention_and_status_still_shows_the_others(
    log_dir: Path,
    cache_dir: Path,
    sidecar_binary: Path,
    tls_origin: TlsH2Origin,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sidecars(log_dir, cache_dir, tls_origin, tls_origin.url, ["policy", "judge"]) as manager:
        with Store.open(log_dir) as store:
            judge_pid = next(i.pid for i in store.instances_of(str(manager.run_id)) if i.name == "judge")
        assert judge_pid is not None
        wait_until(lambda: status_json(log_dir)["policy"]["live"]["upstream_up"], 10, "the start-up dial")
        written = database_files(log_dir)
        os.kill(judge_pid, signal.SIGSTOP)
        try:
            instances = status_json(log_dir)
            assert instances["judge"]["live"] == {
                **{key: None for key in instances["judge"]["live"]},
                "metrics": instances["judge"]["metrics"],
                "answered": False,
                "problem": live.NO_ANSWER,
            }
            assert instances["judge"]["alive"] is True  # stopped is not dead: the process is ours
            assert (instances["judge"]["process"], instances["policy"]["process"]) == ("stopped", "running")
            assert instances["policy"]["live"]["answered"] is True
            # In process, to time it: the deadline holds, the command does not wait for the judge.
            capsys.readouterr()
            started = time.monotonic()
            # A frozen proxy serves nobody: the run needs attention (exit 3), naming it.
            assert cli.main(["status", "--log-dir", str(log_dir)]) == 3
            took = time.monotonic() - started
            table = capsys.readouterr().out
            assert cli.main(["status", "--json", "--log-dir", str(log_dir)]) == 3
            (run,) = json.loads(capsys.readouterr().out)["runs"]
            assert (
                run["attention"]
                == f"judge is stopped (pid {judge_pid}: SIGSTOP, a debugger); it answers nothing"
            )
            assert database_files(log_dir) == written  # reading wrote nothing
        finally:
            os.kill(judge_pid, signal.SIGCONT)
        # Thawed, it answers again and the run is healthy: the freeze alone made the 3.
        wait_until(lambda: cli.main(["status", "--log-dir", str(log_dir)]) == 0, 10, "a healthy status")
    assert took < live.SCRAPE_TIMEOUT_SECONDS + 2.0, took
    rows = {line.split()[0]: line for line in table.splitlines() if line.startswith("  ")}
    header = rows["NAME"]
    assert "IN FLIGHT" in header and "PINGS SENT/ACKED" in header
    assert rows["judge"][header.index("IN FLIGHT") :].startswith("no answer")
    stopped = f"pid {judge_pid} stopped (SIGSTOP, a debugger): it answers nothing; kill -CONT {judge_pid}; "
    assert rows["judge"].endswith(stopped + f"/metrics at {instances['judge']['metrics']}: no answer"), rows
    policy_live = rows["policy"][header.index("IN FLIGHT") :].split()
    assert policy_live[:2] == ["0", "-"] and policy_live[3] == "up"


# --- top on a terminal ------------------------------------------------------------------------


def _read_until(fd: int, seen: bytearray, predicate: Callable[[str], bool], timeout: float) -> str:
    """Read the pty into ``seen`` until ``predicate(text without escapes)`` holds; that text."""
    closed = False

    def text() -> str:
        return ANSI.sub("", seen.decode("utf-8", errors="replace"))

    def satisfied() -> str | None:
        nonlocal closed
        if predicate(text()):
            return text()
        assert not closed, f"top closed its terminal early; it printed:\n{text()[-3000:]}"
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            closed = not chunk
            seen.extend(chunk)
        return None

    found = wait_until(satisfied, timeout, lambda: f"top's output; it printed:\n{text()[-3000:]}", poll=0)
    assert found is not None
    return found


def _drain(fd: int, seen: bytearray, timeout: float = 10) -> None:
    """Read what an exited child left on the pty into ``seen``, up to the end (EIO on Linux)."""

    def ended() -> bool:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if not ready:
            return False
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            return True
        seen.extend(chunk)
        return not chunk

    wait_until(ended, timeout, "the end of top's output on its terminal", poll=0)


def test_top_redraws_the_figures_until_ctrl_c_and_restores_the_terminal(
    log_dir: Path,
    cache_dir: Path,
    sidecar_binary: Path,
    tls_origin: TlsH2Origin,
    process_registry: ProcessRegistry,
) -> None:
    with sidecars(log_dir, cache_dir, tls_origin, tls_origin.url, ["policy"]):
        wait_until(lambda: status_json(log_dir)["policy"]["live"]["upstream_up"], 10, "the start-up dial")
        master, slave = os.openpty()
        # A wide terminal, so a row is not cut at the default 80 columns.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 220, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "220", "LINES": "40"}
        env.pop("NO_COLOR", None)
        try:
            top = subprocess.Popen(
                [sys.executable, "-m", "sidecar_fsm", "top", "--interval", "0.3", "--log-dir", str(log_dir)],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                start_new_session=True,
            )
            process_registry.add(top)
            os.close(slave)
            slave = -1
            seen = bytearray()
            # Three frames: the heading is drawn again each time.
            text = _read_until(master, seen, lambda t: t.count("sidecar-fsm top: 1 live run") >= 3, 30)
            policy = next(line for line in reversed(text.splitlines()) if line.strip().startswith("policy"))
            header = next(line for line in reversed(text.splitlines()) if line.strip().startswith("NAME"))
            figures = policy[header.index("IN FLIGHT") :].split()
            assert figures[:2] == ["0", "-"] and figures[3] == "up", policy
            assert "\x1b[?25l" in seen.decode(errors="replace")  # the display hid the cursor
            top.send_signal(signal.SIGINT)
            assert top.wait(20) == 0
            _drain(master, seen)
        finally:
            os.close(master)
            if slave != -1:
                os.close(slave)
    raw = seen.decode(errors="replace")
    # Restored: the cursor shown again after it was last hidden, and no traceback.
    assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l"), raw[-500:]
    assert "Traceback" not in raw


def test_top_refuses_a_bad_interval_and_an_unknown_run_in_one_line(log_dir: Path, tmp_path: Path) -> None:
    def top(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sidecar_fsm", "top", "--log-dir", str(log_dir), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    bad = top("--interval", "0")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "sidecar-fsm top: --interval '0': must be a number of seconds above 0; try 2\n"
    with Store.open(log_dir):
        pass  # an empty database: no run to find
    unknown = top("--run", "nosuchrun")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("sidecar-fsm top --run: run 'nosuchrun' is not recorded in ")
    missing = top("--log-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_top_into_a_pipe_prints_frame_after_frame_until_sigint(
    log_dir: Path, process_registry: ProcessRegistry
) -> None:
    """Not a terminal: nothing to redraw in place, so frames follow one another (``top -b``)."""
    with Store.open(log_dir):
        pass  # an empty database: top shows that there is no live run, frame after frame
    top = subprocess.Popen(
        [sys.executable, "-m", "sidecar_fsm", "top", "--interval", "0.2", "--log-dir", str(log_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    process_registry.add(top)
    assert top.stdout is not None
    seen = bytearray()
    try:
        _read_until(top.stdout.fileno(), seen, lambda text: text.count("no live runs") >= 2, 30)
    finally:
        top.send_signal(signal.SIGINT)
        out, err = top.communicate(timeout=20)
    text = (seen + out).decode()
    assert top.returncode == 0, err
    assert err == b"" and "\x1b[" not in text  # plain text, no cursor movement
    assert text.startswith("sidecar-fsm top: 0 live runs in ")
    assert text.count("sidecar-fsm top: 0 live runs in ") >= 2
