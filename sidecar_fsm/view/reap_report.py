"""What ``reap`` and ``reap --ray`` print: a block per reaped run, a row per node.

Must not read the database, inspect processes or print: it turns the reports into strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar_fsm.view.cells import STATE_STYLES, UNKNOWN, Cell, dumps, short_run_id, table

if TYPE_CHECKING:
    from sidecar_fsm.run.cluster import ClusterReap, NodeReap
    from sidecar_fsm.run.reap import ReapReport


def reap_lines(report: ReapReport, *, color: bool = False) -> list[str]:
    """What ``reap`` did (or, with ``--dry-run``, would do), a block per run."""
    temps = [
        f"{'would remove' if report.dry_run else 'removed'} database temp file {path} "
        "(its creator was killed)"
        for path in report.temp_files
    ]
    if not report.runs:
        if not report.any_recorded:
            return [*temps, "nothing to reap: no run is recorded on this host"]
        return [*temps, "nothing to reap: every recorded run has a live owner or is already closed"]
    lines: list[str] = list(temps)
    verb = "would reap" if report.dry_run else "reaped"
    for index, run in enumerate(report.runs):
        if index:
            lines.append("")
        lines.append(f"{verb} run {short_run_id(run.run_id)} on {run.host}: {run.reason}")
        if run.instances:
            lines += table(
                ["NAME", "STATE", "PID", "ACTION", "RESULT"],
                [
                    [
                        inst.name,
                        (inst.state, STATE_STYLES.get(inst.state)),
                        str(inst.pid) if inst.pid is not None else UNKNOWN,
                        inst.action,
                        inst.result or UNKNOWN,
                    ]
                    for inst in run.instances
                ],
                indent="  ",
                color=color,
            )
        for path in run.ready_files:
            lines.append(f"  {'would remove' if report.dry_run else 'removed'} stale ready file {path}")
    return lines


def reap_json(report: ReapReport) -> str:
    return dumps(
        {"dry_run": report.dry_run, "temp_files": list(report.temp_files), "runs": _runs_json(report)}
    )


def _runs_json(report: ReapReport) -> list[dict[str, Any]]:
    """The ``runs`` of ``reap --json``, and of each node in ``reap --ray --json``."""
    return [
        {
            "run_id": run.run_id,
            "host": run.host,
            "owner_pid": run.owner_pid,
            "owner": run.owner,
            "reason": run.reason,
            "ready_files": list(run.ready_files),
            "instances": [
                {
                    "id": inst.instance_id,
                    "name": inst.name,
                    "state": inst.state,
                    "pid": inst.pid,
                    # status --json's word for what runs at the pid: the one verdict.
                    "process": inst.process,
                    "action": inst.action,
                    "result": inst.result,
                }
                for inst in run.instances
            ],
        }
        for run in report.runs
    ]


# ------------------------------------------------------------------------------ reap --ray


def short_node_id(node_id: str) -> str:
    """The first 12 hex digits of a Ray node id (56 in full): enough to tell nodes apart."""
    return node_id[:12]


def _node_result(node: NodeReap, dry_run: bool) -> Cell:
    if node.error is not None or node.report is None:
        return (f"error: {node.error or 'no report'}", "red")
    count = len(node.report.runs)
    if not count:
        return ("nothing to reap", None)
    verb = "would reap" if dry_run else "reaped"
    return (f"{verb} {count} run{'s' if count != 1 else ''}", "yellow")


def cluster_reap_lines(result: ClusterReap, *, color: bool = False) -> list[str]:
    """What ``reap --ray`` did on each node: a table of nodes, then each node's ``reap`` block,
    indented under it, so a run is always read next to the node that reaped it."""
    count = len(result.nodes)
    head = f"reap on {count} alive node{'s' if count != 1 else ''} of the Ray cluster at {result.address}"
    if not result.nodes:
        return [head, "no alive nodes: nothing reaped"]
    lines = [head]
    lines += table(
        ["NODE", "HOST", "ADDRESS", "DATABASE", "RESULT"],
        [
            [
                short_node_id(node.node_id),
                node.host or node.ray_hostname,
                node.address,
                node.database or UNKNOWN,
                _node_result(node, result.dry_run),
            ]
            for node in result.nodes
        ],
        color=color,
    )
    for node in result.nodes:
        if node.report is None or not node.report.runs:
            continue
        lines.append("")
        lines.append(f"on {node.host or node.ray_hostname} (node {short_node_id(node.node_id)}):")
        lines += ["  " + line if line else line for line in reap_lines(node.report, color=color)]
    return lines


def cluster_reap_json(result: ClusterReap) -> str:
    """``{"address", "dry_run", "nodes": [...]}``; each node's ``runs`` are what ``reap --json``
    prints on that host (same keys), plus the node it came from and its error (or ``null``)."""
    nodes = [
        {
            "node_id": node.node_id,
            "address": node.address,
            "ray_hostname": node.ray_hostname,
            "host": node.host,
            "database": node.database,
            "error": node.error,
            "runs": _runs_json(node.report) if node.report is not None else [],
        }
        for node in result.nodes
    ]
    return dumps({"address": result.address, "dry_run": result.dry_run, "nodes": nodes})
