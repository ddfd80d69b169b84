"""What ``status --ray`` prints: every alive node's runs in one table, or one JSON document.

A node with no runs, or that did not answer, gets a row too: a silent node is shown, not
missing. The cells are ``render``'s, so a node's rows read as its own ``status`` would.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sidecar_fsm.view.cells import STATE_STYLES, UNKNOWN, Cell, dumps, short_run_id, table
from sidecar_fsm.view.reap_report import short_node_id
from sidecar_fsm.view.render import live_detail_cell, owner_text, pid_cell, run_result, run_status_json

if TYPE_CHECKING:
    from sidecar_fsm.view.cluster_status import ClusterStatus

HEADERS = ["NODE", "HOST", "RUN", "OWNER", "RESULT", "NAME", "STATE", "PID", "LISTEN → UPSTREAM", "DETAIL"]


def cluster_status_lines(
    result: ClusterStatus, *, now: float | None = None, color: bool = False
) -> list[str]:
    """The table: a row per instance of every run each node judged, node and run in front."""
    now = time.time() if now is None else now
    rows: list[list[str | Cell]] = []
    for node in result.nodes:
        where: list[str | Cell] = [short_node_id(node.node_id), node.host or node.ray_hostname]
        if node.error is not None:
            rows.append([*where, *[UNKNOWN] * 7, (node.error, "red")])
            continue
        if not node.runs:
            rows.append([*where, *[UNKNOWN] * 7, "no runs recorded on this host"])
            continue
        for status in node.runs:
            run: list[str | Cell] = [
                short_run_id(status.run.run_id),
                owner_text(status.run, status.owner),
                run_result(status, now),
            ]
            if not status.instances:
                rows.append([*where, *run, *[UNKNOWN] * 5])
            for inst in status.instances:
                rows.append(
                    [
                        *where,
                        *run,
                        inst.name,
                        (inst.state, STATE_STYLES.get(inst.state)),
                        pid_cell(status, inst),
                        f"{inst.listen or UNKNOWN} → {inst.upstream or UNKNOWN}",
                        live_detail_cell(status, inst),
                    ]
                )
    plural = "" if len(result.nodes) == 1 else "s"
    head = f"status on {len(result.nodes)} alive node{plural} of the Ray cluster at {result.address}"
    return [head, *table(HEADERS, rows, color=color)]


def cluster_status_json(result: ClusterStatus) -> str:
    """``{"address", "nodes": [...]}``; each node's ``runs`` as ``status --json`` gives them."""
    nodes: list[dict[str, Any]] = [
        {
            "node_id": node.node_id,
            "address": node.address,
            "ray_hostname": node.ray_hostname,
            "host": node.host,
            "error": node.error,
            "runs": [run_status_json(status) for status in node.runs],
        }
        for node in result.nodes
    ]
    return dumps({"address": result.address, "nodes": nodes})
