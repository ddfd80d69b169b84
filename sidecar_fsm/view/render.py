"""Every human table and every ``--json`` document the command line prints.

Owns the presentation of runs, instances, transition histories and reap plans: column layout
(padded to the widest value, like ``supervisorctl status``), relative and absolute times, the
``-`` for an unknown value, colour on a terminal, and the stable JSON shapes (ISO-8601 UTC
times). Must not read the database, inspect processes or print: it turns records the caller
already holds into strings, so the CLI decides where they go and the tests can compare them.
Longer than the usual module on purpose: one file holds every output shape, so the tables and
JSON documents of all commands stay consistent with each other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sidecar_fsm.view.status import (
    OWNER_GONE,
    PROCESS_GONE,
    PROCESS_REUSED,
    REAP_HINT,
    RunStatus,
    process_alive,
    process_note,
)

if TYPE_CHECKING:
    from sidecar_fsm.run.cluster import ClusterReap, NodeReap
    from sidecar_fsm.run.reap import ReapReport
    from sidecar_fsm.state.store import InstanceRecord, RunRecord, TransitionRecord
    from sidecar_fsm.view.live import Scrape

UNKNOWN = "-"

# ANSI SGR codes. Colour is decoration only: the state name is always printed in full, so a log
# file, a pipe or a colour-blind reader loses nothing.
_STYLE_CODES = {
    "green": "32",
    "red": "31",
    "yellow": "33",
    "cyan": "36",
    "dim": "2",
    "bold": "1",
}
_STATE_STYLES = {
    "configured": "dim",
    "building": "yellow",
    "spawned": "yellow",
    "ready": "green",
    "draining": "yellow",
    "stopped": "dim",
    "failed": "red",
}
_OWNER_STYLES = {"alive": "green", "dead": "red", "reused": "red"}

# --------------------------------------------------------------------------------- formatting


def format_age(seconds: float | None) -> str:
    """A short, coarse duration: ``41s``, ``3m12s``, ``2h05m``, ``3d04h``; ``-`` when unknown.

    Clock steps can make a stored time lie in the future; that reads as ``0s``, not a negative.
    """
    if seconds is None:
        return UNKNOWN
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_elapsed(seconds: float) -> str:
    """Offset from the first transition of a history: ``+0.000s``, ``+1.234s``, ``+3m12s``."""
    if seconds < 60:
        return f"+{max(0.0, seconds):.3f}s"
    return "+" + format_age(seconds)


def format_local_time(ts: float | None, *, seconds: bool = False) -> str:
    """Wall-clock time in the local zone for people (``2026-11-30 12:03``); ``-`` when unknown."""
    if ts is None:
        return UNKNOWN
    moment = datetime.fromtimestamp(ts)
    if seconds:
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return moment.strftime("%Y-%m-%d %H:%M")


def iso_utc(ts: float | None) -> str | None:
    """ISO-8601 UTC with microseconds and a ``Z`` (the JSON form); ``None`` stays ``null``."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short_run_id(run_id: str) -> str:
    """The first 12 characters: unique in practice, and ``history`` accepts any unique prefix."""
    return run_id[:12]


def _first_line(text: str | None) -> str | None:
    if not text:
        return None
    return text.strip().splitlines()[0] if text.strip() else None


def instance_detail(instance: InstanceRecord) -> str:
    """The free-text column: ``exit 1: bind: address already in use``, restarts, or ``-``.

    Only the first line of a stored error is shown; the JSON and ``history`` keep all of it.
    """
    parts: list[str] = []
    error = _first_line(instance.error)
    if instance.exit_code is not None:
        parts.append(f"exit {instance.exit_code}: {error}" if error else f"exit {instance.exit_code}")
    elif error:
        parts.append(error)
    if instance.restart_count:
        parts.append(f"{instance.restart_count} restart{'s' if instance.restart_count != 1 else ''}")
    return "; ".join(parts) or UNKNOWN


# ------------------------------------------------------------------------------------- tables


Cell = tuple[str, "str | None"]


def _style(text: str, style: str | None, color: bool) -> str:
    if not color or not style or not text:
        return text
    return f"\x1b[{_STYLE_CODES[style]}m{text}\x1b[0m"


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Cell]],
    *,
    indent: str = "",
    color: bool = False,
) -> list[str]:
    """Lines of a table whose columns are padded to the widest value (header included).

    A cell is a string or ``(text, style)``; styles are applied after padding, so escape codes
    never skew the alignment. The last column is free text and is not padded (no trailing
    blanks). Empty strings become ``-``.
    """
    matrix: list[list[Cell]] = [[(h, "bold") for h in headers]]
    for row in rows:
        normalized: list[Cell] = []
        for cell in row:
            text, style = (cell, None) if isinstance(cell, str) else cell
            normalized.append((text if text != "" else UNKNOWN, style))
        matrix.append(normalized)
    widths = [max(len(row[i][0]) for row in matrix) for i in range(len(headers))]
    lines = []
    for row in matrix:
        parts = []
        for i, (text, style) in enumerate(row):
            padded = text if i == len(row) - 1 else text.ljust(widths[i])
            # Style only the text, not the padding, so underlines/backgrounds stay tight.
            parts.append(_style(text, style, color) + padded[len(text) :])
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines


def _owner_text(run: RunRecord, owner: str) -> str:
    return f"pid {run.owner_pid} ({owner})"


def _run_result(run: RunRecord, owner: str, now: float) -> Cell:
    if run.ended_at is None:
        if owner == "alive":
            return ("running", "green")
        if owner in ("dead", "reused"):
            return ("owner gone: run sidecar-fsm reap", "red")
        # Another host's pids cannot be judged from here; its own reap decides.
        return ("live (owner on another host)", None)
    outcome = run.outcome or "ended"
    style = {"ended": None, "failed": "red", "reaped": "yellow"}.get(outcome)
    return (f"{outcome} {format_age(now - run.ended_at)} ago", style)


def _pid_cell(status: RunStatus, inst: InstanceRecord) -> Cell:
    """The pid, with what became of it when the recorded process is not running: ``41030 (gone)``."""
    if inst.pid is None:
        return (UNKNOWN, None)
    process = status.process_of(inst)
    if process in (PROCESS_GONE, PROCESS_REUSED):
        return (f"{inst.pid} ({process})", "red")
    return (str(inst.pid), None)


def _detail_cell(status: RunStatus, inst: InstanceRecord) -> Cell:
    note = process_note(status, inst)
    if note is None:
        return (instance_detail(inst), None)
    detail = instance_detail(inst)
    return (note if detail == UNKNOWN else f"{note}; {detail}", "red")


def status_lines(runs: Sequence[RunStatus], *, now: float | None = None, color: bool = False) -> list[str]:
    """The ``status`` table: a line per run, its instances indented under it.

    Each run gets its own header block, so a run with no instances still reads clearly.
    """
    now = time.time() if now is None else now
    lines: list[str] = []
    for index, status in enumerate(runs):
        run = status.run
        if index:
            lines.append("")
        lines += table(
            ["RUN", "HOST", "OWNER", "STARTED", "INSTANCES", "RESULT"],
            [
                [
                    short_run_id(run.run_id),
                    run.host,
                    (_owner_text(run, status.owner), _OWNER_STYLES.get(status.owner)),
                    format_local_time(run.started_at),
                    str(len(status.instances)),
                    _run_result(run, status.owner, now),
                ]
            ],
            color=color,
        )
        if not status.instances:
            continue
        # The live columns only where something was scraped: a finished run would show dashes.
        with_live = bool(status.live)
        live_headers = LIVE_HEADERS if with_live else ()
        lines += table(
            ["NAME", "STATE", "PID", "LISTEN → UPSTREAM", "SINCE", *live_headers, "DETAIL"],
            [
                [
                    inst.name,
                    (inst.state, _STATE_STYLES.get(inst.state)),
                    _pid_cell(status, inst),
                    f"{inst.listen or UNKNOWN} → {inst.upstream or UNKNOWN}",
                    format_age(now - inst.state_since) if inst.state_since is not None else UNKNOWN,
                    *(live_cells(status.live_of(inst)) if with_live else ()),
                    _live_detail_cell(status, inst),
                ]
                for inst in status.instances
            ],
            indent="  ",
            color=color,
        )
    return lines


# ----------------------------------------------------------------------------- live figures

LIVE_HEADERS = ("IN FLIGHT", "OLDEST", "PINGS SENT/ACKED", "UPSTREAM")


def upstream_words(scrape: Scrape) -> Cell:
    """``up``, or ``down`` with the proxy's error counts by kind: ``down: dial 3, tls 1``.

    The proxy exposes counters, not its last error's text, so the kinds are what can be shown;
    its log has the line.
    """
    figures = scrape.figures
    if figures is None:
        return (UNKNOWN, None)
    if figures.upstream_up:
        return ("up", "green")
    counted = ", ".join(f"{kind} {count}" for kind, count in figures.errors_counted().items())
    return (f"down: {counted}" if counted else "down", "red")


def live_cells(scrape: Scrape | None) -> list[Cell]:
    """The IN FLIGHT, OLDEST, PINGS SENT/ACKED and UPSTREAM cells of one instance.

    Not scraped: dashes. Scraped without an answer: ``no answer`` (or ``bad answer``) under IN
    FLIGHT, the reason in DETAIL. The oldest age is a dash when nothing is in flight.
    """
    if scrape is None:
        return [(UNKNOWN, None)] * len(LIVE_HEADERS)
    figures = scrape.figures
    if figures is None:
        short = (scrape.problem or "no answer").split(":", 1)[0]
        return [(short, "yellow"), (UNKNOWN, None), (UNKNOWN, None), (UNKNOWN, None)]
    oldest = format_age(figures.oldest_request_age_seconds) if figures.requests_in_flight else UNKNOWN
    return [
        (str(figures.requests_in_flight), None),
        (oldest, None),
        (f"{figures.pings_sent}/{figures.ping_acks}", None),
        upstream_words(scrape),
    ]


def _live_detail_cell(status: RunStatus, inst: InstanceRecord) -> Cell:
    """DETAIL, with why the metrics could not be read when they could not."""
    text, style = _detail_cell(status, inst)
    scrape = status.live_of(inst)
    if scrape is None or scrape.problem is None:
        return (text, style)
    problem = f"/metrics at {scrape.address}: {scrape.problem}"
    return (problem if text == UNKNOWN else f"{text}; {problem}", style or "yellow")


def live_json(scrape: Scrape | None) -> dict[str, Any] | None:
    """An instance's ``live`` object in ``--json``: null when not scraped; else the address,
    ``answered``, ``problem`` (null when answered) and the figures (null when not answered)."""
    if scrape is None:
        return None
    figures = scrape.figures
    document: dict[str, Any] = {
        "metrics": scrape.address,
        "answered": figures is not None,
        "problem": scrape.problem,
    }
    keys = (
        "requests_in_flight",
        "oldest_request_age_seconds",
        "requests_total",
        "pings_sent",
        "ping_acks",
        "ping_rtt_seconds",
        "upstream_up",
        "upstream_connections",
    )
    for key in keys:
        document[key] = getattr(figures, key) if figures is not None else None
    document["upstream_errors"] = dict(figures.upstream_errors) if figures is not None else None
    return document


def top_lines(
    runs: Sequence[RunStatus], *, where: str, interval: float, now: float | None = None, color: bool = False
) -> list[str]:
    """One ``top`` frame: a heading (where, when, how often) and the ``status`` table of ``runs``."""
    now = time.time() if now is None else now
    clock = datetime.fromtimestamp(now).strftime("%H:%M:%S")
    head = _style(
        f"sidecar-fsm top: {len(runs)} live run{'s' if len(runs) != 1 else ''} in {where}, "
        f"{clock}, every {interval:g}s; Ctrl-C to quit",
        "bold",
        color,
    )
    if not runs:
        return [head, "", "no live runs (start one: sidecar-fsm start)"]
    return [head, "", *status_lines(runs, now=now, color=color)]


def _owner_words(run: RunRecord, owner: str | None) -> str:
    """``owner pid 41022 (alive)``; for a live run whose owner is gone, with the reap hint."""
    if owner is None:
        return f"owner pid {run.owner_pid}"
    if run.ended_at is None and owner in OWNER_GONE:
        return f"owner pid {run.owner_pid} ({owner}: {REAP_HINT})"
    return f"owner pid {run.owner_pid} ({owner})"


def history_lines(
    run: RunRecord,
    transitions: Sequence[tuple[str, TransitionRecord]],
    *,
    color: bool = False,
    status: RunStatus | None = None,
) -> list[str]:
    """The ``history`` table: every transition of the run (or one instance), oldest first.

    ``transitions`` pairs each record with its instance's name. TIME is local wall-clock time
    with milliseconds; AFTER is the offset from the first row, which is what a reader compares.
    With ``status`` (what runs now), the header says whether the owner lives, and a line per
    instance whose recorded-live process is gone says so, as ``status`` does.
    """
    started = format_local_time(run.started_at)
    owner = status.owner if status is not None else None
    head = [f"run {run.run_id} on {run.host}, {_owner_words(run, owner)}, started {started}"]
    if status is not None:
        for inst in status.instances:
            note = process_note(status, inst)
            if note is not None:
                head.append(_style(f"{inst.name}: {note}", "red", color))
    if not transitions:
        return [*head, "no transitions recorded"]
    first = transitions[0][1].at
    rows: list[list[str | Cell]] = [
        [
            format_local_time(t.at, seconds=True),
            format_elapsed(t.at - first),
            name,
            (t.source, _STATE_STYLES.get(t.source)),
            (t.dest, _STATE_STYLES.get(t.dest)),
            t.event,
            _first_line(t.detail) or UNKNOWN,
        ]
        for name, t in transitions
    ]
    return [*head, *table(["TIME", "AFTER", "INSTANCE", "FROM", "TO", "EVENT", "DETAIL"], rows, color=color)]


def reap_lines(report: ReapReport, *, color: bool = False) -> list[str]:
    """What ``reap`` did (or, with ``--dry-run``, would do), a block per run."""
    if not report.runs:
        return ["nothing to reap: every recorded run has a live owner or is already closed"]
    lines: list[str] = []
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
                        (inst.state, _STATE_STYLES.get(inst.state)),
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


def started_lines(run_id: str | None, log_dir: str, instances: Sequence[tuple[str, str, str]]) -> list[str]:
    """What ``start`` prints once every sidecar is ready (the launcher has already printed each
    rewritten base URL, as NeMo Gym's does): the run, its instances, and how to stop them.

    ``instances`` holds ``(name, listen, upstream)`` with the bound address.
    """
    lines = [f"run {run_id or UNKNOWN}: {len(instances)} sidecar(s) ready; state in {log_dir}"]
    lines += table(
        ["NAME", "LISTEN → UPSTREAM"],
        [[name, f"{listen} → {upstream}"] for name, listen, upstream in instances],
        indent="  ",
    )
    lines.append("supervising; Ctrl-C or SIGTERM drains and stops the sidecars (see: sidecar-fsm status)")
    return lines


# --------------------------------------------------------------------------------------- JSON


def dumps(document: Mapping[str, Any]) -> str:
    """The one JSON document a ``--json`` command prints: sorted keys, so diffs stay small."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)


def run_json(run: RunRecord, owner: str | None = None) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "host": run.host,
        "owner": {
            "pid": run.owner_pid,
            "start_time": iso_utc(run.owner_start_time),
            "status": owner,
        },
        "started_at": iso_utc(run.started_at),
        "ended_at": iso_utc(run.ended_at),
        "outcome": run.outcome,
        "config_summary": dict(run.config_summary),
    }


def instance_json(
    inst: InstanceRecord,
    process: str | None = None,
    scrape: Scrape | None = None,
    unrecorded: Sequence[int] = (),
) -> dict[str, Any]:
    """An instance's record plus what runs at its pid now: ``alive`` (true, false or null, see
    ``process_alive``) and ``process`` (``running``, ``gone``, ``reused``, ``other host`` or null),
    ``unrecorded_pids`` (its processes that run although no record names their pid), and
    ``live`` (see ``live_json``): what its proxy reported when asked just now."""
    return {
        "alive": process_alive(process),
        "process": process,
        "unrecorded_pids": list(unrecorded),
        "id": inst.id,
        "name": inst.name,
        "state": inst.state,
        "state_since": iso_utc(inst.state_since),
        "pid": inst.pid,
        "pid_start_time": iso_utc(inst.pid_start_time),
        "listen": inst.listen,
        "upstream": inst.upstream,
        "binary": inst.binary,
        "log_path": inst.log_path,
        "ready_path": inst.ready_path,
        "exit_code": inst.exit_code,
        "error": inst.error,
        "restart_count": inst.restart_count,
        "metrics": inst.metrics,
        "live": live_json(scrape),
    }


def status_json(runs: Sequence[RunStatus]) -> str:
    return dumps(
        {
            "runs": [
                {
                    **run_json(s.run, s.owner),
                    "instances": [
                        instance_json(i, s.process_of(i), s.live_of(i), s.unrecorded.get(i.id, ()))
                        for i in s.instances
                    ],
                }
                for s in runs
            ]
        }
    )


def history_json(
    run: RunRecord,
    transitions: Sequence[tuple[str, TransitionRecord]],
    *,
    status: RunStatus | None = None,
) -> str:
    """``{"run", "instances", "transitions"}``: the run with its owner's status, each instance's
    state and ``alive`` as ``status --json`` gives them, and the transitions oldest first."""
    return dumps(
        {
            "run": run_json(run, status.owner if status is not None else None),
            "instances": [
                {
                    "name": inst.name,
                    "state": inst.state,
                    "pid": inst.pid,
                    "alive": process_alive(status.process_of(inst)),
                    "process": status.process_of(inst),
                }
                for inst in status.instances
            ]
            if status is not None
            else [],
            "transitions": [
                {
                    "instance": name,
                    "instance_id": t.instance_id,
                    "from": t.source,
                    "to": t.dest,
                    "event": t.event,
                    "at": iso_utc(t.at),
                    "detail": t.detail,
                }
                for name, t in transitions
            ],
        }
    )


def reap_json(report: ReapReport) -> str:
    return dumps(
        {
            "dry_run": report.dry_run,
            "runs": [
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
                            "action": inst.action,
                            "result": inst.result,
                        }
                        for inst in run.instances
                    ],
                }
                for run in report.runs
            ],
        }
    )


def empty_json(kind: str) -> str:
    """The JSON of a command that found no state at all (``{"runs": []}``, ``{"transitions": []}``)."""
    return dumps({kind: []})


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
    """What ``reap --ray`` did on each node: a table of nodes, then each node's reap block.

    The blocks are exactly what ``reap`` prints on that host, indented under the node they came
    from, so a run is always read next to the node (and database) that reaped it.
    """
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
    nodes = []
    for node in result.nodes:
        # Reusing reap_json keeps one definition of a reaped run's shape for both commands.
        runs = json.loads(reap_json(node.report))["runs"] if node.report is not None else []
        nodes.append(
            {
                "node_id": node.node_id,
                "address": node.address,
                "ray_hostname": node.ray_hostname,
                "host": node.host,
                "database": node.database,
                "error": node.error,
                "runs": runs,
            }
        )
    return dumps({"address": result.address, "dry_run": result.dry_run, "nodes": nodes})
