"""The read commands: ``status``, ``top``, ``history`` and ``logs``.

Reading never changes a state, writes a row or signals a process.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

# The views (and through them the store, the /metrics parser, rich) are imported inside each
# cmd_ function: ``--help`` and a missing log dir never load them (cli/common says why).
from sidecar_fsm.cli.common import (
    PROG,
    UsageError,
    add_command,
    all_stores,
    color,
    every_run,
    find_run,
    log_dir_of,
    only_instance,
    out,
    ray_options,
    seconds_option,
)

TOP_INTERVAL_SECONDS = 2.0
# How often ``logs -f`` looks for new lines.
FOLLOW_SECONDS = 0.2
# ``status``'s exit code when a shown live run needs attention (systemctl's "not running").
NEEDS_ATTENTION = 3


def cmd_status(args: argparse.Namespace) -> int:
    log_dir, _ = log_dir_of(args)
    if args.ray or args.ray_address:
        return _status_ray(args, log_dir)
    with all_stores(log_dir, "status") as stores:
        # Past all_stores' answer for a missing log dir, which needs none of this.
        from sidecar_fsm.view import render, status, traffic

        runs = every_run(stores)
        if args.run:
            runs = [find_run(runs, args.run, "status --run", log_dir)]
        elif not runs:
            out(render.status_json([]) if args.json else f"no runs recorded in {log_dir}")
            return 0
        else:
            runs = status.runs_to_show(runs, everything=args.all)
        statuses = [status.observe(store, run) for store, run in runs]
        totals = traffic.run_totals(stores)
    statuses = status.with_live(statuses)
    if args.json:
        out(render.status_json(statuses, traffic=totals))
    else:
        out(render.status_lines(statuses, color=color(), ended_in_one_table=args.all, traffic=totals))
    # systemctl's codes: a monitoring script reads "needs attention" without parsing the table.
    return NEEDS_ATTENTION if any(status.needs_attention(s) for s in statuses) else 0


def _status_ray(args: argparse.Namespace, log_dir: str) -> int:
    """``status --ray``: every alive node's runs, judged on that node; 1 if a node did not
    answer (the view is incomplete), else 3 if a run needs attention, else 0."""
    # Imported here: the cluster reach imports ray, which plain status never needs.
    from sidecar_fsm.run.cluster import DEFAULT_ADDRESS, ClusterUnavailableError
    from sidecar_fsm.view import cluster_report, cluster_status, status

    if args.run:
        raise UsageError(f"{PROG} status: --run does not apply with --ray; use --all or drop --run")
    try:
        result = cluster_status.status_cluster(
            log_dir, address=args.ray_address or DEFAULT_ADDRESS, everything=args.all
        )
    except ClusterUnavailableError as error:
        raise UsageError(f"{PROG} {error}") from error
    if args.json:
        out(cluster_report.cluster_status_json(result))
    else:
        out(cluster_report.cluster_status_lines(result, color=color()))
    if result.failed:
        return 1
    runs = [run for node in result.nodes for run in node.runs]
    return NEEDS_ATTENTION if any(status.needs_attention(s) for s in runs) else 0


def cmd_top(args: argparse.Namespace) -> int:
    """Live runs (or ``--run``) with their proxies' figures, redrawn every interval until Ctrl-C."""
    from sidecar_fsm.view import render, status, top

    log_dir, _ = log_dir_of(args)
    interval = seconds_option("top", "--interval", args.interval, "2")
    use_color = color()

    def frame() -> str:
        # Reopened for every frame: a run started meanwhile may be on a host database that did
        # not exist at the previous frame. Reading creates and changes nothing.
        with all_stores(log_dir, "top") as stores:
            if args.run:
                runs = [find_run(every_run(stores), args.run, "top --run", log_dir)]
            else:
                runs = status.runs_to_show(every_run(stores, "live"), everything=True)
            statuses = [status.observe(store, run) for store, run in runs]
        lines = render.top_lines(
            status.with_live(statuses), where=log_dir, interval=interval, color=use_color
        )
        return "\n".join(lines)

    return top.show(frame, interval)


def cmd_history(args: argparse.Namespace) -> int:
    import dataclasses  # with inspect, a fifth of what --help would load

    from sidecar_fsm.view import render, status, traffic

    log_dir, _ = log_dir_of(args)
    with all_stores(log_dir, "history") as stores:
        store, run = find_run(every_run(stores), args.run, "history", log_dir)
        observed = status.observe(store, run)
        instances = only_instance(observed.instances, args.instance, "history", run.run_id)
        observed = dataclasses.replace(observed, instances=instances)
        rows = [(inst.name, t) for inst in instances for t in store.history(inst.id)]
        figures = traffic.instance_traffic(store, run.run_id)
    rows.sort(key=lambda row: (row[1].at, row[1].id))
    if args.json:
        out(render.history_json(run, rows, status=observed, traffic=figures))
    else:
        out(render.history_lines(run, rows, color=color(), status=observed, traffic=figures))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """The proxies' logs of a run; with ``-f``, new lines until the run ends or Ctrl-C."""
    from sidecar_fsm.view import logs

    log_dir, _ = log_dir_of(args)
    if args.lines is not None and args.lines < 0:
        raise UsageError(f"{PROG} logs: -n '{args.lines}' must be 0 or more")
    with all_stores(log_dir, "logs") as stores:
        store, run = find_run(every_run(stores), args.run, "logs", log_dir)
        instances = only_instance(store.instances_of(run.run_id), args.instance, "logs", run.run_id)
        names = [inst.name for inst in instances]
        paths = [inst.log_path or "" for inst in instances]
        width = max(map(len, names)) if len(names) > 1 else 0
        offsets = []
        for name, path in zip(names, paths, strict=True):
            lines, offset = logs.tail(path, args.lines)
            offsets.append(offset)
            if lines:
                out([logs.prefixed(name, line, width) for line in lines])
        if not args.follow:
            return 0
        follower = logs.Follower(paths, offsets)
        try:
            while True:
                # Read the end before the lines: the lines a proxy wrote before its run closed
                # are all on disk by then, so the last read below gets every one of them.
                ended = (store.get_run(run.run_id) or run).ended_at is not None
                new = follower.read()
                if new:
                    out([logs.prefixed(names[index], line, width) for index, line in new])
                if ended:
                    return 0
                time.sleep(FOLLOW_SECONDS)
        except KeyboardInterrupt:
            return 0


def register(sub: Any) -> None:
    logs_ = add_command(
        sub,
        "logs",
        cmd_logs,
        "the proxies' logs of a run, each line prefixed with its instance when there are several",
        example="sidecar-fsm logs 4c1e9a policy -f -n 20",
    )
    logs_.add_argument("run", metavar="RUN", help="run id or a unique prefix of it")
    logs_.add_argument("instance", metavar="INSTANCE", nargs="?", help="only this instance")
    logs_.add_argument(
        "-f", "--follow", action="store_true", help="follow new lines until the run ends or Ctrl-C"
    )
    logs_.add_argument(
        "-n", "--lines", metavar="N", type=int, help="only the last N lines of each log (default: all)"
    )

    status_ = add_command(
        sub,
        "status",
        cmd_status,
        "runs and their instances (default: live runs and the latest ended); exit 3 if one needs attention",
        json_option=True,
        example="sidecar-fsm status --all",
    )
    status_.add_argument("--run", metavar="ID", help="only this run (a unique prefix is enough)")
    status_.add_argument("--all", action="store_true", help="every recorded run")
    ray_options(status_, "every alive node of the Ray cluster this joins, one table with a node column")

    top_ = add_command(
        sub,
        "top",
        cmd_top,
        "the live figures of status (in flight, PINGs, upstream), redrawn until Ctrl-C",
        example="sidecar-fsm top --interval 1",
    )
    top_.add_argument("--run", metavar="ID", help="only this run (default: every live run)")
    top_.add_argument(
        "--interval",
        metavar="SECONDS",
        default=str(TOP_INTERVAL_SECONDS),
        help=f"seconds between frames (default {TOP_INTERVAL_SECONDS:g})",
    )

    history = add_command(
        sub,
        "history",
        cmd_history,
        "a run's state transitions, oldest first, and what each instance carried",
        json_option=True,
        example="sidecar-fsm history 4c1e9a policy",
    )
    history.add_argument("run", metavar="RUN", help="run id or a unique prefix of it")
    history.add_argument("instance", metavar="INSTANCE", nargs="?", help="only this instance")
