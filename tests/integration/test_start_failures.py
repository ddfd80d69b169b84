"""A start that cannot succeed, or is interrupted: each case checks the three promises of
``start_h2_ping_sidecar``: a clear error, no process of the run left, the caller's config exactly
what it was.

A fake "binary" (a shell script) stands in for the proxy only where the test is about our handling
of a child that misbehaves (exits early, never becomes ready, ignores SIGTERM); everything else runs
the real one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import ProcessRegistry, wait_until
from launchrun import (
    FULL_HISTORY,
    assert_nothing_left,
    cmdline,
    fake_binary,
    gym_config,
    port_in_use,
    run_records,
    snapshot,
    states_path,
)
from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from sidecar_fsm import launcher
from sidecar_fsm.base import buildcache
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import (
    H2PingSidecarManager,
    NodeSidecars,
    h2_ping_sidecar_config_from_global_config,
    resolve_log_dir,
    start_h2_ping_sidecar,
)
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import Store

# --- failure paths ---------------------------------------------------------------------------


def test_invalid_config_starts_nothing(lab_config: Callable[..., DictConfig], log_dir: Path) -> None:
    config = lab_config(ping_interval="6m")
    before = snapshot(config)
    with pytest.raises(ValidationError, match=r"sidecar\.ping_interval: '6m'"):
        start_h2_ping_sidecar(config)
    assert snapshot(config) == before
    assert run_records(log_dir) == []
    assert_nothing_left(log_dir)


def test_missing_go_and_no_prebuilt(
    tls_origin: TlsH2Origin, log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(buildcache, "find_go", lambda: None)
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, tmp_path / "empty-cache")
    before = snapshot(config)
    with pytest.raises(SidecarError, match="no Go toolchain and no prebuilt h2-ping-sidecar"):
        start_h2_ping_sidecar(config)
    assert snapshot(config) == before
    assert run_records(log_dir) == []


def test_manager_starts_again_after_stop_and_after_a_failed_start(
    tls_origin: TlsH2Origin,
    lab_config: Callable[..., DictConfig],
    sidecar_binary: Path,
    log_dir: Path,
    managers: list[H2PingSidecarManager],
) -> None:
    """As NeMo Gym's can: each start() after stop() or a failure is a new run."""

    with port_in_use() as port:
        instances = [{"name": "nvcf", "upstream": tls_origin.url, "listen": f"127.0.0.1:{port}"}]
        config = lab_config(instances=instances)
        parsed = h2_ping_sidecar_config_from_global_config(config)
        manager = H2PingSidecarManager(
            parsed, parsed.instances, sidecar_binary, resolve_log_dir(parsed, config)
        )
        managers.append(manager)
        with pytest.raises(SidecarError, match="already in use"):
            manager.start()  # the port is taken: a failed start
    failed_run = manager.run_id
    manager.start()  # the port is free now
    with pytest.raises(SidecarError, match="already running; call stop"):
        manager.start()
    manager.check()
    first_run = manager.run_id
    manager.stop()
    manager.start()
    manager.check()
    manager.stop()
    runs = {
        run.run_id: (run.outcome, [record.state for record in records])
        for run, records in run_records(log_dir)
    }
    assert len({failed_run, first_run, manager.run_id}) == 3
    assert runs == {
        failed_run: ("failed", ["failed"]),
        first_run: ("ended", ["stopped"]),
        manager.run_id: ("ended", ["stopped"]),
    }
    assert_nothing_left(log_dir)


def test_port_in_use_names_the_holder(
    tls_origin: TlsH2Origin,
    lab_config: Callable[..., DictConfig],
    log_dir: Path,
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> None:
    # Held by a process the database does not know.
    with port_in_use() as port:
        config = lab_config(
            instances=[{"name": "nvcf", "upstream": tls_origin.url, "listen": f"127.0.0.1:{port}"}]
        )
        before = snapshot(config)
        with pytest.raises(SidecarError) as caught:
            start_h2_ping_sidecar(config)
    # One line: the proxy's log would only say the same again.
    assert str(caught.value) == (
        f"sidecar.instances[0].listen: '127.0.0.1:{port}' is already in use by another process; "
        "stop it or choose another port (or port 0)"
    )
    assert snapshot(config) == before
    assert_nothing_left(log_dir)

    # Held by a run the database knows: the error names that run and instance.
    holder_manager = start_manager(lab_config())
    (taken,) = [instance.listen for instance in holder_manager.instances_actual]
    clash = lab_config(instances=[{"name": "second", "upstream": tls_origin.url, "listen": taken}])
    before = snapshot(clash)
    with pytest.raises(SidecarError) as caught:
        start_h2_ping_sidecar(clash)
    assert f"is already in use by run {holder_manager.run_id} instance 'nvcf'" in str(caught.value)
    assert snapshot(clash) == before
    holder_manager.check()  # the holder is unharmed


def test_an_exit_after_ready_is_never_a_port_clash(
    node_run: Callable[..., NodeSidecars], tmp_path: Path
) -> None:
    """Exit code 3 is our proxy's "-listen is taken", but a proxy binds before it is ready: a
    binary that was ready and then exits 3 crashed. NeMo Gym's test_crash_after_start_is_reported,
    its stand-in word for word, on NodeSidecars built directly as Gym's test builds it."""
    binary = tmp_path / "h2-ping-sidecar"
    binary.write_text(
        f"#!{sys.executable}\nimport sys, time\nargs = sys.argv[1:]\n"
        'open(args[args.index("-ready-file") + 1], "w").write("1\\n")\n'
        "time.sleep(0.3)\nraise SystemExit(3)\n"
    )
    binary.chmod(0o755)
    sidecars = node_run(binary)
    sidecars.start()
    wait_until(sidecars.failures, 10, "the crash to be reported")
    (message,) = sidecars.failures()
    assert "exited with code 3 unexpectedly" in message.splitlines()[0]
    assert "already in use" not in message


def test_child_exits_before_ready(
    lab_config: Callable[..., DictConfig], log_dir: Path, tmp_path: Path
) -> None:
    # Not 3 or 4: those are our proxy's "an address is taken" (go/main.go).
    binary = fake_binary(tmp_path / "early-exit", 'echo "fatal: upstream refused us" >&2\nexit 5')
    config = lab_config(binary=str(binary))
    before = snapshot(config)
    with pytest.raises(SidecarError) as caught:
        start_h2_ping_sidecar(config)
    message = str(caught.value)
    assert "h2-ping-sidecar 'nvcf'" in message
    assert "exited with code 5 before it was ready" in message.splitlines()[0]
    assert "fatal: upstream refused us" in message
    assert snapshot(config) == before
    ((run, (record,)),) = run_records(log_dir)
    assert (run.outcome, record.state, record.exit_code) == ("failed", "failed", 5)
    assert states_path(log_dir, record.id) == ["configured", "building", "spawned", "failed"]
    assert_nothing_left(log_dir)


def test_startup_timeout(lab_config: Callable[..., DictConfig], log_dir: Path, tmp_path: Path) -> None:
    # Never writes its ready file: what a proxy stuck before binding looks like to us.
    binary = fake_binary(tmp_path / "never-ready", "echo starting\nexec sleep 60")
    config = lab_config(binary=str(binary), startup_timeout_seconds=0.5)
    before = snapshot(config)
    started = time.monotonic()
    with pytest.raises(SidecarError, match=r"not ready after 0\.5s \(startup_timeout_seconds\)") as caught:
        start_h2_ping_sidecar(config)
    assert time.monotonic() - started < 10
    assert "starting" in str(caught.value)
    assert snapshot(config) == before
    ((_, (record,)),) = run_records(log_dir)
    assert record.state == "failed"
    assert record.exit_code == -signal.SIGKILL
    assert_nothing_left(log_dir)


def test_stale_ready_file_is_not_readiness(
    log_dir: Path, tmp_path: Path, node_run: Callable[..., NodeSidecars]
) -> None:
    binary = fake_binary(tmp_path / "never-ready", "exec sleep 60")
    sidecars = node_run(binary, run_id="stale0000000", startup_timeout_seconds=0.3)
    stale = log_dir / f"h2ping-nvcf-{socket.gethostname()}-stale0000000.ready"
    stale.write_text(json.dumps({"pid": os.getpid(), "listen": "127.0.0.1:9"}))
    with pytest.raises(SidecarError, match="not ready after"):
        sidecars.start()
    assert_nothing_left(log_dir)


def test_unwritable_log_fails_the_start_naming_it_and_leaves_nothing(
    tls_origin: TlsH2Origin, log_dir: Path, node_run: Callable[..., NodeSidecars]
) -> None:

    instances = [
        {"name": "first", "upstream": tls_origin.url, "listen": "127.0.0.1:0"},
        {"name": "second", "upstream": tls_origin.url, "listen": "127.0.0.1:0"},
    ]
    sidecars = node_run(run_id="nolog0000000", instances=instances)
    # A directory where the second instance's log must go: creating it fails.
    blocked = log_dir / f"h2ping-second-{host_name()}-nolog0000000.log"
    blocked.mkdir(parents=True)
    with pytest.raises(SidecarError) as raised:
        sidecars.start()
    assert str(raised.value) == (
        f"sidecar.log_dir: cannot create '{blocked}' (file exists); set sidecar.log_dir to a writable folder"
    )
    assert_nothing_left(log_dir)
    assert run_records(log_dir) == []  # no run row: nothing was started
    assert [path for path in log_dir.glob("*.log") if path.is_file()] == []  # the first log went too


@pytest.mark.parametrize("fault", ["read-only file system", "no space left on device"])
def test_log_dir_that_breaks_after_the_database_opened_fails_in_one_line(
    make_tmpfs: Callable[..., Path], node_run: Callable[..., NodeSidecars], fault: str
) -> None:
    """A long-lived launcher keeps its database open; the log dir then turns read-only or fills up."""
    small_tmpfs = make_tmpfs("2m", options="nr_inodes=64")  # 64 inodes: a full log dir is a loop away

    log_dir = small_tmpfs / "logs"
    store = Store.open(str(log_dir))
    try:
        if fault == "read-only file system":
            # A read-only bind mount over the log dir: the open database keeps its descriptors
            # (a tmpfs will not turn read-only while a file is open for writing).
            subprocess.run(["mount", "--bind", str(log_dir), str(log_dir)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(log_dir)], check=True)
        else:
            for index in range(1000):  # bounded: the tmpfs has 64 inodes
                try:
                    (small_tmpfs / f"filler-{index}").touch()
                except OSError:
                    break
        sidecars = node_run(store=store, logs=log_dir)
        with pytest.raises(SidecarError) as raised:
            sidecars.start()
        message = str(raised.value)
        assert "\n" not in message
        assert (
            message.startswith(f"sidecar.log_dir: cannot create '{log_dir}/h2ping-")
            and f"({fault})" in message
        )
        assert store.list_runs("all") == []
        assert list(log_dir.glob("*.log")) == [] and list(log_dir.glob("*.ready*")) == []
        assert not [
            child
            for child in psutil.Process().children(recursive=True)
            if str(log_dir) in " ".join(cmdline(child))
        ]
    finally:
        store.close()
        if fault == "read-only file system":
            subprocess.run(["umount", str(log_dir)], check=False)


_INTERRUPTED_START = """
import json, sys
from omegaconf import OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
config = OmegaConf.create(json.loads(sys.argv[1]))
before = OmegaConf.to_container(config)
try:
    start_h2_ping_sidecar(config)
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "unchanged": OmegaConf.to_container(config) == before}))
    sys.exit(130)
print(json.dumps({"interrupted": False}))
"""


def test_keyboard_interrupt_during_start_stops_the_child(
    lab_config: Callable[..., DictConfig],
    log_dir: Path,
    tmp_path: Path,
    process_registry: ProcessRegistry,
    wait_until: Callable[..., Any],
) -> None:
    pid_file = tmp_path / "child.pid"
    binary = fake_binary(tmp_path / "slow-start", f'echo $$ > "{pid_file}"\nexec sleep 60')
    config = lab_config(binary=str(binary))
    launcher = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_START, json.dumps(OmegaConf.to_container(config))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process_registry.add(launcher)
    child_pid = int(
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "fake child pid")
    )
    process_registry.add_pid(child_pid)
    child = psutil.Process(child_pid)
    os.kill(launcher.pid, signal.SIGINT)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, err
    assert json.loads(out.strip().splitlines()[-1]) == {"interrupted": True, "unchanged": True}
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    ((run, (record,)),) = run_records(log_dir)
    assert run.ended_at is not None
    assert record.state == "stopped"
    assert states_path(log_dir, record.id) == ["configured", "building", "spawned", "draining", "stopped"]
    assert_nothing_left(log_dir)


def test_keyboard_interrupt_after_the_proxy_is_ready(
    lab_config: Callable[..., DictConfig], log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt while the config is being rewritten: the ready proxy is stopped, config untouched."""

    calls: list[int] = []
    real = launcher.rewrite_base_urls

    def interrupt_the_second(config: DictConfig, instances: Any) -> Any:
        # The first call is the dry run on a copy, before any process; the second one runs
        # once the proxy is ready. Two arguments, as NeMo Gym's own tests patch it.
        calls.append(1)
        if len(calls) == 1:
            return real(config, instances)
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "rewrite_base_urls", interrupt_the_second)
    config = lab_config()
    before = snapshot(config)
    with pytest.raises(KeyboardInterrupt):
        start_h2_ping_sidecar(config)
    assert calls == [1, 1]
    assert snapshot(config) == before
    ((_, (record,)),) = run_records(log_dir)
    assert states_path(log_dir, record.id) == FULL_HISTORY
    assert_nothing_left(log_dir)
