"""What the launcher's integration tests share: a Gym-shaped config, reading a run back, a port
held in use, a request held in flight, and the stand-ins for a proxy that misbehaves
(``fake_binary``), so each test file states only its case.

The fixtures built on these (``lab_config``, ``node_run``, ``deaf_sidecar``) live in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from helpers import http11_request, wait_until
from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.base import procs
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import (
    H2PingSidecarManager,
)
from sidecar_fsm.state.store import InstanceRecord, open_all_hosts

FULL_HISTORY = ["configured", "building", "spawned", "ready", "draining", "stopped"]


def gym_config(upstream: str, ca_file: Path, log_dir: Path, cache_dir: Path, **block: Any) -> DictConfig:
    """A config shaped like NeMo Gym's: servers under a top-level key, model URL via an alias."""
    sidecar = {
        "enabled": True,
        "instances": [{"name": "nvcf", "upstream": upstream, "listen": "127.0.0.1:0"}],
        "ping_interval": "250ms",
        "shutdown_grace": "5s",
        "startup_timeout_seconds": 20,
        "ca_file": str(ca_file),
    }
    sidecar.update(block)
    return OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "nemo_gym_log_dir": str(log_dir),
            "policy_base_url": upstream,
            "policy_model": {
                "responses_api_models": {
                    "openai_model": {
                        "entrypoint": "app.py",
                        "base_url": "${policy_base_url}",
                        "api_key": "sk-x",
                    }
                }
            },
            "sidecar": sidecar,
        }
    )


def snapshot(config: DictConfig) -> Any:
    return OmegaConf.to_container(config, resolve=False)


def run_records(log_dir: Path) -> list[tuple[Any, list[InstanceRecord]]]:
    out = []
    for store in open_all_hosts(log_dir):
        try:
            for run in store.list_runs("all"):
                out.append((run, store.instances_of(run.run_id)))
        finally:
            store.close()
    return out


def history(log_dir: Path, instance_id: int) -> list[tuple[str, str]]:
    (store,) = open_all_hosts(log_dir)
    try:
        return [(row.event, row.dest) for row in store.history(instance_id)]
    finally:
        store.close()


def states_path(log_dir: Path, instance_id: int) -> list[str]:
    rows = history(log_dir, instance_id)
    return ["configured"] + [dest for _, dest in rows]


def assert_nothing_left(log_dir: Path) -> None:
    """No run of ``log_dir`` is live, no recorded sidecar still runs, no child of ours remains,
    and no ready file or proxy temp file is left behind."""
    assert sorted(path.name for path in log_dir.glob("*.ready*")) == []
    assert sorted(path.name for path in log_dir.glob(".*.tmp*")) == []
    for run, instances in run_records(log_dir):
        assert run.ended_at is not None, f"run {run.run_id} not ended"
        for record in instances:
            assert record.state in ("stopped", "failed"), (record.name, record.state)
            if record.pid is not None and record.pid_start_time is not None:
                identity = procs.ProcessIdentity(record.pid, record.pid_start_time, None)
                assert not procs.is_ours(identity), f"{record.name} pid {record.pid} still runs"
    mine = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.status() != psutil.STATUS_ZOMBIE and str(log_dir) in " ".join(cmdline(child))
    ]
    assert mine == []
    assert list(log_dir.glob("*.ready")) == []


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


# What sidecar-fsm's proxy answers to -describe, trimmed to its flags: a user-named binary is asked
# before anything starts (binaryflags), so a stand-in answers as the real one does.
OUR_DESCRIPTION = json.dumps(
    {
        "flags": [
            {"name": name, "type": kind}
            for name, kind in (
                ("ca-file", "path"),
                ("exit-with-pid", "pid"),
                ("insecure-skip-verify", "bool"),
                ("listen", "host:port"),
                ("max-conn-age", "duration"),
                ("metrics-listen", "host:port"),
                ("nvcf-follow", "bool"),
                ("ping-interval", "duration"),
                ("ping-timeout", "duration"),
                ("ready-file", "path"),
                ("retry-body-limit", "bytes"),
                ("shutdown-grace", "duration"),
                ("upstream", "https://host[:port]"),
            )
        ],
        "ready_file": ["pid", "listen", "metrics", "route"],
    }
)


def fake_binary(path: Path, body: str) -> Path:
    """A shell stand-in for the proxy running ``body``; ``-describe`` answers as our proxy does."""
    answer = f"if [ \"$1\" = -describe ]; then cat <<'EOF'\n{OUR_DESCRIPTION}\nEOF\nexit 0; fi\n"
    path.write_text("#!/bin/sh\n" + answer + body + "\n")
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def port_in_use() -> Iterator[int]:
    """A loopback port a listening socket of this process holds until the block ends: a proxy
    told to listen there fails to bind, and once the block is left the port is free again."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def request_in_flight(listen: str, path: str, origin: TlsH2Origin) -> tuple[threading.Thread, list[object]]:
    """``GET path`` through the sidecar at ``listen`` from a daemon thread; returns once ``origin``
    holds the request's stream, so a signal sent next finds it in flight.

    The thread appends to the list the status, or the ``OSError`` the request ended in (a drain cut
    short closes the connection); join it before reading the list.
    """
    host, _, port = listen.rpartition(":")
    answers: list[object] = []

    def request() -> None:
        try:
            answers.append(http11_request(host, int(port), path, timeout=60).status)
        except OSError as error:
            answers.append(error)

    client = threading.Thread(target=request, daemon=True)
    client.start()
    wait_until(lambda: origin.active_streams >= 1, 10, "the request to reach the origin")
    return client, answers


def failure_of(manager: H2PingSidecarManager) -> Callable[[], SidecarError | None]:
    """A ``wait_until`` predicate: the error ``manager.check()`` raises, None while it passes."""

    def probe() -> SidecarError | None:
        try:
            manager.check()
        except SidecarError as error:
            return error
        return None

    return probe


# A proxy stand-in that gets ready, then ignores SIGTERM: only SIGKILL ends it.
LISTEN_THEN_READY = f"""exec "{sys.executable}" -c '
import json, os, socket, sys, time
host, _, port = sys.argv[2].rpartition(":")
sock = socket.socket()
sock.bind((host, int(port)))
sock.listen()
with open(sys.argv[1] + ".tmp", "w") as file:
    json.dump({{"pid": os.getpid(), "listen": "%s:%d" % sock.getsockname()}}, file)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
' "$ready" "$listen"
"""

# Ignores SIGTERM, and listens where its ready file says (a ready file naming an address the
# child does not listen on is refused at start).
READY_BUT_DEAF = (
    """
trap '' TERM
while [ $# -gt 0 ]; do
  case "$1" in -ready-file) ready="$2";; -listen) listen="$2";; esac
  shift
done
"""
    + LISTEN_THEN_READY
)


async def post_json(url: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes, float]:
    started = time.monotonic()
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(timeout=client_timeout) as session,
        session.post(url, json=body) as response,
    ):
        payload = await response.read()
        return response.status, payload, time.monotonic() - started
