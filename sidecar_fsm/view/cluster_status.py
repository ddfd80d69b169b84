"""``status --ray``: what runs now on every alive node of a Ray cluster.

Each node judges its own host's runs as plain ``status`` does: only a node can tell whether its
pids are still its sidecars, and reach its proxies' loopback ``/metrics``. Read-only everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sidecar_fsm.run.cluster import DEFAULT_ADDRESS, on_every_node, on_this_node
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


def _status_on_this_node(
    log_dir: str, everything: bool
) -> tuple[str, str, str, list[RunStatus] | None, str | None]:
    """The Ray task body (module-level: a Ray worker imports it): this host's runs judged now."""
    from sidecar_fsm.state.store import Store
    from sidecar_fsm.view import status

    def work(_: str, path: Path) -> list[RunStatus]:
        with Store.open_existing(path) as store:
            runs = status.runs_to_show(
                [(store, run) for run in store.list_runs("all")], everything=everything
            )
            observed = [status.observe(store, run) for store, run in runs]
        return status.with_live(observed)

    return on_this_node(log_dir, work, [])


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
    nodes = [
        NodeStatus(n.node_id, n.address, n.ray_hostname, n.host, n.value or [], n.error) for n in answers
    ]
    return ClusterStatus(address=bootstrap, nodes=nodes)
