"""A launcher (or a reaper) SIGKILLed at every crash point: status tells the truth, reap leaves nothing.

Each case runs a real launcher in a subprocess (``start_h2_ping_sidecar``, the real proxy, a real
SQLite file) with ``SIDECAR_FSM_CRASH_AT`` naming one point of ``crashpoints.POINTS``; the
launcher kills itself there with SIGKILL, which runs no cleanup. Then ``status --json`` and
``reap`` run as a user would, and the run must be closed for good: no process of it left, no
ready or temp file, its fixed port free for a new proxy, the database intact, every instance
terminal with a history that is a legal path of ``fsm.TRANSITIONS`` ending in its state. Both
``exit_with_owner`` settings: with it the orphans drain by themselves, without it only reap ends
them. A structural test keeps the list honest: every commit, spawn and signal site of the
lifecycle modules is followed by a crash point, and every point is exercised here.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import ProcessRegistry
from launchrun import request_in_flight

import sidecar_fsm
from sidecar_fsm import cli
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.run import crashpoints
from sidecar_fsm.state import fsm
from sidecar_fsm.state.store import open_all_hosts

# The launcher under test: start, then serve "stop" from stdin while check() supervises (the
# poll loop of Gym's RunHelper). ``mode`` "direct" drives NodeSidecars with a binary the
# launcher API would refuse earlier (one that cannot be executed).
_DRIVER = r"""
import json, select, sys
from omegaconf import OmegaConf
from sidecar_fsm.errors import SidecarError
spec = json.loads(sys.argv[1])
config = OmegaConf.create(spec["config"])
if spec["mode"] == "direct":
    from sidecar_fsm.config import h2_ping_sidecar_config_from_global_config
    from sidecar_fsm.run.supervise import NodeSidecars
    parsed = h2_ping_sidecar_config_from_global_config(config)
    sidecars = NodeSidecars(parsed, parsed.instances, spec["binary"], spec["log_dir"])
    try:
        sidecars.start()
    except SidecarError:
        sys.exit(1)
else:
    from sidecar_fsm.launcher import start_h2_ping_sidecar
    try:
        manager = start_h2_ping_sidecar(config)
    except SidecarError:
        sys.exit(1)
    sidecars = manager._sidecars
sidecars.stop_slack_seconds = spec["slack"]
print("READY", flush=True)
while True:
    readable, _, _ = select.select([sys.stdin], [], [], 0.05)
    if readable and sys.stdin.readline().strip() in ("stop", ""):
        break
    if sidecars.failures() and not spec.get("tolerate_failures"):
        break
sidecars.stop()
"""

NO_UPSTREAM = "https://127.0.0.1:9"  # nothing listens; the proxy's background dial just logs it
GRACE = "1s"
SLACK = 0.3

# (scenario, point[:n], when): ``start`` points are hit before the driver prints READY, ``stop``
# points after "stop" (in scenario ``stuck`` with one proxy SIGSTOPped first), ``supervise``
# points after the test kills a proxy; ``reap`` points crash the first reaper of a launcher the
# test SIGKILLed once ready, one proxy SIGSTOPped so that the reaper has a process to end.
CASES: list[tuple[str, str, str]] = [
    ("two", "binary-resolved", "start"),
    ("two", "store-opened", "start"),
    ("two", "logs-created", "start"),
    ("two", "run-recorded", "start"),
    ("two", "launched:1", "start"),
    ("two", "launched:2", "start"),
    ("two", "spawn-recorded:1", "start"),
    ("two", "spawn-recorded:2", "start"),
    ("two", "ready-recorded", "start"),
    ("two", "targets-written", "start"),
    ("two", "upstreams-checked", "start"),
    ("two", "rewritten", "start"),
    ("two", "started", "start"),
    # The first check() after the start imports the figures each proxy wrote as it started.
    ("two", "traffic-recorded", "start"),
    ("two", "drain-recorded:1", "stop"),
    ("two", "sigterm-sent:1", "stop"),
    ("two", "sigterm-sent:2", "stop"),
    ("two", "stopped-recorded:1", "stop"),
    ("two", "run-ended", "stop"),
    ("clash", "fail-recorded:1", "start"),
    ("unstartable", "launch-failed-recorded", "start"),
    ("unstartable", "stop-recorded", "start"),
    ("restart", "launched:3", "supervise"),
    ("restart", "restart-recorded", "supervise"),
    ("stuck", "sigkill-sent", "stop"),
    ("two", "reap-drain-recorded", "reap"),
    ("two", "reap-ended", "reap"),
    ("two", "reap-failed-recorded", "reap"),
    ("two", "reap-run-ended", "reap"),
]

# Points before the run is on record: a crash there leaves no run and no process.
BEFORE_THE_RUN = frozenset({"binary-resolved", "store-opened", "logs-created"})

# Points of commands other than a launcher's, each crashed in its own test.
TESTED_ELSEWHERE = {
    "stop-requested": "test_stop_command.py::test_a_stop_killed_after_its_signal_still_stops_the_run",
}

# Every module of the run layer (it starts, signals and records children) and the launcher.
LIFECYCLE_MODULES = ("run/*.py", "launcher.py")
# Calls that commit, start a process or signal one; ``transaction`` is checked at its ``with``.
_SITE_NAMES = frozenset(
    {
        "fire",
        "fire_together",
        "spawn",
        "signal_if_ours",
        "terminate",
        "end_run",
        "create_run",
        "create_instances",
        "record_transition",
        "transaction",
    }
)


# --- the structure ---------------------------------------------------------------------------


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _is_hit(statement: ast.stmt | None) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and ast.unparse(statement.value.func) == "crashpoints.hit"
    )


def _sites_without_point(tree: ast.Module) -> list[str]:
    """Each commit/spawn/signal site whose statement is not followed by ``crashpoints.hit``."""
    missing: list[str] = []

    def visit_body(body: list[ast.stmt], in_transaction: bool) -> None:
        for index, statement in enumerate(body):
            following = body[index + 1] if index + 1 < len(body) else None
            opens_transaction = isinstance(statement, ast.With) and any(
                isinstance(item.context_expr, ast.Call) and _called_name(item.context_expr) == "transaction"
                for item in statement.items
            )
            shallow = [
                node
                for node in ast.walk(statement)
                if isinstance(node, ast.Call) and _called_name(node) in _SITE_NAMES
            ]
            own = [call for call in shallow if _owned_by(statement, call)]
            if (opens_transaction or (own and not in_transaction)) and not _is_hit(following):
                names = sorted({_called_name(call) or "" for call in own}) or ["transaction"]
                missing.append(f"line {statement.lineno}: {', '.join(names)}")
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(statement, field, None)
                if isinstance(inner, list):
                    for child in inner:
                        if isinstance(child, ast.ExceptHandler):
                            visit_body(child.body, in_transaction)
                    statements = [child for child in inner if isinstance(child, ast.stmt)]
                    if statements:
                        visit_body(statements, in_transaction or opens_transaction)

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            visit_body(node.body, False)
    return sorted(set(missing))


def _owned_by(statement: ast.stmt, call: ast.Call) -> bool:
    """True if ``call`` belongs to ``statement`` itself, not to a statement nested in its body."""
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(statement, field, None) or []:
            if any(node is call for node in ast.walk(child)):
                return False
    return True


def _module_trees() -> dict[str, ast.Module]:
    package = Path(sidecar_fsm.__file__).parent
    paths = [path for pattern in LIFECYCLE_MODULES for path in sorted(package.glob(pattern))]
    return {str(path.relative_to(package)): ast.parse(path.read_text()) for path in paths}


def test_every_commit_spawn_and_signal_site_is_followed_by_a_crash_point() -> None:
    missing = {name: _sites_without_point(tree) for name, tree in _module_trees().items()}
    assert {name: sites for name, sites in missing.items() if sites} == {}


def test_every_point_is_hit_somewhere_and_every_point_is_tested() -> None:
    used: set[str] = set()
    for tree in _module_trees().values():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in crashpoints.POINTS
            ):
                used.add(node.value)
    assert sorted(set(crashpoints.POINTS) - used) == []
    tested = {point.partition(":")[0] for _, point, _ in CASES} | set(TESTED_ELSEWHERE)
    assert sorted(tested) == sorted(crashpoints.POINTS)


def test_an_unknown_crash_point_is_refused_not_ignored(tmp_path: Path) -> None:
    """A typo in the variable must not let a crash test pass without crashing anywhere."""
    probe = "from sidecar_fsm.run import crashpoints; crashpoints.hit('run-recorded')"
    env = {**os.environ, crashpoints.ENV_VAR: "run-recordd"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "'run-recordd' is not a crash point" in done.stderr


# --- the cases -------------------------------------------------------------------------------


def _free_fixed_port(taken: set[int]) -> int:
    """A port below the ephemeral range (other tests' ``:0`` binds never land there) that is free."""
    for port in range(21000 + (os.getpid() % 1000) * 8, 30000):
        if port in taken:
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    continue
                raise
        taken.add(port)
        return port
    raise AssertionError("no free port below 30000")


@pytest.fixture(scope="module")
def taken_ports() -> set[int]:
    return set()


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port a listening socket of this test holds, so a proxy told to bind it exits at once."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _config(
    scenario: str, log_dir: Path, binary: Path, port: int, clash: int, exit_with_owner: bool
) -> dict[str, Any]:
    second = f"127.0.0.1:{clash}" if scenario == "clash" else "127.0.0.1:0"
    sidecar: dict[str, Any] = {
        "enabled": True,
        "binary": str(binary),
        "instances": [
            {"name": "fixed", "upstream": NO_UPSTREAM, "listen": f"127.0.0.1:{port}"},
            {"name": "second", "upstream": NO_UPSTREAM, "listen": second},
        ],
        "shutdown_grace": GRACE,
        "startup_timeout_seconds": 20,
        "exit_with_owner": exit_with_owner,
        "log_dir": str(log_dir),
    }
    if scenario == "restart":
        sidecar["restart"] = {"max_restarts": 2, "backoff": "100ms"}
    return {
        "policy_base_url": NO_UPSTREAM,
        "policy_model": {"responses_api_models": {"m": {"base_url": "${policy_base_url}"}}},
        "sidecar": sidecar,
    }


def _start_driver(
    spec: dict[str, Any], env: dict[str, str], registry: ProcessRegistry
) -> subprocess.Popen[str]:
    """The launcher under test (``_DRIVER``) for ``spec``, its stdin and stdout piped, in ``registry``."""
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps(spec)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    registry.add(driver)
    return driver


def _records(log_dir: Path) -> list[tuple[Any, list[Any], dict[int, list[Any]]]]:
    out = []
    for store in open_all_hosts(log_dir):
        try:
            for run in store.list_runs("all"):
                instances = store.instances_of(run.run_id)
                out.append((run, instances, {inst.id: store.history(inst.id) for inst in instances}))
        finally:
            store.close()
    return out


def _processes_of(log_dir: Path) -> list[psutil.Process]:
    """Live processes whose argv names a file in ``log_dir`` (every sidecar of these runs)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(str(log_dir) in arg for arg in process.info["cmdline"] or []):
            found.append(process)
    return found


def _ready_path_of(process: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        if "-ready-file" in argv:
            return argv[argv.index("-ready-file") + 1]
    return None


def _pid_of(log_dir: Path, name: str) -> int:
    ((_, instances, _),) = _records(log_dir)
    (inst,) = [inst for inst in instances if inst.name == name]
    assert inst.pid is not None
    return int(inst.pid)


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    # status exits 3 when a live run needs attention (a crashed launcher's run): still its JSON.
    assert code in ((0, 3) if "status" in argv else (0,)), captured.err
    return json.loads(captured.out)


def _assert_legal_history(name: str, state: str, rows: list[Any]) -> None:
    assert rows, f"{name}: no history"
    current = "configured"
    for row in rows:
        assert row.source == current, f"{name}: {row.source} after {current}"
        assert fsm.target_of(row.source, row.event) == row.dest, (
            f"{name}: {row.source} -{row.event}-> {row.dest}"
        )
        current = row.dest
    assert current == state, f"{name}: history ends in {current}, row says {state}"


@pytest.mark.parametrize("exit_with_owner", [False, True], ids=["no-exit-with-owner", "exit-with-owner"])
@pytest.mark.parametrize(("scenario", "point", "when"), CASES, ids=[f"{s}-{p}" for s, p, _ in CASES])
def test_crash_at_point_then_reap_leaves_nothing(
    scenario: str,
    point: str,
    when: str,
    exit_with_owner: bool,
    sidecar_binary: Path,
    tmp_path: Path,
    log_dir: Path,
    taken_ports: set[int],
    held_port: int,
    process_registry: ProcessRegistry,
    run_sidecar: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = _free_fixed_port(taken_ports)
    binary = sidecar_binary
    if scenario == "unstartable":
        binary = tmp_path / "not-a-program"
        binary.write_bytes(b"\x7fELF garbage, the kernel refuses to exec this")
        binary.chmod(0o755)
    spec = {
        "mode": "direct" if scenario == "unstartable" else "api",
        "config": _config(scenario, log_dir, binary, port, held_port, exit_with_owner),
        "binary": str(binary),
        "log_dir": str(log_dir),
        "slack": SLACK,
    }
    env = dict(os.environ)
    env.pop(crashpoints.ENV_VAR, None)
    if when != "reap":
        env[crashpoints.ENV_VAR] = point
    driver = _start_driver(spec, env, process_registry)
    try:
        _drive(driver, scenario, when, log_dir)
        assert driver.wait(60) == -signal.SIGKILL, f"the driver did not die at {point}"
    finally:
        for process in _processes_of(log_dir):  # the registry ends what a failed case left
            process_registry.add_pid(process.pid)
    if when == "reap":
        reaper_env = {**os.environ, crashpoints.ENV_VAR: point}
        reaper = subprocess.run(
            [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(log_dir), "reap"],
            env=reaper_env,
            capture_output=True,
            timeout=60,
        )
        assert reaper.returncode == -signal.SIGKILL, f"the reaper did not die at {point}"

    if point in BEFORE_THE_RUN:
        assert _records(log_dir) == []
        assert _processes_of(log_dir) == []
        return

    # status tells what is true now: the owner is gone, and an instance is alive exactly when a
    # process of it runs (recorded or not). With exit_with_owner the orphans are exiting on
    # their own meanwhile, so only the owner is stable enough to compare.
    running = {_ready_path_of(process) for process in _processes_of(log_dir)}
    (run_status,) = _cli_json(capsys, "--log-dir", str(log_dir), "status", "--json", "--all")["runs"]
    assert run_status["owner"]["status"] in ("dead", "reused")
    if not exit_with_owner:
        for inst in run_status["instances"]:
            if inst["state"] in ("stopped", "failed"):
                continue
            expected = True if inst["ready_path"] in running else (False if inst["pid"] else None)
            assert inst["alive"] == expected, (inst["name"], inst["state"], inst["pid"], running)

    _cli_json(capsys, "--log-dir", str(log_dir), "reap", "--json")

    assert _processes_of(log_dir) == []
    assert sorted(p.name for p in log_dir.glob("*.ready")) == []
    assert sorted(p.name for p in log_dir.glob(".*.tmp*")) == []
    ((run, instances, histories),) = _records(log_dir)
    assert run.ended_at is not None
    for inst in instances:
        assert inst.state in fsm.TERMINAL, (inst.name, inst.state)
        _assert_legal_history(inst.name, inst.state, histories[inst.id])
    for store in open_all_hosts(log_dir):
        with contextlib.closing(sqlite3.connect(store.path)) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        store.close()
    # A new proxy binds the fixed port the crashed run had.
    assert run_sidecar(NO_UPSTREAM, "-listen", f"127.0.0.1:{port}").port == port
    # A second reap finds nothing to do.
    assert _cli_json(capsys, "--log-dir", str(log_dir), "reap", "--json")["runs"] == []


def _drive(driver: subprocess.Popen[str], scenario: str, when: str, log_dir: Path) -> None:
    """Take the driver to where its crash point lies; it dies there by itself."""
    if when == "start":
        return
    assert driver.stdout is not None and driver.stdin is not None
    # The launcher prints its own lines (each instance, each rewritten URL) before READY.
    lines = iter(driver.stdout.readline, "")
    if not any(line.strip() == "READY" for line in lines):
        raise AssertionError(f"driver ended before READY (exit {driver.wait(60)})")
    if when == "supervise":
        os.kill(_pid_of(log_dir, "fixed"), signal.SIGKILL)
        return
    if when == "reap":
        # A proxy that cannot drain by itself (stopped) outlives its owner even with
        # exit_with_owner, so the reaper has one to drain and end; then the launcher dies.
        os.kill(_pid_of(log_dir, "fixed"), signal.SIGSTOP)
        driver.kill()
        return
    if when == "stuck" or scenario == "stuck":
        os.kill(_pid_of(log_dir, "fixed"), signal.SIGSTOP)
    driver.stdin.write("stop\n")
    driver.stdin.flush()


@pytest.mark.parametrize("exit_with_owner", [False, True], ids=["no-exit-with-owner", "exit-with-owner"])
def test_launcher_killed_mid_drain_reap_lets_the_request_finish(
    exit_with_owner: bool,
    sidecar_binary: Path,
    tls_origin: TlsH2Origin,
    log_dir: Path,
    process_registry: ProcessRegistry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The launcher dies right after its SIGTERM: the proxy is draining a request. Reap must not
    send a second SIGTERM (which ends a drain at once): the request gets its answer."""
    sidecar = {
        "enabled": True,
        "binary": str(sidecar_binary),
        "instances": [{"name": "policy", "upstream": tls_origin.url, "listen": "127.0.0.1:0"}],
        "ca_file": str(tls_origin.ca_file),
        "shutdown_grace": "20s",
        "exit_with_owner": exit_with_owner,
        "log_dir": str(log_dir),
    }
    spec = {"mode": "api", "config": {"sidecar": sidecar}, "slack": SLACK}
    env = {**os.environ, crashpoints.ENV_VAR: "sigterm-sent"}
    driver = _start_driver(spec, env, process_registry)
    assert driver.stdout is not None and driver.stdin is not None
    assert any(line.strip() == "READY" for line in iter(driver.stdout.readline, ""))
    ((_, (inst,), _),) = _records(log_dir)
    assert inst.pid is not None
    process_registry.add_pid(inst.pid)
    client, answers = request_in_flight(inst.listen, "/slow?first_byte=2", tls_origin)
    driver.stdin.write("stop\n")
    driver.stdin.flush()
    assert driver.wait(60) == -signal.SIGKILL

    (run,) = _cli_json(capsys, "--log-dir", str(log_dir), "reap", "--json")["runs"]
    client.join(30)
    assert answers == [200], "the drain was cut short"
    (reaped,) = run["instances"]
    assert reaped["action"] == "wait for its drain, mark failed"
    ((_, (inst,), histories),) = _records(log_dir)
    assert inst.state == "failed"
    _assert_legal_history(inst.name, inst.state, histories[inst.id])
    assert _processes_of(log_dir) == []
