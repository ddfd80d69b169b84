"""render: aligned columns, '-' for unknown, relative times, JSON keys and UTC times."""

from __future__ import annotations

import json
import re

import pytest

from sidecar_fsm.base import procs
from sidecar_fsm.observe.verdicts import Process
from sidecar_fsm.run.reap import InstanceReap, ReapReport, RunReap
from sidecar_fsm.state.store import InstanceRecord, RunRecord, TransitionRecord
from sidecar_fsm.view import cells, reap_report, render
from sidecar_fsm.view import status as view_status

NOW = 1_800_000_000.0  # a fixed "now" so relative times are exact


def run_record(**overrides: object) -> RunRecord:
    fields: dict[str, object] = {
        "run_id": "4c1e9a3f2b10deadbeef",
        "host": "node7",
        "owner_pid": 41022,
        "owner_start_time": NOW - 500.25,
        "started_at": NOW - 500,
        "ended_at": None,
        "outcome": None,
        "config_summary": {"instances": 2},
    }
    fields.update(overrides)
    return RunRecord(**fields)  # type: ignore[arg-type]


def instance_record(**overrides: object) -> InstanceRecord:
    fields: dict[str, object] = {
        "id": 1,
        "run_id": "4c1e9a3f2b10deadbeef",
        "name": "policy",
        "listen": "127.0.0.1:1250",
        "upstream": "https://api.example.com",
        "state": "ready",
        "state_since": NOW - 192,
        "pid": 41030,
        "pid_start_time": NOW - 193,
        "binary": "/cache/h2-ping-sidecar",
        "log_path": "/logs/h2ping-policy.log",
        "ready_path": "/logs/h2ping-policy.ready",
        "exit_code": None,
        "error": None,
        "restart_count": 0,
    }
    fields.update(overrides)
    return InstanceRecord(**fields)  # type: ignore[arg-type]


def two_instance_status() -> view_status.RunStatus:
    return view_status.RunStatus(
        run=run_record(),
        owner="alive",
        instances=[
            instance_record(),
            instance_record(
                id=2,
                name="judge",
                state="failed",
                pid=None,
                listen="127.0.0.1:1251",
                upstream="https://judge.example.com",
                state_since=NOW - 41,
                exit_code=1,
                error="bind: address already in use\nlog tail line",
            ),
        ],
    )


def test_age_formats() -> None:
    assert [cells.format_age(s) for s in (0, 41, 192, 3600 + 5 * 60, 3 * 86400 + 4 * 3600)] == [
        "0s",
        "41s",
        "3m12s",
        "1h05m",
        "3d04h",
    ]
    assert cells.format_age(None) == "-"
    assert cells.format_age(-5) == "0s"  # a clock step never shows a negative age


def test_iso_utc_is_utc_with_z() -> None:
    assert cells.iso_utc(0) == "1970-01-01T00:00:00.000000Z"
    assert cells.iso_utc(None) is None


def test_status_columns_are_aligned_and_unknowns_are_dashes() -> None:
    lines = render.status_lines([two_instance_status()], now=NOW)
    assert lines[0].split() == ["RUN", "HOST", "OWNER", "STARTED", "INSTANCES", "RESULT"]
    assert lines[1].startswith("4c1e9a3f2b10  node7  pid 41022 (alive)")
    assert lines[1].split()[-2:] == ["2", "running"]
    header, policy, judge = lines[2], lines[3], lines[4]
    assert header.startswith("  NAME")
    # Every column of every instance row starts where its header starts.
    for column in ("STATE", "PID", "LISTEN", "SINCE", "DETAIL"):
        start = header.index(column)
        assert policy[start - 1] == " " and policy[start] != " ", (column, policy)
        assert judge[start - 1] == " " and judge[start] != " ", (column, judge)
    assert policy.split()[:4] == ["policy", "ready", "41030", "127.0.0.1:1250"]
    assert "3m12s" in policy and policy.endswith("  -")
    assert judge.split()[:3] == ["judge", "failed", "-"]
    assert "41s" in judge
    # Free text last, first line of the error only.
    assert judge.endswith("exit 1: bind: address already in use")
    assert all(line == line.rstrip() for line in lines)


def test_status_shows_a_dead_owner_and_finished_runs() -> None:
    dead = view_status.RunStatus(run=run_record(), owner="dead", instances=[])
    ended = view_status.RunStatus(
        run=run_record(run_id="aaaa", ended_at=NOW - 30, outcome="reaped"), owner="dead", instances=[]
    )
    lines = render.status_lines([dead, ended], now=NOW)
    assert "pid 41022 (dead)" in lines[1]
    # Nothing of it runs any more: it ended by itself, with its owner.
    assert lines[1].endswith("ended: owner gone, nothing left running")
    assert lines[2] == ""
    assert lines[4].endswith("reaped 30s ago")
    elsewhere = view_status.RunStatus(run=run_record(host="node8"), owner="other host", instances=[])
    assert render.status_lines([elsewhere], now=NOW)[1].endswith("live (owner on another host)")


def test_colour_only_on_request_and_state_names_stay() -> None:
    plain = render.status_lines([two_instance_status()], now=NOW)
    coloured = render.status_lines([two_instance_status()], now=NOW, color=True)
    assert not any("\x1b[" in line for line in plain)
    assert any("\x1b[32mready\x1b[0m" in line for line in coloured)
    strip = re.compile(r"\x1b\[[0-9;]*m")
    assert [strip.sub("", line) for line in coloured] == plain


def test_status_json_keys_and_times() -> None:
    document = json.loads(render.status_json([two_instance_status()]))
    (run,) = document["runs"]
    assert set(run) == {
        "run_id",
        "host",
        "owner",
        "started_at",
        "ended_at",
        "outcome",
        "config_summary",
        "attention",
        "ended_with_owner",
        "instances",
    }
    assert run["owner"] == {"pid": 41022, "start_time": cells.iso_utc(NOW - 500.25), "status": "alive"}
    assert run["ended_at"] is None
    assert run["started_at"].endswith("Z")
    judge = run["instances"][1]
    assert set(judge) == {
        "alive",
        "process",
        "id",
        "name",
        "state",
        "state_since",
        "pid",
        "pid_start_time",
        "listen",
        "upstream",
        "binary",
        "log_path",
        "ready_path",
        "exit_code",
        "error",
        "restart_count",
        "metrics",
        "live",
        "unrecorded_pids",
    }
    assert judge["metrics"] is None and judge["live"] is None  # not scraped: null
    assert judge["unrecorded_pids"] == []
    assert judge["error"] == "bind: address already in use\nlog tail line"  # JSON keeps it all
    assert judge["pid"] is None and judge["exit_code"] == 1
    assert judge["alive"] is None and judge["process"] is None  # no process: null, not false


def test_history_lines_and_json() -> None:
    run = run_record()
    rows = [
        ("policy", TransitionRecord(1, 1, "configured", "building", "build", NOW, None)),
        ("policy", TransitionRecord(2, 1, "building", "spawned", "spawn", NOW + 0.25, "pid 41030")),
        ("policy", TransitionRecord(3, 1, "spawned", "ready", "ready", NOW + 61.5, None)),
    ]
    lines = render.history_lines(run, rows)
    assert lines[0].startswith("run 4c1e9a3f2b10deadbeef on node7")
    assert lines[1].split() == ["TIME", "AFTER", "INSTANCE", "FROM", "TO", "EVENT", "DETAIL"]
    assert "+0.000s" in lines[2] and lines[2].endswith("build  -")
    assert "+0.250s" in lines[3] and lines[3].endswith("pid 41030")
    assert "+1m01s" in lines[4]
    event_column = lines[1].index("EVENT")
    assert {line[event_column - 2 : event_column] for line in lines[2:]} == {"  "}
    document = json.loads(render.history_json(run, rows))
    assert set(document) == {"run", "instances", "transitions"}
    assert document["instances"] == []  # no observation given
    assert document["transitions"][1] == {
        "instance": "policy",
        "instance_id": 1,
        "from": "building",
        "to": "spawned",
        "event": "spawn",
        "at": cells.iso_utc(NOW + 0.25),
        "detail": "pid 41030",
    }
    assert render.history_lines(run, [])[1] == "no transitions recorded"


def test_reap_lines_and_json() -> None:
    report = ReapReport(
        dry_run=True,
        runs=[
            RunReap(
                run_id="4c1e9a3f2b10deadbeef",
                host="node7",
                owner_pid=41022,
                owner="dead",
                reason="owner pid 41022 is gone",
                instances=[InstanceReap(1, "policy", "ready", 41030, "SIGTERM, mark failed")],
                ready_files=["/logs/h2ping-policy.ready"],
            )
        ],
    )
    lines = reap_report.reap_lines(report)
    assert lines[0] == "would reap run 4c1e9a3f2b10 on node7: owner pid 41022 is gone"
    assert lines[1].split() == ["NAME", "STATE", "PID", "ACTION", "RESULT"]
    assert lines[2].split()[:3] == ["policy", "ready", "41030"] and lines[2].endswith("-")
    assert lines[3] == "  would remove stale ready file /logs/h2ping-policy.ready"
    document = json.loads(reap_report.reap_json(report))
    assert document["dry_run"] is True
    assert set(document["runs"][0]) == {
        "run_id",
        "host",
        "owner_pid",
        "owner",
        "reason",
        "ready_files",
        "instances",
    }
    assert document["runs"][0]["instances"][0]["action"] == "SIGTERM, mark failed"
    assert reap_report.reap_lines(ReapReport(dry_run=False, runs=[]))[0].startswith("nothing to reap")


def test_table_pads_to_widest_value_and_replaces_empty() -> None:
    lines = cells.table(["A", "LONGER", "LAST"], [["xxxxx", "", "free text"], ["y", "z", ""]])
    assert lines == [
        "A      LONGER  LAST",
        "xxxxx  -       free text",
        "y      z       -",
    ]


def observed(owner: str, process: str, **run: object) -> view_status.RunStatus:
    """The two-instance run with the policy sidecar's process observed as ``process``."""
    base = two_instance_status()
    return view_status.RunStatus(run_record(**run), owner, base.instances, {1: process})


# (owner, what runs at policy's pid) -> PID cell, DETAIL, json alive
OBSERVED = [
    ("alive", Process.RUNNING, "41030", "-", True),
    ("dead", Process.RUNNING, "41030", "-", True),
    (
        "dead",
        Process.GONE,
        "41030 (gone)",
        "recorded ready but pid 41030 has exited; nothing left running: "
        "run sidecar-fsm reap to close the record",
        False,
    ),
    (
        "reused",
        Process.REUSED,
        "41030 (reused)",
        "recorded ready but pid 41030 now belongs to another process; nothing left running: "
        "run sidecar-fsm reap to close the record",
        False,
    ),
    (
        "alive",
        Process.GONE,
        "41030 (gone)",
        "recorded ready but pid 41030 has exited; its launcher (pid 41022) has not recorded it yet",
        False,
    ),
    ("other host", Process.OTHER_HOST, "41030", "-", None),
]


@pytest.mark.parametrize(("owner", "process", "pid", "detail", "alive"), OBSERVED)
def test_status_shows_the_observed_process_of_a_recorded_live_instance(
    owner: str, process: str, pid: str, detail: str, alive: bool | None
) -> None:
    status = observed(owner, process)
    lines = render.status_lines([status], now=NOW)
    header, policy = lines[2], lines[3]
    assert policy[header.index("PID") :].startswith(pid + "  ")
    assert policy[header.index("DETAIL") :] == detail
    assert policy.split()[1] == "ready"  # the recorded state stays, the observation is beside it
    (run,) = json.loads(render.status_json([status]))["runs"]
    assert [(i["name"], i["alive"]) for i in run["instances"]] == [("policy", alive), ("judge", None)]
    assert run["instances"][0]["process"] == process


def test_status_names_a_running_process_no_record_names() -> None:
    """A launcher killed between a spawn and its commit: the row says configured, no pid."""
    unrecorded = view_status.RunStatus(
        run=run_record(),
        owner="dead",
        instances=[instance_record(state="configured", pid=None, pid_start_time=None)],
        unrecorded={1: [procs.ProcessIdentity(41077, NOW - 10, "/cache/h2-ping-sidecar", "/logs/x.ready")]},
    )
    lines = render.status_lines([unrecorded], now=NOW)
    assert lines[3].split()[:3] == ["policy", "configured", "-"]
    assert lines[3].endswith(
        "pid 41077 runs but was never recorded (its launcher died first); run sidecar-fsm reap"
    )
    (run,) = json.loads(render.status_json([unrecorded]))["runs"]
    (inst,) = run["instances"]
    assert (inst["alive"], inst["pid"], inst["unrecorded_pids"]) == (True, None, [41077])


def test_history_header_says_whether_owner_and_processes_live() -> None:
    status = observed("dead", Process.GONE)
    rows = [("policy", TransitionRecord(1, 1, "spawned", "ready", "ready", NOW, None))]
    lines = render.history_lines(status.run, rows, status=status)
    assert lines[0].startswith(
        "run 4c1e9a3f2b10deadbeef on node7, owner pid 41022 (dead: run sidecar-fsm reap)"
    )
    assert lines[1] == (
        "policy: recorded ready but pid 41030 has exited; nothing left running: "
        "run sidecar-fsm reap to close the record"
    )
    assert lines[2].split()[0] == "TIME"
    document = json.loads(render.history_json(status.run, rows, status=status))
    assert document["run"]["owner"]["status"] == "dead"
    assert document["instances"] == [
        {"name": "policy", "state": "ready", "pid": 41030, "alive": False, "process": "gone"},
        {"name": "judge", "state": "failed", "pid": None, "alive": None, "process": None},
    ]
    ended = observed("dead", Process.GONE, ended_at=NOW, outcome="ended")
    assert "owner pid 41022 (dead), started" in render.history_lines(ended.run, rows, status=ended)[0]


def test_status_ray_is_one_table_with_a_node_column_and_a_silent_node_shows_why() -> None:
    from sidecar_fsm.view.cluster_report import cluster_status_json, cluster_status_lines
    from sidecar_fsm.view.cluster_status import ClusterStatus, NodeStatus

    result = ClusterStatus(
        "10.0.0.1:6379",
        [
            NodeStatus("a" * 56, "10.0.0.1", "node7", "node7", [two_instance_status()]),
            NodeStatus("b" * 56, "10.0.0.2", "node8", "node8", []),
            NodeStatus("c" * 56, "10.0.0.3", "node9", None, [], "no answer within 20s"),
        ],
    )
    lines = cluster_status_lines(result, now=NOW)
    assert lines[0] == "status on 3 alive nodes of the Ray cluster at 10.0.0.1:6379"
    assert lines[1].split()[:4] == ["NODE", "HOST", "RUN", "OWNER"]
    assert [line.split()[:2] for line in lines[2:]] == [
        ["a" * 12, "node7"],
        ["a" * 12, "node7"],
        ["b" * 12, "node8"],
        ["c" * 12, "node9"],
    ]
    assert lines[4].endswith("no runs recorded on this host")
    assert lines[5].endswith("no answer within 20s")
    document = json.loads(cluster_status_json(result))
    assert [(node["host"], node["error"], len(node["runs"])) for node in document["nodes"]] == [
        ("node7", None, 1),
        ("node8", None, 0),
        (None, "no answer within 20s", 0),
    ]
    assert (
        document["nodes"][0]["runs"][0] == json.loads(render.status_json([two_instance_status()]))["runs"][0]
    )
