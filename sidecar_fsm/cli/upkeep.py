"""The commands that tidy up after runs: ``reap`` (and ``reap --ray`` across a Ray cluster).

Each parses its options, calls the run layer (``run.reap``, ``run.cluster``) that does the
work, and prints its report. Must not judge or signal processes itself: ``run.reap`` proves
every process ours (``procs``) before it signals it.
"""

from __future__ import annotations

import argparse
from typing import Any

from sidecar_fsm.cli.common import PROG, UsageError, add_command, color, err, log_dir_of, out
from sidecar_fsm.run.cluster import DEFAULT_ADDRESS, ClusterUnavailableError, reap_cluster
from sidecar_fsm.run.reap import ReapReport, reap
from sidecar_fsm.state.store import Store, database_path
from sidecar_fsm.view import reap_report


def cmd_reap(args: argparse.Namespace) -> int:
    log_dir, _ = log_dir_of(args)
    if args.ray or args.ray_address:
        return _reap_ray(args, log_dir)
    # Only this host's database: a reap can signal only processes on its own host. A missing
    # database is not created: there is nothing to reap and nothing to write.
    if not database_path(log_dir).exists():
        report = ReapReport(dry_run=args.dry_run, runs=[])
    else:
        store = Store.open(log_dir)
        try:
            report = reap(store, dry_run=args.dry_run)
        finally:
            store.close()
    out(reap_report.reap_json(report) if args.json else reap_report.reap_lines(report, color=color()))
    return 0


def _reap_ray(args: argparse.Namespace, log_dir: str) -> int:
    """``reap --ray``: the reap on every alive node of the Ray cluster; 1 if any node failed."""
    try:
        result = reap_cluster(log_dir, address=args.ray_address or DEFAULT_ADDRESS, dry_run=args.dry_run)
    except ClusterUnavailableError as error:
        raise UsageError(f"{PROG} {error}") from error
    if args.json:
        out(reap_report.cluster_reap_json(result))
    else:
        out(reap_report.cluster_reap_lines(result, color=color()))
    for node in result.nodes:
        if node.error is not None:
            err(f"{PROG} reap --ray: node {node.node_id} ({node.address}): {node.error}")
    return 1 if result.failed else 0


def register(sub: Any) -> None:
    reap_ = add_command(
        sub,
        "reap",
        cmd_reap,
        "end the sidecars of runs whose launcher is gone, and close those runs",
        json_option=True,
    )
    reap_.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    reap_.add_argument(
        "--ray",
        action="store_true",
        help="reap on every alive node of the Ray cluster this joins (each node its own host's database)",
    )
    reap_.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join (implies --ray; default 'auto': $RAY_ADDRESS or the local cluster)",
    )
