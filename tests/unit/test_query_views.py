"""The query views are a contract: their columns, their values, and ``run_query``'s gates.

On real SQLite files written through the real store and state machine; no child processes (the
CLI on real runs of two hosts is ``tests/integration/test_query.py``).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sidecar_fsm.errors import UnusableStateError
from sidecar_fsm.run import traffic
from sidecar_fsm.state import query
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, database_path, load_migrations

# The documented columns (docs/query.md), in order. A migration may add columns at the end of a
# view; a change to any name or position below breaks every user's saved query: never do it.
CONTRACT = {
    "run_summary": [
        "host",
        "run_id",
        "owner_pid",
        "started",
        "ended",
        "outcome",
        "duration_s",
        "instances",
        "failed",
        "restarts",
    ],
    "instance_summary": [
        "host",
        "run_id",
        "name",
        "upstream",
        "state",
        "since",
        "restarts",
        "exit_code",
        "error",
        "reason",
        "listen",
        "pid",
        "spawned",
        "ready",
        "ready_s",
        "ended",
        "lived_s",
    ],
    "transition_log": [
        "host",
        "run_id",
        "instance",
        "source",
        "dest",
        "event",
        "at",
        "detail",
        "in_source_s",
        "seq",
    ],
    "spawn_attempts": ["host", "run_id", "instance", "attempt", "spawned", "ready", "ready_s", "next_state"],
    "traffic_summary": [
        "host",
        "run_id",
        "name",
        "upstream",
        "requests",
        "responses_2xx",
        "responses_4xx",
        "responses_5xx",
        "responses_502",
        "client_disconnects",
        "upstream_errors",
        "pings_sent",
        "ping_acks",
        "goaways",
        "retries",
        "ttfb_p50_s",
        "ttfb_p90_s",
        "ttfb_p99_s",
        "duration_p50_s",
        "duration_p90_s",
        "duration_p99_s",
        "duration_max_s",
        "as_of",
        "upstream_errors_dial",
        "upstream_errors_tls",
        "upstream_errors_alpn",
        "upstream_errors_ping_timeout",
        "upstream_errors_reset",
        "upstream_errors_other",
        "responses_other",
        "rotations",
        "final",
        "processes",
        "nvcf_followed",
        "nvcf_polls",
        "nvcf_budget_exceeded",
    ],
}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def view_columns(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
    try:
        views = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")]
        return {
            view: [row[1] for row in conn.execute(f"SELECT * FROM pragma_table_info('{view}')")]
            for view in views
        }
    finally:
        conn.close()


def test_a_new_database_has_the_documented_views_and_columns(tmp_path: Path) -> None:
    with Store.open(tmp_path, host="unit") as store:
        path = store.path
    assert view_columns(path) == CONTRACT
    assert {view: list(columns) for view, columns in query.VIEWS.items()} == CONTRACT


def test_the_documented_columns_are_the_ones_in_docs() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "query.md").read_text()
    for view, columns in CONTRACT.items():
        section = docs.split(f"`{view}`", 1)[1].split("\n## ", 1)[0]
        documented = [name for cell in re.findall(r"^\| (`[^|]*`) \|", section, re.M) for name in
                      re.findall(r"`(\w+)`", cell)]  # fmt: skip
        assert documented == columns, view


def database_at_step(log_dir: Path, step: int) -> sqlite3.Connection:
    """Host ``old``'s database as the code of schema ``step`` made it, open for writing rows."""
    path = database_path(log_dir, "old")
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for migration in load_migrations()[:step]:
        conn.executescript(migration.path.read_text())
    conn.execute(f"PRAGMA user_version = {step}")
    return conn


def test_a_database_from_before_the_views_is_migrated_and_queried(tmp_path: Path) -> None:
    conn = database_at_step(tmp_path, 3)
    conn.execute(
        "INSERT INTO runs (run_id, host, owner_pid, started_at, ended_at, outcome) "
        "VALUES ('r1', 'old', 7, 1764597600.25, 1764597660.75, 'ended')"
    )
    conn.close()

    result = query.run_query(tmp_path, "SELECT started, ended, duration_s, instances FROM run_summary")
    assert result.rows == [("2025-12-01T14:00:00.250Z", "2025-12-01T14:01:00.750Z", 60.5, 0)]
    assert result.hosts == ["old"]


# Two processes of one instance as step 5's store kept them: a column per figure, each histogram
# as [le, n] buckets (null: +Inf), and the percentiles it computed from them.
STEP5_TRAFFIC = [
    (4242, 1764597600.125, 1764597630.5, 1, 10, 8, 0, 2, 2, 0, 1, 0, 0, 0, 1, 1, 0, 30, 29, 1, 1, 0,
     '{"buckets": [[0.01, 3], [0.05, 5], [1.0, 0], [null, 0]], "count": 8, "sum": 0.2}',
     '{"buckets": [[0.01, 0], [0.05, 4], [1.0, 4], [null, 2]], "count": 10, "sum": 300.0}', 512.25),
    (4243, 1764597640.0, 1764597700.0, 0, 5, 4, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 12, 12, 0, 0, 2,
     '{"buckets": [[0.01, 0], [0.05, 0], [1.0, 5], [null, 0]], "count": 5, "sum": 2.0}',
     '{"buckets": [[0.01, 0], [0.05, 0], [1.0, 5], [null, 0]], "count": 5, "sum": 2.5}', 0.75),
]  # fmt: skip


def test_a_database_of_step_5_keeps_every_traffic_figure_and_its_records_import_on(tmp_path: Path) -> None:
    path = database_path(tmp_path, "old")
    conn = database_at_step(tmp_path, 5)
    conn.execute("INSERT INTO runs (run_id, host, owner_pid, started_at) VALUES ('r1', 'old', 7, 1764597600)")
    conn.execute(
        "INSERT INTO instances (run_id, name, listen, upstream, state, state_since) "
        "VALUES ('r1', 'policy', '127.0.0.1:1250', 'https://api.example.com', 'ready', 1764597600)"
    )
    for row in STEP5_TRAFFIC:
        conn.execute(f"INSERT INTO traffic VALUES (1, {', '.join('?' for _ in row)})", row)
    conn.execute("INSERT INTO traffic_quantiles VALUES (1, 0.05, 1.0, 1.0, 1.0, NULL, NULL)")
    before = conn.execute("SELECT * FROM traffic_summary").fetchall()
    conn.close()

    result = query.run_query(tmp_path, "SELECT * FROM traffic_summary")
    (row,) = [dict(zip(result.columns, values, strict=True)) for values in result.rows]
    old_columns = CONTRACT["traffic_summary"][: len(before[0])]
    assert [row[column] for column in old_columns] == list(before[0])
    assert (row["requests"], row["upstream_errors"], row["processes"], row["duration_p99_s"]) == (
        15,
        3,
        2,
        512.25,
    )
    assert (row["nvcf_followed"], row["nvcf_polls"], row["nvcf_budget_exceeded"]) == (0, 0, 0)

    with Store.open_existing(path) as store:
        reader = sqlite3.connect(path)
        (pid, record), _ = reader.execute("SELECT pid, record FROM traffic ORDER BY pid").fetchall()
        reader.close()
        stored = json.loads(record)
        assert (pid, stored["version"], stored["as_of"], stored["final"]) == (
            4242,
            1,
            "2025-12-01T14:00:30.500Z",
            True,
        )
        assert stored["duration_seconds"] == {
            "bounds": [0.01, 0.05, 1.0],
            "counts": [0, 4, 4, 2],
            "count": 10,
            "sum": 300.0,
        }
        assert traffic.parse(record).document == stored  # what the importer would accept
        # A third process: the percentiles are computed again over the migrated buckets too.
        third = {**stored, "pid": 4244, "as_of": "2025-12-01T14:10:00.000Z", "version": 2, "nvcf_polls": 4}
        third["duration_seconds"] = {
            "bounds": [0.01, 0.05, 1.0],
            "counts": [0, 0, 0, 5],
            "count": 5,
            "sum": 9.0,
        }
        assert store.record_traffic(1, traffic.parse(json.dumps(third))) is True
        (after,) = store.traffic_summary("r1")
    # Durations: 4 at <= 0.05 s, 9 more at <= 1 s, 7 past 1 s (+Inf: the max), of 20.
    assert (after["duration_p50_s"], after["duration_p90_s"], after["duration_max_s"]) == (
        1.0,
        512.25,
        512.25,
    )
    assert (after["ttfb_p50_s"], after["requests"], after["nvcf_polls"], after["processes"]) == (
        0.05,
        25,
        4,
        3,
    )


def recorded(store: Store, events: list[tuple[str, dict[str, Any]]], name: str = "policy") -> str:
    run_id = f"run-{name}"
    store.create_run(run_id, 4242, 1.0, {})
    record = store.create_instance(
        run_id, name, "127.0.0.1:1250", "https://api.example.com", None, None, None
    )
    machine = InstanceMachine(store, record.id)
    for event, facts in events:
        machine.fire(event, **facts)
    return run_id


STARTED = [("build", {}), ("spawn", {"pid": 100, "pid_start_time": 2.0}), ("ready", {})]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("sidecar 'p': exited with code 2 unexpectedly; see /l.log\nlog tail", "exited while ready"),
        ("sidecar 'p': exited with code 1 before it was ready; see /l.log", "exited before ready"),
        ("sidecar 'p': not ready after 10s; see /l.log", "not ready in time"),
        ("instances[0].listen: '127.0.0.1:1' is already in use by another process", "listen address in use"),
        ("reaped: owner pid 7 is gone; drained and exited after SIGTERM", "reaped"),
        ("sidecar 'p': exited with code 1 while draining; see /l.log", "drain failed"),
        ("sidecar 'p': '/bin/x' could not be started (no such file)", "could not start"),
        ("something new\nalready in use (a log tail's words do not count)", "other"),
    ],
)  # fmt: skip
def test_a_failed_instance_has_its_last_error_and_a_reason(tmp_path: Path, error: str, reason: str) -> None:
    with Store.open(tmp_path, host="unit") as store:
        recorded(store, [*STARTED, ("fail", {"error": error, "exit_code": 2, "detail": error})])
    result = query.run_query(tmp_path, "SELECT state, error, reason, exit_code FROM instance_summary")
    assert result.rows == [("failed", error, reason, 2)]


def test_restarts_show_as_attempts_transitions_and_counts(tmp_path: Path) -> None:
    with Store.open(tmp_path, host="unit") as store:
        events = [
            *STARTED,
            ("restart", {"restart_count": 1}),
            (
                "fail",
                {"error": "sidecar 'p': exited with code 1 before it was ready; see /l", "exit_code": 1},
            ),
        ]
        run_id = recorded(store, events)
        store.end_run(run_id, "failed")

    attempts = query.run_query(tmp_path, "SELECT attempt, next_state, ready_s >= 0 FROM spawn_attempts")
    assert attempts.rows == [(1, "ready", 1), (2, "failed", None)]
    log = query.run_query(
        tmp_path, "SELECT source, dest, event, at, in_source_s FROM transition_log ORDER BY seq"
    )
    assert [row[:3] for row in log.rows] == [
        ("configured", "building", "build"),
        ("building", "spawned", "spawn"),
        ("spawned", "ready", "ready"),
        ("ready", "spawned", "restart"),
        ("spawned", "failed", "fail"),
    ]
    assert all(ISO.fullmatch(row[3]) for row in log.rows)
    assert log.rows[0][4] is None and all(row[4] >= 0 for row in log.rows[1:])
    run = query.run_query(tmp_path, "SELECT outcome, instances, failed, restarts FROM run_summary")
    assert run.rows == [("failed", 1, 1, 1)]
    inst = query.run_query(
        tmp_path, "SELECT restarts, ended IS NOT NULL, lived_s >= ready_s FROM instance_summary"
    )
    assert inst.rows == [(1, 1, 1)]


def test_writes_are_refused_in_process_and_nothing_changes(tmp_path: Path) -> None:
    with Store.open(tmp_path, host="unit") as store:
        recorded(store, STARTED)
    folder = tmp_path / "sidecar-fsm"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for sql in ("DELETE FROM h0.runs", "PRAGMA query_only = 0", "SELECT 1; SELECT 2", "DETACH h0"):
        with pytest.raises(query.QueryRefused):
            query.run_query(tmp_path, sql)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_statement_past_its_deadline_raises_query_timeout(tmp_path: Path) -> None:
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    with pytest.raises(query.QueryTimeout, match=r"^interrupted after 0.2s \(--timeout\)"):
        query.run_query(tmp_path, forever, timeout=0.2)


def test_an_empty_log_dir_has_the_views_with_no_rows(tmp_path: Path) -> None:
    result = query.run_query(tmp_path, "SELECT * FROM instance_summary")
    assert (result.columns, result.rows, result.hosts) == (CONTRACT["instance_summary"], [], [])


def test_a_file_that_is_not_ours_is_refused_with_one_line(tmp_path: Path) -> None:
    path = database_path(tmp_path, "stranger")
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (x)")
    conn.execute("PRAGMA user_version = 9")
    conn.close()
    with pytest.raises(UnusableStateError, match=r"stranger\.db: schema 9 has no view 'run_summary'"):
        query.run_query(tmp_path, "SELECT 1")
