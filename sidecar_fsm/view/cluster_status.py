"""``status --ray``: what runs now on every alive node of a Ray cluster, in one table.

Owns the task each node runs (judge this host's runs in the shared log dir as plain ``status``
does, ``sidecar_fsm.observe`` through ``view.status``: only a node can tell whether its own pids
are still its sidecars, and scrape its own proxies' loopback ``/metrics``), and the shape the
answers are gathered into.
Reaching the nodes is ``run.cluster.on_every_node``'s job. Read-only on every node: opens no
database for writing, changes no state, signals nothing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run.cluster import DEFAULT_ADDRESS, on_every_node
from sidecar_fsm.view.status import RunStatus

# status is an interactive command: a node that has not answered by then is shown as silent
# rather than holding the whole table. Judging a host's runs takes well under a second.
NODE_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True)
class NodeStatus:
    """One node's runs as that node judged them, or the one-line reason it could not answer."""

    node_id: str
    address: str
    ray_hostname: str
    host: str | None
    runs: list[RunStatus] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class ClusterStatus:
    """Every alive node's answer, in the order ``ray.nodes()`` listed the nodes."""

    address: str
    nodes: list[NodeStatus]

    @property
    def failed(self) -> bool:
        return any(node.error is not None for node in self.nodes)


def _status_on_this_node(log_dir: str, everything: bool) -> tuple[str, str, list[RunStatus], str | None]:
    """The Ray task body: (node id, host, this host's runs judged now, error).

    Only this host's database: another host's pids mean nothing here. A missing database is not
    created. Runs in a Ray worker, so it is a module-level function and imports ray lazily.
    """
    import ray

    from sidecar_fsm.state.hostname import HOST_ENV, host_name
    from sidecar_fsm.state.store import Store, database_path
    from sidecar_fsm.view import status

    node_id = str(ray.get_runtime_context().get_node_id())
    try:
        host = host_name()
        path = database_path(log_dir, host)
        if not path.exists():
            return node_id, host, [], None
        with Store.open_existing(path) as store:
            runs = status.runs_to_show(
                [(store, run) for run in store.list_runs("all")], everything=everything
            )
            observed = [status.observe(store, run) for store, run in runs]
        return node_id, host, status.with_live(observed), None
    except (SidecarError, OSError, ValueError) as error:
        text = str(error).strip()
        return (
            node_id,
            os.environ.get(HOST_ENV) or socket.gethostname(),
            [],
            text.splitlines()[0] if text else type(error).__name__,
        )


def status_cluster(
    log_dir: str,
    *,
    address: str = DEFAULT_ADDRESS,
    everything: bool = False,
    timeout: float = NODE_TIMEOUT_SECONDS,
) -> ClusterStatus:
    """Every alive node's runs in ``log_dir`` (live ones and its latest ended one, or all with
    ``everything``); a node that fails or stays silent past ``timeout`` carries its error."""
    bootstrap, answers = on_every_node(
        _status_on_this_node,
        (os.path.abspath(log_dir), everything),
        address=address,
        timeout=timeout,
        command="status",
    )
    nodes = []
    for answer in answers:
        host, runs, error = None, [], answer.error
        if answer.error is None:
            _, host, runs, error = answer.value
        nodes.append(NodeStatus(answer.node_id, answer.address, answer.ray_hostname, host, runs, error))
    return ClusterStatus(address=bootstrap, nodes=nodes)
