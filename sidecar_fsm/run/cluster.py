"""Reaching every alive node of a Ray cluster: a function run on each node, results gathered here.

The only module that imports ``ray`` (only when called). One task is pinned to each alive node
(``soft=False``: a task that cannot run there fails rather than answer for another host), and
each answer or one-line error is gathered with its node (:func:`on_every_node`). ``reap --ray``
is built on it here (a reap can signal only its own host's processes, so each node reaps its
own database); ``status --ray`` in ``view.cluster_status``. Nodes on one machine share a host
name, and so a database, unless each sets ``SIDECAR_FSM_HOST``: reaping it twice is safe.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run.reap import ReapReport

T = TypeVar("T")

DEFAULT_ADDRESS = "auto"

# A node's reap waits each of its sidecars' shutdown_grace (60s by default) before SIGKILL, one
# instance after another; no healthy node takes this long, and a wedged one must not hang the
# command forever.
NODE_TIMEOUT_SECONDS = 900.0

# Ray retries a connection to an unreachable GCS for minutes; a plain TCP connect answers the
# question "is anything there" at once.
_PROBE_SECONDS = 5.0


class ClusterUnavailableError(SidecarError):
    """Ray is not installed, or no cluster answers at the address: bad usage, exit 2."""


@dataclass(frozen=True)
class NodeReap:
    """What one node's reap did: the node, the database it reaped (as the node resolved it;
    None when it never ran), and the report or a one-line error."""

    node_id: str
    address: str
    ray_hostname: str
    host: str | None
    database: str | None
    report: ReapReport | None
    error: str | None = None


@dataclass(frozen=True)
class ClusterReap:
    """Every alive node's result, in the order ``ray.nodes()`` listed the nodes."""

    address: str
    dry_run: bool
    nodes: list[NodeReap]

    @property
    def failed(self) -> bool:
        return any(node.error is not None for node in self.nodes)


def _no_cluster(command: str, address: str) -> ClusterUnavailableError:
    return ClusterUnavailableError(
        f"{command} --ray: no Ray cluster at '{address}'; "
        "start one with `ray start --head` or pass --ray-address"
    )


def _import_ray(command: str) -> Any:
    try:
        import ray
    except ImportError as error:
        raise ClusterUnavailableError(
            f"{command} --ray: the 'ray' package is not installed; "
            f"pip install 'ray>=2.9' or {command} without --ray"
        ) from error
    return ray


def _bootstrap_address(ray: Any, address: str, command: str) -> str:
    """``host:port`` of the cluster's GCS, resolved as ``ray.init`` would (``auto``: the
    environment, the last ``ray start``, a local GCS). That is Ray's private API; if it moves,
    the address goes to ``ray.init`` unresolved and only the reachability probe is skipped."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return address
    try:
        resolved = canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as error:
        raise _no_cluster(command, address) from error
    if resolved is None:
        raise _no_cluster(command, address)
    return str(resolved)


def _probe(address: str, shown: str, command: str) -> None:
    """Raise ``ClusterUnavailableError`` unless something accepts TCP at ``address`` at once."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # a ray:// client address or a form we do not parse: ray.init judges it
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_SECONDS):
            pass
    except OSError as error:
        raise _no_cluster(command, shown) from error


def on_this_node(
    log_dir: str, work: Callable[[str, Path], T], missing: T
) -> tuple[str, str, str, T | None, str | None]:
    """What every Ray task body does around its ``work``: (node id, this host, its database path
    in ``log_dir``, ``work(host, path)`` or ``missing`` when there is no database (none is
    created), one-line error). Only this host's database: another host's pids mean nothing here.
    """
    import ray

    from sidecar_fsm.state.hostname import HOST_ENV, host_name
    from sidecar_fsm.state.store import database_path

    node_id = str(ray.get_runtime_context().get_node_id())
    try:
        host = host_name()
        path = database_path(log_dir, host)
        return node_id, host, str(path), work(host, path) if path.exists() else missing, None
    except (SidecarError, OSError, ValueError) as error:
        # The raw name, even one host_name() refused: the error says what is wrong with it.
        return node_id, os.environ.get(HOST_ENV) or socket.gethostname(), "", None, _line(error)


def _reap_on_this_node(log_dir: str, dry_run: bool) -> tuple[str, str, str, ReapReport | None, str | None]:
    """The Ray task body: reap this host's database in ``log_dir`` (``on_this_node``). Runs in a
    Ray worker, so it is a module-level function (workers import this module by name)."""
    from sidecar_fsm.run.reap import reap
    from sidecar_fsm.state.store import Store

    def work(host: str, _: Path) -> ReapReport:
        with Store.open(log_dir, host=host) as store:
            return reap(store, dry_run=dry_run)

    return on_this_node(log_dir, work, ReapReport(dry_run=dry_run, runs=[]))


def _line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@dataclass(frozen=True)
class NodeAnswer:
    """One node's answer to :func:`on_every_node`: its host and database (as it resolved them),
    the work's ``value``, or a one-line ``error``."""

    node_id: str
    address: str
    ray_hostname: str
    host: str | None = None
    database: str | None = None
    value: Any = None
    error: str | None = None


def on_every_node(
    task_body: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    address: str,
    timeout: float,
    command: str,
) -> tuple[str, list[NodeAnswer]]:
    """Run ``task_body(*args)`` once on every alive node; (the cluster's address, every answer).

    ``task_body``: a module-level function (workers import it by name) that returns
    :func:`on_this_node`'s frame, whose node id is checked against the node it was pinned to. Raises
    ``ClusterUnavailableError`` when ray is missing or nothing answers at ``address`` (checked
    before ``ray.init``, which would retry for minutes). A node that fails or stays silent past
    ``timeout`` gets its error in its ``NodeAnswer``; the others' answers are still returned.
    """
    ray = _import_ray(command)
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    bootstrap = _bootstrap_address(ray, address, command)
    _probe(bootstrap, address, command)
    try:
        # log_to_driver=False: a worker's output must never land in our stdout (--json).
        ray.init(address=bootstrap, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise _no_cluster(command, address) from error
    try:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        # num_cpus=0: the task is tiny and must run even on a node whose CPUs Gym's servers
        # hold; max_retries=0: a task lost with its node is reported, not re-run elsewhere.
        task = ray.remote(num_cpus=0, max_retries=0)(task_body)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(*args)
            for node in nodes
        ]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        answers = [_gather(ray, RayError, node, ref, timeout) for node, ref in zip(nodes, refs, strict=True)]
    finally:
        ray.shutdown()
    return bootstrap, answers


def _gather(
    ray: Any, ray_error: type[BaseException], node: dict[str, Any], ref: Any, timeout: float
) -> NodeAnswer:
    node_id = str(node["NodeID"])
    where = {
        "node_id": node_id,
        "address": str(node.get("NodeManagerAddress") or "-"),
        "ray_hostname": str(node.get("NodeManagerHostname") or "-"),
    }
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        ray.cancel(ref)
        return NodeAnswer(**where, error=f"no answer within {timeout:g}s")
    try:
        value = ray.get(ref)
    except ray_error as failure:
        return NodeAnswer(**where, error=_line(failure))
    ran_on, host, database, result, error = value
    if ran_on != node_id:  # soft=False forbids this; an answer from elsewhere must not pass as this node's
        return NodeAnswer(**where, error=f"task pinned to node {node_id} ran on {ran_on}")
    return NodeAnswer(**where, host=host, database=database or None, value=result, error=error)


def reap_cluster(
    log_dir: str,
    *,
    address: str = DEFAULT_ADDRESS,
    dry_run: bool = False,
    timeout: float = NODE_TIMEOUT_SECONDS,
) -> ClusterReap:
    """Reap ``log_dir`` (made absolute: workers do not share our cwd) on every alive node of the
    Ray cluster at ``address``; every node's result (:func:`on_every_node`)."""
    bootstrap, answers = on_every_node(
        _reap_on_this_node,
        (os.path.abspath(log_dir), dry_run),
        address=address,
        timeout=timeout,
        command="reap",
    )
    nodes = [
        NodeReap(n.node_id, n.address, n.ray_hostname, n.host, n.database, n.value, n.error) for n in answers
    ]
    return ClusterReap(address=bootstrap, dry_run=dry_run, nodes=nodes)
