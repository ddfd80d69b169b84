"""The commands that end and tidy up runs: ``stop``, ``reap`` (and ``reap --ray``), ``prune``.

Must not judge or signal processes itself: the run layer proves every process ours before it
signals it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sidecar_fsm.base import trust
from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.cli.common import (
    PROG,
    Parser,
    UsageError,
    add_command,
    all_stores,
    color,
    err,
    every_run,
    find_run,
    log_dir_of,
    out,
    ray_options,
    require_log_dir,
    seconds_option,
)
from sidecar_fsm.errors import UnusableStateError
from sidecar_fsm.view.cells import short_run_id

# The run layer and the views are imported inside each cmd_ function (cli/common says why).


def _usable_log_dir(log_dir: str, where: str) -> None:
    """Raise unless ``reap``/``prune`` can act on ``log_dir`` (exit 1 missing, 2 unusable or
    writable by others), dry run or not: an operator who forgot ``--log-dir`` after a crash must
    not be told there is nothing to reap. Read-only."""
    require_log_dir(log_dir, where)
    from sidecar_fsm.state.dbfile import DB_DIR_NAME, database_files

    try:
        trust.check_log_dir(log_dir, os.path.join(log_dir, DB_DIR_NAME))
        database_files(log_dir)
    except UnusableStateError as error:
        raise UsageError(f"{PROG} {where}: {error}") from None


def cmd_reap(args: argparse.Namespace) -> int:
    log_dir, _ = log_dir_of(args)
    if args.ray or args.ray_address:
        return _reap_ray(args, log_dir)
    _usable_log_dir(log_dir, "reap")
    from sidecar_fsm.run.reap import reap_here
    from sidecar_fsm.view import reap_report

    # Only this host's database: a reap can signal only processes on its own host.
    report = reap_here(log_dir, dry_run=args.dry_run)
    out(reap_report.reap_json(report) if args.json else reap_report.reap_lines(report, color=color()))
    return 0


def _reap_ray(args: argparse.Namespace, log_dir: str) -> int:
    """``reap --ray``: the reap on every alive node of the Ray cluster; 1 if any node failed."""
    from sidecar_fsm.run.cluster import DEFAULT_ADDRESS, ClusterUnavailableError, reap_cluster
    from sidecar_fsm.view import reap_report

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


def cmd_stop(args: argparse.Namespace) -> int:
    from sidecar_fsm.run import remotestop
    from sidecar_fsm.state.hostname import host_name
    from sidecar_fsm.view import status, upkeep_report

    log_dir, _ = log_dir_of(args)
    here = host_name()
    timeout = seconds_option("stop", "--timeout", args.timeout, "90") if args.timeout is not None else None
    with all_stores(log_dir, "stop") as stores:
        runs = every_run(stores)
        if args.run:
            store, run = find_run(runs, args.run, "stop", log_dir)
            if run.host != here:
                raise UsageError(
                    f"{PROG} stop: run {short_run_id(run.run_id)} runs on {run.host}; stop it there"
                )
            if run.ended_at is not None:
                out(f"run {short_run_id(run.run_id)} already {run.outcome or 'ended'}; nothing to stop")
                return 0
        else:
            live = [(s, r) for s, r in runs if r.ended_at is None and r.host == here]
            if not live:
                raise LookupError(
                    f"{PROG} stop: no live run on {here} in {log_dir}; see {command_hint('status', log_dir)}"
                )
            if len(live) > 1:
                err(f"{PROG} stop: {len(live)} live runs on {here}; name one ({PROG} stop RUN):")
                err("\n".join(upkeep_report.live_runs_lines([r for _, r in live])))
                return 2
            store, run = live[0]
        short = short_run_id(run.run_id)

        waits: list[float] = []

        def asked(wait: float) -> None:
            waits.append(wait)
            err(
                f"stopping run {short}: SIGTERM sent to its owner (pid {run.owner_pid}); "
                f"waiting up to {wait:g}s"
            )

        result = remotestop.stop_run(store, run, timeout, asked)
        assert result.observed is not None
        if result.outcome == "refused":
            err(f"{PROG} stop: run {short}: {status.owner_refusal(result.observed)}")
            return 1
        instances = store.instances_of(run.run_id)
        if result.outcome == "timeout":
            err(
                f"{PROG} stop: run {short} is still stopping after {waits[0]:g}s; "
                f"see {command_hint('status --run ' + short, log_dir)}"
            )
            return 1
        if result.outcome == "owner-gone":
            err(
                f"{PROG} stop: run {short}: its owner exited without closing the run; "
                f"{status.reap_hint(result.observed)}"
            )
            return 1
    out(upkeep_report.stopped_lines(result.run, instances, result.waited_seconds, color=color()))
    return 0 if result.run.outcome == "ended" else 1


def cmd_prune(args: argparse.Namespace) -> int:
    from sidecar_fsm.run.prune import prune_here
    from sidecar_fsm.view import upkeep_report

    log_dir, _ = log_dir_of(args)
    older = _age(args.older_than)
    _usable_log_dir(log_dir, "prune")
    report = prune_here(log_dir, older_than_seconds=older, dry_run=args.dry_run)
    out(upkeep_report.prune_json(report) if args.json else upkeep_report.prune_lines(report, log_dir))
    return 0


def _age(text: str) -> float:
    """``--older-than``'s seconds; a usage error for a bare number, a negative or malformed age.

    A bare number is refused rather than read as seconds: ``--older-than 60`` meant as days
    removed every run older than a minute. Prune is destructive; the unit is never guessed.
    """
    from sidecar_fsm.run.prune import parse_age

    where = f"{PROG} prune: --older-than '{text}'"
    number = text.strip()
    if number.startswith("-"):
        raise UsageError(f"{where} is negative; give an age such as 7d, 36h or 90m")
    try:
        float(number)
    except ValueError:
        pass
    else:
        raise UsageError(f"{where} has no unit; add a unit: {number}s, {number}m, {number}h or {number}d")
    older = parse_age(number)
    if older is None:
        raise UsageError(f"{where} is not a duration; try 7d, 36h or 90m")
    return older


def register(sub: Any) -> None:
    stop = add_command(
        sub,
        "stop",
        cmd_stop,
        "stop a live run from another shell as Ctrl-C would, and say how each instance ended",
        example="sidecar-fsm stop 4c1e9a --timeout 90",
    )
    stop.add_argument(
        "run", metavar="RUN", nargs="?", help="run id or a unique prefix (default: the one live run here)"
    )
    stop.add_argument(
        "--timeout",
        metavar="S",
        help="seconds to wait for the run to close (default: its shutdown_grace + 15)",
    )

    prune = add_command(
        sub,
        "prune",
        cmd_prune,
        "remove ended runs (rows, logs, ready files) and a killed launcher's database temp files",
        json_option=True,
        example="sidecar-fsm prune --older-than 2d --dry-run",
    )
    # "-1d" is a (refused) value, not an unknown option: argparse would say "expected one argument".
    assert isinstance(prune, Parser)  # the subparsers' parser_class
    prune.dash_values = frozenset({"--older-than"})
    prune.add_argument(
        "--older-than",
        metavar="DURATION",
        default="7d",
        help="only runs that ended longer ago than this, with a unit: 90m, 36h, 7d (default 7d)",
    )
    prune.add_argument("--dry-run", action="store_true", help="print what would go, remove nothing")

    reap_ = add_command(
        sub,
        "reap",
        cmd_reap,
        "end the sidecars of runs whose launcher is gone, and close those runs",
        json_option=True,
        example="sidecar-fsm reap --dry-run",
    )
    reap_.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    ray_options(
        reap_, "reap on every alive node of the Ray cluster this joins (each node its own host's database)"
    )
