"""Many runs at once on one host: launchers sharing one cold build cache build once, and each host
keeps its own database under a shared log dir.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import ProcessRegistry, http11_request
from launchrun import (
    assert_nothing_left,
    fake_binary,
    gym_config,
    run_records,
)
from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager
from sidecar_fsm.state.store import Store

# --- many runs at once -----------------------------------------------------------------------

_CONCURRENT_RUN = """
import json, sys, time
from omegaconf import DictConfig, OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
config = OmegaConf.create(json.loads(sys.argv[1]))
started = time.monotonic()
manager = start_h2_ping_sidecar(config)
took = time.monotonic() - started
print("RESULT " + json.dumps({"run_id": manager.run_id, "took": took,
      "listens": [i.listen for i in manager.instances_actual],
      "base_url": config.policy_model.responses_api_models.openai_model.base_url}), flush=True)
sys.stdin.read()
manager.stop()
"""


def test_eight_runs_on_a_cold_shared_cache_build_once(
    tls_origin: TlsH2Origin,
    go_tool: Path,
    sidecar_binary: Path,
    log_dir: Path,
    tmp_path: Path,
    process_registry: ProcessRegistry,
) -> None:
    # A `go` that counts builds, first on PATH, so every run finds it before the venv's.
    counter = tmp_path / "builds.log"
    wrapper_dir = tmp_path / "gobin"
    wrapper_dir.mkdir()
    fake_binary(
        wrapper_dir / "go",
        f'if [ "$1" = build ]; then echo "$$ $*" >> "{counter}"; fi\nexec "{go_tool}" "$@"',
    )
    cold_cache = tmp_path / "cold-cache"
    env = dict(os.environ, PATH=f"{wrapper_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    config = gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cold_cache, startup_timeout_seconds=60)
    payload = json.dumps(OmegaConf.to_container(config))
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT_RUN, payload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(8)
    ]
    for run in runs:
        process_registry.add(run)
    results = []
    for run in runs:
        assert run.stdout is not None
        for line in run.stdout:
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT ") :]))
                break
        else:
            run.wait(30)
            pytest.fail(
                f"run exited {run.returncode} without starting:\n{run.stderr.read() if run.stderr else ''}"
            )

    assert counter.read_text().count("\n") == 1
    binaries = {path for path in cold_cache.rglob("h2-ping-sidecar") if path.is_file()}
    assert len(binaries) == 1
    (binary,) = binaries
    leftovers = [path.name for path in binary.parent.iterdir() if path.name != binary.name]
    assert not [name for name in leftovers if "build" in name or "tmp" in name], leftovers
    records = [(run, instances) for run, instances in run_records(log_dir)]
    assert len(records) == 8
    for _, (record,) in records:
        assert record.state == "ready"
        assert record.binary == str(binary)
    listens = {listen for result in results for listen in result["listens"]}
    assert len(listens) == 8
    for result in results:
        host, _, port = result["listens"][0].rpartition(":")
        assert http11_request(host, int(port), "/echo").status == 200

    for run in runs:
        assert run.stdin is not None
        run.stdin.close()
    for run in runs:
        assert run.wait(30) == 0, run.stderr.read() if run.stderr else ""
    assert {record.state for _, (record,) in run_records(log_dir)} == {"stopped"}
    assert_nothing_left(log_dir)


def test_store_is_per_host_under_the_log_dir(
    lab_config: Callable[..., DictConfig],
    log_dir: Path,
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> None:
    manager = start_manager(lab_config())
    assert manager.log_dir == str(log_dir)
    store = Store.open(log_dir)
    try:
        run = store.get_run(manager.run_id or "")
        assert run is not None and run.owner_pid == os.getpid()
        (record,) = store.instances_of(run.run_id)
        assert record.log_path == str(log_dir / f"h2ping-nvcf-{socket.gethostname()}-{run.run_id}.log")
        assert record.ready_path is not None and Path(record.ready_path).exists()
    finally:
        store.close()
    manager.stop()
    assert not Path(record.ready_path).exists()
