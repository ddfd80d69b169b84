"""What ``stop``, ``prune`` and a draining ``start`` print, as lines and ``--json`` documents.

Must not read the database, judge processes or print: the CLI hands in what it read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sidecar_fsm.base.exitstatus import signal_name
from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.view.cells import (
    STATE_STYLES,
    UNKNOWN,
    dumps,
    format_age,
    format_local_time,
    instance_detail,
    iso_utc,
    short_run_id,
    table,
)

if TYPE_CHECKING:
    from sidecar_fsm.run.prune import PruneReport
    from sidecar_fsm.state.store import InstanceRecord, RunRecord
    from sidecar_fsm.view.live import Scrape


def stopped_lines(
    run: RunRecord, instances: Sequence[InstanceRecord], waited: float, *, color: bool = False
) -> list[str]:
    """``stop``'s report: the run's outcome, then a row per instance (state, exit code, detail)."""
    # The wait is this command's, not the run's life: "ended after 0.1s" read as a run that
    # lasted 0.1s.
    head = (
        f"run {short_run_id(run.run_id)} {run.outcome or 'ended'}; stop waited {waited:.1f}s for it to close"
    )
    rows = table(
        ["NAME", "STATE", "EXIT", "DETAIL"],
        [
            [
                inst.name,
                (inst.state, STATE_STYLES.get(inst.state)),
                # A process a signal ended shows the signal's name (SIGKILL), not a negative code.
                UNKNOWN if inst.exit_code is None else signal_name(inst.exit_code) or str(inst.exit_code),
                instance_detail(inst),
            ]
            for inst in instances
        ],
        indent="  ",
        color=color,
    )
    return [head, *rows]


def live_runs_lines(runs: Sequence[RunRecord]) -> list[str]:
    """The live runs ``stop`` could mean, one line each, for a user to pick one."""
    return table(
        ["RUN", "OWNER", "STARTED"],
        [
            [short_run_id(run.run_id), f"pid {run.owner_pid}", format_local_time(run.started_at)]
            for run in runs
        ],
        indent="  ",
    )


def prune_lines(report: PruneReport, log_dir: str) -> list[str]:
    verb = "would remove" if report.dry_run else "removed"
    age = format_age(report.older_than_seconds)
    lines = [
        f"{verb} run {short_run_id(pruned.run.run_id)} ({pruned.run.outcome or 'ended'} "
        f"{format_local_time(pruned.run.ended_at)}) and {len(pruned.files)} file(s)"
        for pruned in report.runs
    ]
    lines += [f"{verb} database temp file {path} (its creator was killed)" for path in report.temp_files]
    if not lines:
        hint = command_hint("status --all", log_dir)
        return [f"nothing to prune: no run ended more than {age} ago (see {hint})"]
    return lines


def prune_json(report: PruneReport) -> str:
    return dumps(
        {
            "dry_run": report.dry_run,
            "older_than_seconds": report.older_than_seconds,
            "runs": [
                {
                    "run_id": pruned.run.run_id,
                    "host": pruned.run.host,
                    "outcome": pruned.run.outcome,
                    "ended_at": iso_utc(pruned.run.ended_at),
                    "files": list(pruned.files),
                }
                for pruned in report.runs
            ],
            "temp_files": list(report.temp_files),
        }
    )


def draining_lines(
    instances: Sequence[tuple[str, Scrape | None]], grace_seconds: float, signal_name: str
) -> list[str]:
    """What ``start`` prints at its first signal: ``draining nvcf: 1 request in flight, up to
    60s; Ctrl-C again to stop now`` per instance. "Ctrl-C again" only after a Ctrl-C: a drain
    begun by SIGTERM may have no terminal to press it in.
    """
    grace = f"{grace_seconds:g}s"
    again = "Ctrl-C again to stop now" if signal_name == "SIGINT" else "a second signal stops it now"
    lines = []
    for name, scrape in instances:
        if scrape is None or scrape.figures is None:
            lines.append(f"draining {name}: requests in flight unknown, up to {grace}; {again}")
            continue
        count = scrape.figures.requests_in_flight
        if count:
            plural = "s" if count != 1 else ""
            lines.append(f"draining {name}: {count} request{plural} in flight, up to {grace}; {again}")
        else:
            lines.append(f"draining {name}: no request in flight")
    return [f"{signal_name}: draining the sidecars", *lines]
