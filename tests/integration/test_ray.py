"""``sidecar-fsm reap --ray`` on a real local Ray cluster: every node reaps its own host's database.

The cluster is two real Ray nodes on this machine (``raycluster.LocalRayCluster``: a private
temp dir and HOME, so no other Ray's files reach it), each with its own ``SIDECAR_FSM_HOST`` so
they stand for two hosts sharing one log dir, as nodes on a cluster filesystem do. The runs point at real
``sleep`` processes whose owners are gone (or, for one run, alive), and the command runs as a
subprocess joining the cluster by address. No mocks. The cluster lives in a private temp dir
and is ended by its own ``ray start`` processes (never ``ray stop``, which would end every Ray
of this user on the machine), with the whole process group and anything naming the temp dir
killed as a backstop, pass or fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ProcessRegistry, sidecar_cli
from raycluster import LocalRayCluster, ray_env

from sidecar_fsm.base import procs
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (pip install 'ray>=2.9'): reap --ray is tested on a real Ray cluster",
)

SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"


@pytest.fixture
def ray_cluster(process_registry: ProcessRegistry) -> Iterator[LocalRayCluster]:
    """A head (SIDECAR_FSM_HOST=node-a) and a second node (node-b), stopped pass or fail."""
    cluster = LocalRayCluster(process_registry)
    try:
        cluster.start_node("node-a")
        cluster.start_node("node-b")
        yield cluster
    finally:
        cluster.stop()


def ray_cli(log_dir: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, with a HOME of its own: no other Ray's files reach it."""
    home = log_dir.parent / "home"
    home.mkdir(exist_ok=True)
    return sidecar_cli(log_dir, *args, timeout=timeout, env=ray_env(home))


def dead_owner() -> tuple[int, float]:
    """A pid that no longer runs, with the start time it had: the owner of a crashed run."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = procs.identity_of(proc.pid)
    proc.wait()
    return proc.pid, identity.start_time if identity else 1.0


def ready_run(
    store: Store, log_dir: Path, owner: tuple[int, float], registry: ProcessRegistry
) -> tuple[str, subprocess.Popen[bytes]]:
    """A run whose one instance is ``ready`` and recorded as a real running ``sleep``."""
    proc = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    registry.add(proc)
    identity = procs.identity_of(proc.pid)
    assert identity is not None
    run_id = uuid.uuid4().hex
    store.create_run(run_id, owner[0], owner[1], {"shutdown_grace": "5s"})
    ready = log_dir / f"h2ping-policy-{store.host}-{run_id}.ready"
    record = store.create_instance(
        run_id, "policy", "127.0.0.1:20000", "https://api.example.com", identity.exe, str(ready), str(ready)
    )
    machine = InstanceMachine(store, record.id)
    machine.fire("build")
    machine.fire("spawn", pid=identity.pid, pid_start_time=identity.start_time)
    ready.write_text(json.dumps({"pid": identity.pid, "listen": "127.0.0.1:20000"}))
    machine.fire("ready")
    return run_id, proc


def by_host(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["host"]: node for node in document["nodes"]}


@needs_ray
def test_reap_ray_reaps_each_hosts_database_on_its_own_node(
    ray_cluster: LocalRayCluster, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    me = procs.identity_of(os.getpid())
    assert me is not None
    with Store.open(log_dir, host="node-a") as store_a, Store.open(log_dir, host="node-b") as store_b:
        crashed_a, sleeper_a = ready_run(store_a, log_dir, dead_owner(), process_registry)
        crashed_b, sleeper_b = ready_run(store_b, log_dir, dead_owner(), process_registry)
        live_b, sleeper_live = ready_run(store_b, log_dir, (me.pid, me.start_time), process_registry)

        plan = ray_cli(log_dir, "reap", "--ray", "--dry-run", "--ray-address", ray_cluster.address)

        assert plan.returncode == 0, plan.stderr
        assert sleeper_a.poll() is None and sleeper_b.poll() is None
        for host, run_id in (("node-a", crashed_a), ("node-b", crashed_b)):
            block = plan.stdout.split(f"\non {host} (node ", 1)[1].split("\n\n", 1)[0]
            assert f"would reap run {run_id[:12]} on {host}: owner pid" in block, plan.stdout
            assert "SIGTERM, mark failed" in block, plan.stdout
        assert "would reap 1 run" in plan.stdout and live_b[:12] not in plan.stdout

        done = ray_cli(log_dir, "reap", "--ray", "--ray-address", ray_cluster.address, "--json")

        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        assert document["dry_run"] is False
        nodes = by_host(document)
        assert sorted(nodes) == ["node-a", "node-b"]
        assert len({node["node_id"] for node in nodes.values()}) == 2
        # Each node reaped exactly its own host's database, and only the runs whose owner is gone.
        for host, run_id in (("node-a", crashed_a), ("node-b", crashed_b)):
            node = nodes[host]
            assert node["error"] is None
            assert node["database"] == str(log_dir / "sidecar-fsm" / f"{host}.db")
            assert [(run["run_id"], run["host"]) for run in node["runs"]] == [(run_id, host)]
            (inst,) = node["runs"][0]["instances"]
            assert inst["result"] == "drained and exited after SIGTERM"

        assert procs.wait_exit(sleeper_a, 10) is not None, "node-a's sidecar was not ended"
        assert procs.wait_exit(sleeper_b, 10) is not None, "node-b's sidecar was not ended"
        assert sleeper_live.poll() is None, "the live run's sidecar was signalled"
        for store, run_id in ((store_a, crashed_a), (store_b, crashed_b)):
            run = store.get_run(run_id)
            assert run is not None and run.outcome == "reaped"
            assert {inst.state for inst in store.instances_of(run_id)} == {"failed"}
        live = store_b.get_run(live_b)
        assert live is not None and live.ended_at is None
        assert {inst.state for inst in store_b.instances_of(live_b)} == {"ready"}

        again = ray_cli(log_dir, "reap", "--ray", "--ray-address", ray_cluster.address)

    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0] == f"reap on 2 alive nodes of the Ray cluster at {ray_cluster.address}"
    assert lines[1].split() == ["NODE", "HOST", "ADDRESS", "DATABASE", "RESULT"]
    assert sorted(line.split()[1] for line in lines[2:]) == ["node-a", "node-b"]
    assert all(line.endswith("nothing to reap") for line in lines[2:])


@needs_ray
def test_reap_ray_without_a_cluster_exits_2_with_one_line(log_dir: Path) -> None:
    # A bound socket that never listens: a connection to it is refused, and nobody can take
    # the port while we hold it.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        done = ray_cli(log_dir, "reap", "--ray-address", address, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        f"sidecar-fsm reap --ray: no Ray cluster at '{address}'; "
        "start one with `ray start --head` or pass --ray-address"
    )


def test_reap_ray_without_the_ray_package_exits_2_with_one_line(log_dir: Path) -> None:
    # sys.modules["ray"] = None makes `import ray` raise ImportError, as on a machine without it.
    code = (
        "import sys; sys.modules['ray'] = None; from sidecar_fsm.cli import main; "
        f"sys.exit(main(['--log-dir', {str(log_dir)!r}, 'reap', '--ray']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        "sidecar-fsm reap --ray: the 'ray' package is not installed; "
        "pip install 'ray>=2.9' or reap without --ray"
    )


@needs_ray
def test_status_ray_shows_every_nodes_runs_in_one_table(
    ray_cluster: LocalRayCluster, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    """Each node judges its own host's runs (only it can tell whether its pids are its sidecars),
    and the answers come back as one table with a node column; a run whose owner is gone with
    a sidecar still running makes it exit 3, as plain status does."""
    me = procs.identity_of(os.getpid())
    assert me is not None
    with Store.open(log_dir, host="node-a") as store_a, Store.open(log_dir, host="node-b") as store_b:
        healthy, _ = ready_run(store_a, log_dir, (me.pid, me.start_time), process_registry)
        orphaned, _ = ready_run(store_b, log_dir, dead_owner(), process_registry)

    started = time.monotonic()
    done = ray_cli(log_dir, "status", "--ray", "--ray-address", ray_cluster.address, "--json")
    took = time.monotonic() - started

    assert done.returncode == 3, done.stderr
    nodes = by_host(json.loads(done.stdout))
    assert sorted(nodes) == ["node-a", "node-b"]
    assert all(node["error"] is None for node in nodes.values())
    ((run_a,), (run_b,)) = nodes["node-a"]["runs"], nodes["node-b"]["runs"]
    assert (run_a["run_id"], run_a["owner"]["status"], run_a["attention"]) == (healthy, "alive", None)
    assert [inst["alive"] for inst in run_a["instances"]] == [True]
    assert (run_b["run_id"], run_b["owner"]["status"]) == (orphaned, "dead")
    assert run_b["attention"].startswith("owner gone with sidecars still running (policy)")

    table = ray_cli(log_dir, "status", "--ray", "--ray-address", ray_cluster.address)
    lines = table.stdout.splitlines()
    assert lines[0] == f"status on 2 alive nodes of the Ray cluster at {ray_cluster.address}"
    assert lines[1].split()[:4] == ["NODE", "HOST", "RUN", "OWNER"]
    rows = {line.split()[1]: line for line in lines[2:]}
    assert sorted(rows) == ["node-a", "node-b"]
    assert healthy[:12] in rows["node-a"] and "running" in rows["node-a"]
    assert orphaned[:12] in rows["node-b"] and "owner gone" in rows["node-b"]
    print(f"status --ray on 2 nodes: {took:.2f}s wall")


def test_status_ray_without_a_cluster_exits_2_with_one_line(log_dir: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        done = ray_cli(log_dir, "status", "--ray-address", address, timeout=60)
    if importlib.util.find_spec("ray") is None:
        assert "the 'ray' package is not installed" in done.stderr
    else:
        assert done.stderr.strip() == (
            f"sidecar-fsm status --ray: no Ray cluster at '{address}'; "
            "start one with `ray start --head` or pass --ray-address"
        )
    assert (done.returncode, done.stdout) == (2, "")
