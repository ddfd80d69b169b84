"""NeMo-RL's way: the launcher inside a Ray actor, on a real local Ray cluster.

NeMo-RL runs Gym's ``RunHelper`` inside a Ray actor, so ``start_h2_ping_sidecar``, ``check()``
and ``stop()`` are called from actor methods (``ray_actor_driver.py``: one driver process, one
actor, a command per line). The actor's worker process is then the sidecars' owner: what a
worker changes (its session, signal handlers, stdout) must not change what the launcher does,
and a killed actor, by ``ray.kill`` or SIGKILL of its worker, must leave no sidecar behind
(``exit_with_owner``). What was found running the launcher there: actor methods run in the
worker's main thread (so the launcher's signal deferral applies); the worker ignores SIGINT
and has Ray's own SIGTERM handler (the launcher holds and restores it around a spawn); its
stdout goes to Ray's worker log (the launcher's lines land there, not in the driver's); the
worker is the pid ``-exit-with-pid`` watches, so a sidecar whose worker dies drains for its
grace and exits; and a worker Ray ends on purpose (``ray.kill``) SIGKILLs its direct children
on the way out (``RAY_kill_child_processes_on_worker_exit``, on by default), so the sidecar gets
no drain there, exactly like the Gym servers the actor started. Either way nothing is left
running, and ``status`` reads the run as ended.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from helpers import ProcessRegistry, http11_request, sidecar_cli, wait_until
from raycluster import LocalRayCluster

from sidecar_fsm.base import procs
from sidecar_fsm.lab.origin import TlsH2Origin
from sidecar_fsm.state.store import Store

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (pip install 'ray>=2.9'): the launcher in an actor needs a real Ray cluster",
)

DRIVER = Path(__file__).resolve().parents[1] / "ray_actor_driver.py"
HOST = "ray-node"
GRACE_SECONDS = 3.0
# How late past the grace a sidecar may exit: the pidfd wakes it at once, the drain ends when
# its last request does, and this machine is shared.
EXIT_SLACK_SECONDS = 5.0
_ANSWER_SECONDS = 120.0


@pytest.fixture(scope="module")
def ray_cluster(session_process_registry: ProcessRegistry) -> Iterator[LocalRayCluster]:
    """One Ray node for the module (its start is the slow part), stopped pass or fail."""
    cluster = LocalRayCluster(session_process_registry)
    try:
        cluster.start_node(HOST)
        yield cluster
    finally:
        cluster.stop()


class Driver:
    """The driver process; ``send(command)`` returns its JSON answer."""

    def __init__(self, cluster: LocalRayCluster, registry: ProcessRegistry, log: Path) -> None:
        self._stderr = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER), cluster.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=cluster.env(HOST),
            start_new_session=True,
        )
        registry.add(self.process)
        self.log = log

    def send(self, command: str, argument: Any = None) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        line = command if argument is None else f"{command} {json.dumps(argument)}"
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], _ANSWER_SECONDS)
        assert ready, f"driver gave no answer to {command} in {_ANSWER_SECONDS:g}s:\n{self.log.read_text()}"
        raw = self.process.stdout.readline()
        assert raw, f"driver exited at {command}:\n{self.log.read_text()}"
        answer: dict[str, Any] = json.loads(raw)
        assert "failed" not in answer, f"{answer['failed']}\n{self.log.read_text()}"
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write(b"quit\n")
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._stderr.close()


@pytest.fixture
def driver(
    ray_cluster: LocalRayCluster, process_registry: ProcessRegistry, tmp_path: Path
) -> Iterator[Driver]:
    running = Driver(ray_cluster, process_registry, tmp_path / "driver.err")
    try:
        yield running
    finally:
        running.close()


def gym_config(origin: TlsH2Origin, binary: Path, log_dir: Path) -> dict[str, Any]:
    """A NeMo Gym global config as RunHelper would hand it over, as plain data."""
    return {
        "nemo_gym_log_dir": str(log_dir),
        "policy_base_url": origin.url,
        "policy_model": {"responses_api_models": {"openai_model": {"base_url": "${policy_base_url}"}}},
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(origin.ca_file),
            "shutdown_grace": f"{GRACE_SECONDS:g}s",
            "instances": [{"name": "nvcf", "upstream": origin.url, "listen": "127.0.0.1:0"}],
        },
    }


ActorStart = Callable[[], tuple[Any, int]]


@pytest.fixture
def actor_start(
    driver: Driver,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    log_dir: Path,
    process_registry: ProcessRegistry,
) -> ActorStart:
    """``actor_start()``: ``gym_config`` started through the actor; (its answer, the sidecar's
    recorded pid), the sidecar registered so it is ended even if the actor's stop never runs."""

    def start() -> tuple[Any, int]:
        answer = driver.send("start", gym_config(tls_origin, sidecar_binary, log_dir))
        with Store.open(str(log_dir), host=HOST) as store:
            (instance,) = store.instances_of(answer["run_id"])
        assert instance.state == "ready" and instance.pid is not None
        process_registry.add_pid(instance.pid)
        return answer, instance.pid

    return start


def get(base_url: str, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    where = urlsplit(base_url)
    assert where.hostname is not None and where.port is not None
    response = http11_request(where.hostname, where.port, where.path + path, timeout=timeout)
    return response.status, response.body


def status_json(log_dir: Path, cluster: LocalRayCluster) -> tuple[int, dict[str, Any]]:
    done = sidecar_cli(log_dir, "status", "--all", "--json", env=cluster.env(HOST))
    return done.returncode, json.loads(done.stdout)


def test_an_actor_starts_serves_checks_and_stops_its_sidecar(
    driver: Driver, tls_origin: TlsH2Origin, log_dir: Path, actor_start: ActorStart
) -> None:
    answer, sidecar_pid = actor_start()
    assert answer["base_url"].startswith("http://127.0.0.1:")  # rewritten to the bound port

    assert get(answer["base_url"], "/echo?x=1")[0] == 200
    assert tls_origin.requests >= 1
    assert driver.send("check") == {"error": None}

    assert driver.send("stop") == {"stopped": True}

    assert procs.wait_exit(sidecar_pid, 10) is not None
    with Store.open(str(log_dir), host=HOST) as store:
        run = store.get_run(answer["run_id"])
        assert run is not None and run.ended_at is not None and run.owner_pid == answer["worker_pid"]
        assert [inst.state for inst in store.instances_of(run.run_id)] == ["stopped"]


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL of the worker"])
def test_a_killed_actor_leaves_no_sidecar_and_status_reads_the_run_as_ended(
    how: str,
    driver: Driver,
    ray_cluster: LocalRayCluster,
    tls_origin: TlsH2Origin,
    log_dir: Path,
    actor_start: ActorStart,
) -> None:
    answer, sidecar_pid = actor_start()
    assert get(answer["base_url"], "/echo")[0] == 200

    # A request that would wait longer than the grace is in flight when the owner dies: the
    # sidecar drains it for the grace, then exits anyway.
    def wait_long() -> None:
        with contextlib.suppress(OSError):  # cut off when the sidecar ends: what is tested here
            get(answer["base_url"], "/slow?first_byte=60", 90)

    in_flight = threading.Thread(target=wait_long, daemon=True)
    in_flight.start()
    wait_until(lambda: tls_origin.active_streams >= 1, 30, "the slow request to reach the origin")

    killed_at = time.monotonic()
    if how == "ray.kill":
        driver.send("kill")
    else:
        os.kill(answer["worker_pid"], signal.SIGKILL)
    assert procs.wait_exit(sidecar_pid, GRACE_SECONDS + EXIT_SLACK_SECONDS) is not None, (
        f"the sidecar outlived its actor ({how}) by more than the grace"
    )
    took = time.monotonic() - killed_at
    with Store.open(str(log_dir), host=HOST) as store:
        (instance,) = store.instances_of(answer["run_id"])
    log = Path(instance.log_path).read_text()
    if how == "ray.kill":
        # Ray ends an actor's worker on purpose here, and a worker that exits on purpose SIGKILLs
        # its direct children (RAY_kill_child_processes_on_worker_exit, on by default): the
        # sidecar gets no drain, like the servers whose requests it was carrying.
        assert "draining" not in log, log
    else:
        # A worker that dies is not cleaned up after (unless the raylet subreaper option is on):
        # -exit-with-pid sees the owner go, and the sidecar drains for its grace, then exits.
        assert f"process {answer['worker_pid']} is gone: draining for up to" in log, log
        assert took >= GRACE_SECONDS - 0.5, f"exited after {took:.2f}s: the in-flight request was cut"

    # The owner died without recording anything; nothing of the run runs any more, so status
    # reads it as ended (exit 0), and reap closes its record.
    wait_until(lambda: procs.identity_of(answer["worker_pid"]) is None, 30, "the actor's worker to exit")
    code, document = status_json(log_dir, ray_cluster)
    (run,) = document["runs"]
    assert run["owner"]["status"] == "dead"
    assert [inst["alive"] for inst in run["instances"]] == [False]
    assert (run["ended_with_owner"], run["attention"], code) == (True, None, 0), document
    table = sidecar_cli(log_dir, "status", env=ray_cluster.env(HOST))
    assert "ended: owner gone, nothing left running" in table.stdout, table.stdout
    reaped = sidecar_cli(log_dir, "reap", env=ray_cluster.env(HOST))
    assert reaped.returncode == 0, reaped.stderr
    with Store.open(str(log_dir), host=HOST) as store:
        closed = store.get_run(answer["run_id"])
    assert closed is not None and closed.outcome == "reaped"
    print(f"{how}: sidecar exited {took:.2f}s after the kill")
