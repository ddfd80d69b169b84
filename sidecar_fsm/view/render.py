"""What ``status``, ``top``, ``history`` and ``start`` print, as tables and ``--json`` documents.

Must not read the database, inspect processes or print: it turns the status model
(``view.status``) into strings, so the CLI decides where they go and the tests can compare them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.observe.runs import ended_with_owner
from sidecar_fsm.observe.verdicts import OWNER_GONE, Owner, Process
from sidecar_fsm.view.cells import (
    OWNER_STYLES,
    STATE_STYLES,
    UNKNOWN,
    Cell,
    dumps,
    first_line,
    format_age,
    format_elapsed,
    format_local_time,
    instance_detail,
    iso_utc,
    short_run_id,
    styled,
    table,
)
from sidecar_fsm.view.status import (
    RunStatus,
    needs_attention,
    process_alive,
    process_note,
    reap_hint,
)
from sidecar_fsm.view.traffic import InstanceTraffic, totals_json, totals_text, traffic_json, traffic_line

if TYPE_CHECKING:
    from sidecar_fsm.state.store import InstanceRecord, RunRecord, TransitionRecord
    from sidecar_fsm.view.live import Scrape


def owner_text(run: RunRecord, owner: str) -> str:
    return f"pid {run.owner_pid} ({owner})"


def run_result(status: RunStatus, now: float) -> Cell:
    run, owner = status.run, status.owner
    if run.ended_at is None:
        if owner == "alive":
            return ("running", "green")
        if ended_with_owner(status):
            return ("ended: owner gone, nothing left running", "yellow")
        if owner in OWNER_GONE:
            return (f"owner gone: {reap_hint(status)}", "red")
        if owner == Owner.UNPROVEN:
            return ("live (owner cannot be proven: no start time recorded)", "yellow")
        # Another host's pids cannot be judged from here; its own reap decides.
        return ("live (owner on another host)", None)
    outcome = run.outcome or "ended"
    style = {"ended": None, "failed": "red", "reaped": "yellow"}.get(outcome)
    return (f"{outcome} {format_age(now - run.ended_at)} ago", style)


def pid_cell(status: RunStatus, inst: InstanceRecord) -> Cell:
    """The pid, with what became of it when the recorded process is not running: ``41030 (gone)``."""
    if inst.pid is None:
        return (UNKNOWN, None)
    process = status.process_of(inst)
    if process in (Process.GONE, Process.REUSED, Process.UNPROVEN):
        return (f"{inst.pid} ({process})", "red")
    return (str(inst.pid), None)


RUN_HEADERS = ["RUN", "HOST", "OWNER", "STARTED", "INSTANCES", "RESULT"]


def _run_row(status: RunStatus, now: float) -> list[str | Cell]:
    run = status.run
    return [
        short_run_id(run.run_id),
        run.host,
        (owner_text(run, status.owner), OWNER_STYLES.get(status.owner)),
        format_local_time(run.started_at),
        str(len(status.instances)),
        run_result(status, now),
    ]


def status_lines(
    runs: Sequence[RunStatus],
    *,
    now: float | None = None,
    color: bool = False,
    ended_in_one_table: bool = False,
    traffic: Mapping[str, tuple[int, int]] | None = None,
) -> list[str]:
    """The ``status`` table: a line per run, its instances indented under it.

    Each run gets its own header block, so a run with no instances still reads clearly. With
    ``ended_in_one_table`` (``status --all``) the ended runs follow as one table, a line each:
    eleven ended runs are eleven lines, not eleven headers; with ``traffic`` (run id -> requests
    and 502s) that table says what each run carried.
    """
    now = time.time() if now is None else now
    lines: list[str] = []
    ended = [status for status in runs if status.run.ended_at is not None] if ended_in_one_table else []
    for index, status in enumerate(shown for shown in runs if shown not in ended):
        if index:
            lines.append("")
        lines += table(RUN_HEADERS, [_run_row(status, now)], color=color)
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
                    (inst.state, STATE_STYLES.get(inst.state)),
                    pid_cell(status, inst),
                    f"{inst.listen or UNKNOWN} → {inst.upstream or UNKNOWN}",
                    format_age(now - inst.state_since) if inst.state_since is not None else UNKNOWN,
                    *(live_cells(status.live_of(inst)) if with_live else ()),
                    live_detail_cell(status, inst),
                ]
                for inst in status.instances
            ],
            indent="  ",
            color=color,
        )
    if ended:
        lines += [""] if lines else []
        headers, rows = RUN_HEADERS, [_run_row(status, now) for status in ended]
        if traffic is not None:
            headers = [*RUN_HEADERS, "TRAFFIC"]
            rows = [[*row, totals_text(traffic, s.run.run_id)] for row, s in zip(rows, ended, strict=True)]
        lines += table(headers, rows, color=color)
    return lines


# ----------------------------------------------------------------------------- live figures

LIVE_HEADERS = ("IN FLIGHT", "OLDEST", "PINGS SENT/ACKED", "UPSTREAM")


def upstream_words(scrape: Scrape) -> Cell:
    """``up``, or ``down`` with the proxy's error counts by kind: ``down: dial 3, tls 1`` (the
    last error's words are long: they go to DETAIL)."""
    figures = scrape.figures
    if figures is None:
        return (UNKNOWN, None)
    if figures.upstream_up:
        return ("up", "green")
    if figures.upstream_unchecked:
        return ("not checked yet", None)
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


def live_detail_cell(status: RunStatus, inst: InstanceRecord) -> Cell:
    """DETAIL: what is wrong with the process, then the record's detail, then why the metrics
    could not be read or the upstream is down."""
    note, text = process_note(status, inst), instance_detail(inst)
    style = None if note is None else "red"
    if note is not None:
        text = note if text == UNKNOWN else f"{note}; {text}"
    scrape = status.live_of(inst)
    figures = scrape.figures if scrape is not None else None
    if figures is not None and not figures.upstream_up and figures.upstream_error:
        reason = f"upstream: {figures.upstream_error}"
        return (reason if text == UNKNOWN else f"{text}; {reason}", style or "red")
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
    # The last upstream error's words while the upstream is down; null when up or not answered.
    document["upstream_error"] = (
        figures.upstream_error if figures is not None and not figures.upstream_up else None
    )
    return document


def top_lines(
    runs: Sequence[RunStatus], *, where: str, interval: float, now: float | None = None, color: bool = False
) -> list[str]:
    """One ``top`` frame: a heading (where, when, how often) and the ``status`` table of ``runs``."""
    now = time.time() if now is None else now
    clock = datetime.fromtimestamp(now).strftime("%H:%M:%S")
    head = styled(
        f"sidecar-fsm top: {len(runs)} live run{'s' if len(runs) != 1 else ''} in {where}, "
        f"{clock}, every {interval:g}s; Ctrl-C to quit",
        "bold",
        color,
    )
    if not runs:
        return [head, "", "no live runs (start one: sidecar-fsm start)"]
    return [head, "", *status_lines(runs, now=now, color=color)]


def _owner_words(run: RunRecord, status: RunStatus | None) -> str:
    """``owner pid 41022 (alive)``; for a live run whose owner is gone, with the reap hint."""
    if status is None:
        return f"owner pid {run.owner_pid}"
    owner = status.owner
    if run.ended_at is None and owner in OWNER_GONE:
        return f"owner pid {run.owner_pid} ({owner}: {reap_hint(status)})"
    return f"owner pid {run.owner_pid} ({owner})"


def history_lines(
    run: RunRecord,
    transitions: Sequence[tuple[str, TransitionRecord]],
    *,
    color: bool = False,
    status: RunStatus | None = None,
    traffic: Mapping[str, InstanceTraffic] | None = None,
) -> list[str]:
    """The ``history`` table: every transition of the run (or one instance), oldest first.

    ``transitions`` pairs each record with its instance's name. AFTER, the offset from the first
    row, is what a reader compares. With ``status``, the header says whether the owner lives and
    which recorded-live process is gone; with ``traffic`` too, a line per instance says what it
    carried.
    """
    started = format_local_time(run.started_at)
    head = [f"run {run.run_id} on {run.host}, {_owner_words(run, status)}, started {started}"]
    if status is not None:
        for inst in status.instances:
            note = process_note(status, inst)
            if note is not None:
                head.append(styled(f"{inst.name}: {note}", "red", color))
    tail = []
    if status is not None and traffic is not None:
        tail = [traffic_line(inst.name, traffic.get(inst.name)) for inst in status.instances]
    if not transitions:
        return [*head, "no transitions recorded", *tail]
    first = transitions[0][1].at
    rows: list[list[str | Cell]] = [
        [
            format_local_time(t.at, seconds=True),
            format_elapsed(t.at - first),
            name,
            (t.source, STATE_STYLES.get(t.source)),
            (t.dest, STATE_STYLES.get(t.dest)),
            t.event,
            first_line(t.detail) or UNKNOWN,
        ]
        for name, t in transitions
    ]
    headers = ["TIME", "AFTER", "INSTANCE", "FROM", "TO", "EVENT", "DETAIL"]
    return [*head, *table(headers, rows, color=color), *tail]


def started_lines(run_id: str | None, log_dir: str, instances: Sequence[tuple[str, str, str]]) -> list[str]:
    """What ``start`` prints once every sidecar is ready: the run, its instances (``(name,
    listen, upstream)``, the bound address) and how to stop them."""
    lines = [f"run {run_id or UNKNOWN}: {len(instances)} sidecar(s) ready; state in {log_dir}"]
    lines += table(
        ["NAME", "LISTEN → UPSTREAM"],
        [[name, f"{listen} → {upstream}"] for name, listen, upstream in instances],
        indent="  ",
    )
    lines.append(
        "supervising; Ctrl-C, SIGTERM or sidecar-fsm stop drains and stops the sidecars "
        f"(see: {command_hint('status', log_dir)})"
    )
    return lines


def lab_lines(
    upstream: str, ca_file: str, idle: float, origin_url: str, start_line: str, request_line: str
) -> list[str]:
    """What ``lab`` prints: the two values for a config, and two commands that try them."""
    return [
        f"upstream: {upstream}",
        f"ca_file: {ca_file}",
        f"the relay drops connections idle {idle:g}s; the origin ({origin_url}) serves /echo, "
        "/slow?first_byte=SECONDS and /sse",
        "in another shell, start a sidecar for it (the README's example config, pointed at the lab):",
        f"  {start_line}",
        "then, in a third, a request whose first byte takes twice the idle limit:",
        f"  {request_line}",
        "serving until Ctrl-C",
    ]


# --------------------------------------------------------------------------------------- JSON


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
    """An instance's record plus what runs at its pid now (``alive``, ``process``), its
    processes no record names (``unrecorded_pids``) and what its proxy just reported (``live``)."""
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


def run_status_json(s: RunStatus) -> dict[str, Any]:
    """One run of ``status --json``: the run, its owner, what needs attention, its instances."""
    return {
        **run_json(s.run, s.owner),
        "attention": needs_attention(s),
        "ended_with_owner": ended_with_owner(s),
        "instances": [
            instance_json(i, s.process_of(i), s.live_of(i), s.unrecorded_pids(i)) for i in s.instances
        ],
    }


def status_json(runs: Sequence[RunStatus], traffic: Mapping[str, tuple[int, int]] | None = None) -> str:
    """``status --json``; with ``traffic``, each run's ``traffic`` (requests and 502s, or null)."""
    documents = [run_status_json(s) for s in runs]
    if traffic is not None:
        for document, s in zip(documents, runs, strict=True):
            document["traffic"] = totals_json(traffic, s.run.run_id)
    return dumps({"runs": documents})


def history_json(
    run: RunRecord,
    transitions: Sequence[tuple[str, TransitionRecord]],
    *,
    status: RunStatus | None = None,
    traffic: Mapping[str, InstanceTraffic] | None = None,
) -> str:
    """``{"run", "instances", "transitions"}``: the run and each instance as ``status --json``
    gives them (with ``traffic``, its ``traffic``), and the transitions oldest first."""
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
                    **({"traffic": traffic_json(traffic.get(inst.name))} if traffic is not None else {}),
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
