"""``sidecar-fsm query`` on databases written by real runs of two hosts sharing one log dir.

The log dir is made the way a cluster's shared one is: real ``sidecar-fsm start`` processes (the
real Go proxy, the lab's TLS HTTP/2 origin) with ``SIDECAR_FSM_HOST`` naming the node, each
writing its own ``<host>.db``. node-a: a run whose ``policy`` proxy is killed and restarted, and
a run whose ``judge`` proxy dies (no restart policy: the run fails). node-b: a run whose owner
is killed with SIGKILL and then reaped, and a run started and stopped cleanly. The queries, the
README's examples, the refusals, the deadline, the read-only mount and Datasette run on it.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import SIDECAR_FSM, ProcessRegistry, http11_request, wait_until
from querycluster import (
    README,
    Run,
    get_json,
    open_files,
    readme_queries,
    rows,
    sfsm,
    snapshot,
    write_config,
)

from sidecar_fsm.lab import TlsH2Origin, make_ca_and_cert
from sidecar_fsm.state.store import Store

DATASETTE = Path(sys.executable).with_name("datasette")
SQLITE_UTILS = Path(sys.executable).with_name("sqlite-utils")
FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsH2Origin]:
    started = TlsH2Origin(make_ca_and_cert(tmp_path_factory.mktemp("query-ca"))).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    origin: TlsH2Origin,
    sidecar_binary: Path,
    session_process_registry: ProcessRegistry,
) -> Iterator[Path]:
    """A shared log dir with node-a's and node-b's databases, written by the real runs above."""
    root = tmp_path_factory.mktemp("query-cluster")
    log_dir = root / "logs"
    registry = ProcessRegistry(parent=session_process_registry)
    try:
        restarting = write_config(
            root / "restart.yaml", origin, sidecar_binary, restart={"max_restarts": 2, "backoff": "100ms"}
        )
        run = Run(log_dir, restarting, "node-a", registry)
        run.kill_proxy("policy")
        wait_until(
            lambda: (p := run.instances()["policy"])["restarts"] == 1 and p["state"] == "ready", 30, "restart"
        )
        run.stop(expect=0)

        failing = Run(log_dir, write_config(root / "plain.yaml", origin, sidecar_binary), "node-a", registry)
        failing.kill_proxy("judge")
        assert failing.proc.wait(timeout=30) == 1, failing.text()

        lasting = write_config(root / "lasting.yaml", origin, sidecar_binary, exit_with_owner=False)
        orphaned = Run(log_dir, lasting, "node-b", registry)
        orphaned.proc.send_signal(signal.SIGKILL)
        orphaned.proc.wait(timeout=10)
        reaped = sfsm(log_dir, "reap", host="node-b")
        assert reaped.returncode == 0 and "reap" in reaped.stdout, reaped.stdout + reaped.stderr

        clean = Run(log_dir, write_config(root / "clean.yaml", origin, sidecar_binary), "node-b", registry)
        carry(clean, origin)
        clean.stop(0)
        yield log_dir
    finally:
        registry.end_all()


def carry(run: Run, origin: TlsH2Origin) -> None:
    """Traffic for ``traffic_summary``: 4 answered requests through ``policy`` (one waiting 0.3 s
    for its first byte), 2 through ``judge``, then one ``judge`` request whose upstream
    connection the origin drops while it waits: a 502."""

    def send(name: str, path: str) -> int:
        host, _, port = run.instances()[name]["listen"].rpartition(":")
        return http11_request(host, int(port), path, timeout=30).status

    assert [send("policy", path) for path in ["/echo"] * 3 + ["/slow?first_byte=0.3"]] == [200] * 4
    assert [send("judge", "/echo") for _ in range(2)] == [200] * 2
    before = origin.received
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(send, "judge", "/slow?first_byte=20")
        wait_until(lambda: origin.received > before, 10, "the request to reach the origin")
        origin.drop_connections()
        assert waiting.result(timeout=30) == 502


# -- what the views say about the real runs ----------------------------------------------------


def test_every_hosts_runs_in_one_query_each_row_carrying_its_host(cluster: Path) -> None:
    runs = rows(cluster, "SELECT * FROM run_summary ORDER BY started")
    assert [(run["host"], run["outcome"], run["instances"]) for run in runs] == [
        ("node-a", "ended", 2),
        ("node-a", "failed", 2),
        ("node-b", "reaped", 2),
        ("node-b", "ended", 2),
    ]
    iso = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    for run in runs:
        assert iso.fullmatch(run["started"]) and iso.fullmatch(run["ended"])
        assert run["ended"] >= run["started"] and run["duration_s"] >= 0
        assert run["owner_pid"] > 0
    assert [run["restarts"] for run in runs] == [1, 0, 0, 0]
    assert [run["failed"] for run in runs] == [0, 1, 2, 0]

    only_b = rows(cluster, "SELECT DISTINCT host FROM instance_summary", "--host", "node-b")
    assert only_b == [{"host": "node-b"}]


def test_instances_carry_their_last_error_and_a_reason(cluster: Path) -> None:
    failed = rows(
        cluster,
        "SELECT host, name, reason, exit_code, error FROM instance_summary WHERE state = 'failed' "
        "ORDER BY host, name",
    )
    assert [(f["host"], f["name"], f["reason"]) for f in failed] == [
        ("node-a", "judge", "exited while ready"),
        ("node-b", "judge", "reaped"),
        ("node-b", "policy", "reaped"),
    ]
    assert "exited with code" in failed[0]["error"] and failed[0]["exit_code"] is not None
    assert failed[1]["error"].startswith("reaped: owner pid ")


def test_spawn_attempts_and_transitions_time_each_step(cluster: Path) -> None:
    attempts = rows(
        cluster,
        "SELECT a.* FROM spawn_attempts AS a JOIN run_summary AS r USING (host, run_id) "
        "WHERE r.restarts = 1 AND a.instance = 'policy' ORDER BY attempt",
    )
    assert [(a["attempt"], a["next_state"]) for a in attempts] == [(1, "ready"), (2, "ready")]
    assert all(0 < a["ready_s"] < 30 and a["ready"] >= a["spawned"] for a in attempts)

    log = rows(
        cluster,
        "SELECT t.* FROM transition_log AS t JOIN run_summary AS r USING (host, run_id) "
        "WHERE r.restarts = 1 AND t.instance = 'policy' ORDER BY seq",
    )
    assert [(t["source"], t["dest"]) for t in log] == [
        ("configured", "building"),
        ("building", "spawned"),
        ("spawned", "ready"),
        ("ready", "spawned"),
        ("spawned", "ready"),
        ("ready", "draining"),
        ("draining", "stopped"),
    ]
    assert log[0]["in_source_s"] is None and all(t["in_source_s"] >= 0 for t in log[1:])
    assert log[3]["event"] == "restart"


def test_table_and_csv_show_the_same_rows(cluster: Path) -> None:
    sql = "SELECT host, name, state, restarts FROM instance_summary ORDER BY host, run_id, name"
    table = sfsm(cluster, "query", sql)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["host", "name", "state", "restarts"]
    as_csv = sfsm(cluster, "query", sql, "--csv")
    assert as_csv.returncode == 0, as_csv.stderr
    parsed = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert parsed[0] == ["host", "name", "state", "restarts"]
    assert [line.split() for line in lines[1:]] == parsed[1:]
    assert len(parsed) == 1 + 8


def test_a_table_keeps_a_sub_millisecond_figure(cluster: Path) -> None:
    # A 0.49-ms maximum read 0.0 when every float was rounded to 3 decimals.
    table = sfsm(
        cluster, "query", "SELECT 0.00049 AS small, 1.23456 AS seconds, 0.0 AS zero", "--host", "node-a"
    )
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[-1].split() == ["0.00049", "1.235", "0.0"]


# -- nothing is ever written -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("DELETE FROM h0.runs", "would delete from 'runs'"),
        ("UPDATE h1.instances SET state = 'ready'", "would update 'instances'"),
        ("INSERT INTO h0.runs SELECT * FROM h0.runs", "would insert into 'runs'"),
        ("DROP VIEW run_summary", "would change the schema: writes are refused"),
        ("CREATE TABLE h0.notes (x)", "would change the schema: writes are refused"),
        ("ATTACH 'elsewhere.db' AS e", "would attach 'elsewhere.db'"),
        ("PRAGMA h0.user_version = 99", "would run pragma 'user_version'"),
        ("PRAGMA h0.journal_mode = DELETE", "would run pragma 'journal_mode'"),
        ("VACUUM h0", "would"),
        ("BEGIN IMMEDIATE", "would begin a transaction"),
        ("SELECT 1; DELETE FROM h0.runs", "you can only execute one statement at a time"),
    ],
)
def test_a_statement_that_would_write_is_refused_and_no_file_changes(
    cluster: Path, sql: str, says: str
) -> None:
    before = snapshot(cluster)
    done = sfsm(cluster, "query", sql)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("sidecar-fsm query: '") and says in line
    assert snapshot(cluster) == before


def test_reading_leaves_the_folder_as_it_was(cluster: Path) -> None:
    """The -wal/-shm a read-only attach makes beside an idle database are removed again."""
    before = snapshot(cluster)
    assert rows(cluster, "SELECT count(*) AS n FROM transition_log")[0]["n"] > 0
    assert snapshot(cluster) == before


def test_a_statement_past_its_deadline_is_interrupted_with_one_line(cluster: Path) -> None:
    started = time.monotonic()
    done = sfsm(cluster, "query", FOREVER, "--timeout", "0.5")
    assert time.monotonic() - started < 15
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "sidecar-fsm query: interrupted after 0.5s (--timeout); narrow the query or raise --timeout"
    ]


def attached_forever_query(
    log_dir: Path, host: str, timeout: float, registry: ProcessRegistry
) -> subprocess.Popen[str]:
    """``sidecar-fsm query`` of a statement that never ends on its own (it holds its read snapshot
    of every database until ``--timeout``), returned once it has ``host``'s database open: only
    then can a signal or a writer meet a query that is reading."""
    query = [f"{FOREVER}, run_summary", "--timeout", str(timeout)]
    reader = subprocess.Popen(
        [str(SIDECAR_FSM), "--log-dir", str(log_dir), "query", *query],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    registry.add(reader)
    db = log_dir / "sidecar-fsm" / f"{host}.db"
    wait_until(lambda: any(str(db) in str(f.path) for f in open_files(reader.pid)), 10, "query to attach")
    return reader


def test_ctrl_c_stops_a_long_query_with_one_line(cluster: Path, process_registry: ProcessRegistry) -> None:
    reader = attached_forever_query(cluster, "node-a", 60, process_registry)
    reader.send_signal(signal.SIGINT)
    stdout, stderr = reader.communicate(timeout=30)
    assert (reader.returncode, stdout, stderr) == (130, "", "sidecar-fsm: interrupted\n")


def test_bad_usage_is_one_line_exit_2(cluster: Path) -> None:
    for args, says in [
        (("SELECT nope FROM run_summary",), "no such column: nope"),
        (("SELECT 1", "--json", "--csv"), "--json and --csv both given; choose one"),
        (("SELECT 1", "--timeout", "0"), "--timeout '0': must be a number of seconds above 0"),
        (("-- only a comment",), "returns no rows; give one SELECT"),
    ]:
        done = sfsm(cluster, "query", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and says in done.stderr
    unknown = sfsm(cluster, "query", "SELECT 1", "--host", "node-z")
    assert unknown.returncode == 1
    assert unknown.stderr.strip().endswith("hosts: node-a, node-b")


# -- beside live runs, and on a read-only mount --------------------------------------------------


def test_a_long_query_beside_a_live_run_never_blocks_its_writes(
    log_dir: Path,
    origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
    tmp_path: Path,
) -> None:
    live = Run(
        log_dir, write_config(tmp_path / "live.yaml", origin, sidecar_binary), "node-live", process_registry
    )
    assert {i["state"] for i in live.instances().values()} == {"ready"}
    (run,) = rows(log_dir, "SELECT outcome, ended FROM run_summary")
    assert run == {"outcome": None, "ended": None}

    # A statement that holds its read snapshot of every database until its deadline.
    reader = attached_forever_query(log_dir, "node-live", 3, process_registry)
    slowest = 0.0
    with Store.open(log_dir, host="node-live") as writer:
        for index in range(200):
            if reader.poll() is not None:
                break
            began = time.monotonic()
            writer.create_run(f"beside-{index}", os.getpid(), None, {})
            slowest = max(slowest, time.monotonic() - began)
    _, stderr = reader.communicate(timeout=30)
    assert reader.returncode == 1 and "interrupted after 3s" in stderr
    assert index > 0 and slowest < 0.5, f"{index} writes, slowest {slowest:.3f}s"
    live.stop(expect=0)


def test_a_log_dir_mounted_read_only_is_queried_as_it_is(
    cluster: Path, make_tmpfs: Callable[..., Path], tmp_path: Path
) -> None:
    sql = (
        "SELECT host, run_id, name, state, restarts, error FROM instance_summary ORDER BY host, run_id, name"
    )
    expected = rows(cluster, sql)
    point = make_tmpfs("16m")
    shutil.copytree(cluster / "sidecar-fsm", point / "sidecar-fsm")
    # One database as a crashed launcher leaves it: commits still in its WAL, the -shm beside it.
    pending = Store.open(point, host="node-c")
    pending.create_run("c-run", 4242, None, {})
    copy = tmp_path / "node-c"
    copy.mkdir()
    for suffix in ("", "-wal", "-shm"):
        shutil.copy(point / "sidecar-fsm" / f"node-c.db{suffix}", copy / f"node-c.db{suffix}")
    pending.close()
    for suffix in ("", "-wal", "-shm"):
        shutil.copy(copy / f"node-c.db{suffix}", point / "sidecar-fsm" / f"node-c.db{suffix}")
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
    before = snapshot(point)

    assert rows(point, sql, "--host", "node-a", "--host", "node-b") == expected
    assert rows(point, "SELECT run_id FROM run_summary WHERE host = 'node-c'") == [{"run_id": "c-run"}]
    assert snapshot(point) == before

    subprocess.run(["mount", "-o", "remount,rw", str(point)], check=True)
    os.unlink(point / "sidecar-fsm" / "node-c.db-shm")
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
    done = sfsm(point, "query", "SELECT 1")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{point}/sidecar-fsm/node-c.db: read-only folder with a WAL but no -shm beside the database; "
        "mount it read-write once so SQLite can fold the WAL in"
    ]


def test_more_hosts_than_sqlite_attaches_at_once(log_dir: Path) -> None:
    for index in range(12):
        with Store.open(log_dir, host=f"n{index:02d}") as store:
            store.create_run(f"run-{index:02d}", 4242, None, {})
    found = rows(log_dir, "SELECT host, run_id FROM run_summary ORDER BY host")
    assert found == [{"host": f"n{i:02d}", "run_id": f"run-{i:02d}"} for i in range(12)]


# -- the README's examples, sqlite-utils and Datasette ---------------------------------------------


def test_the_readme_shows_seven_queries() -> None:
    assert len(readme_queries()) == 7


@pytest.mark.parametrize("number", range(7))
def test_each_readme_query_answers_as_shown(cluster: Path, number: int) -> None:
    argv, shown = readme_queries()[number]
    assert argv[:2] == ["sidecar-fsm", "query"]
    done = sfsm(cluster, *argv[1:])
    assert done.returncode == 0, done.stderr
    got = done.stdout.splitlines()
    assert got[0].split() == shown[0].split(), "the header the README shows"
    assert len(got) == len(shown), f"the README shows {len(shown) - 1} rows; the runs give:\n{done.stdout}"
    answers = rows(cluster, argv[2])
    checks: list[Callable[[list[dict[str, Any]]], bool]] = [
        # failures by reason and upstream
        lambda r: (
            {(x["upstream"].split(":")[1], x["reason"], x["failures"]) for x in r}
            == {
                ("//127.0.0.1", "exited while ready", 1),
                ("//127.0.0.1", "reaped", 1),
                ("//localhost", "reaped", 1),
            }
        ),
        # restarts per upstream
        lambda r: (
            [(x["upstream"].split(":")[1], x["restarts"]) for x in r]
            == [("//localhost", 1), ("//127.0.0.1", 0)]
        ),
        # spawned -> ready per host
        lambda r: (
            [(x["host"], x["starts"]) for x in r] == [("node-a", 5), ("node-b", 4)]
            and all(0 < x["avg_s"] <= x["max_s"] for x in r)
        ),
        # reaped runs
        lambda r: len(r) == 1 and r[0]["host"] == "node-b" and r[0]["reaped"] >= r[0]["started"],
        # the longest-lived instances
        lambda r: (
            len(r) == 5 and [x["lived_s"] for x in r] == sorted((x["lived_s"] for x in r), reverse=True)
        ),
        # the slowest instance's waits per upstream (a request's whole answer never beats its first byte)
        lambda r: (
            [(x["upstream"].split(":")[1], x["requests"]) for x in r]
            == [("//127.0.0.1", 3), ("//localhost", 4)]
            and all(x["p99_s"] >= x["ttfb_p99_s"] > 0 for x in r)
            and r[1]["max_s"] >= 0.3
        ),
        # the runs that lost requests to their upstream
        lambda r: (
            [(x["host"], x["name"], x["requests"], x["responses_502"]) for x in r]
            == [("node-b", "judge", 3, 1)]
        ),
    ]
    assert checks[number](answers), answers


def test_sqlite_utils_reads_the_views_as_the_readme_shows(cluster: Path) -> None:
    if not SQLITE_UTILS.exists():
        pytest.skip(f"sqlite-utils is not installed beside {sys.executable}")
    text = README.read_text()
    match = re.search(r"^sqlite-utils (.*)$", text, flags=re.MULTILINE)
    assert match is not None, "the README shows no sqlite-utils command"
    argv = shlex.split(match.group(1).replace("$LOG_DIR", str(cluster)))
    done = subprocess.run([str(SQLITE_UTILS), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == ["name", "state", "reason"]
    assert "exited while ready" in done.stdout  # node-a's failed run, read through its own view


def test_datasette_serves_a_view_through_its_json_api(cluster: Path, tmp_path: Path) -> None:
    if not DATASETTE.exists():
        pytest.skip(f"datasette is not installed beside {sys.executable} (pip install -e '.[datasette]')")
    # Immutable is for a database nothing writes: a copy, as of a finished job.
    served = tmp_path / "node-a.db"
    shutil.copy(cluster / "sidecar-fsm" / "node-a.db", served)
    log = tmp_path / "datasette.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(DATASETTE), "serve", "--immutable", str(served), "--host", "127.0.0.1", "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        found = wait_until(
            lambda: (
                re.search(r"http://127\.0\.0\.1:([1-9]\d*)", log.read_text()) or server.poll() is not None
            ),
            30,
            "datasette to listen",
        )
        assert server.poll() is None, log.read_text()
        assert isinstance(found, re.Match)
        url = f"http://127.0.0.1:{found.group(1)}/node-a/instance_summary.json?_shape=array"
        served_rows = wait_until(lambda: get_json(url), 30, "datasette to answer")
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    expected = rows(cluster, "SELECT * FROM instance_summary", "--host", "node-a")
    key = ("run_id", "name", "state", "restarts", "reason", "ready_s")
    assert sorted(tuple(r[k] for k in key) for r in served_rows) == sorted(
        tuple(r[k] for k in key) for r in expected
    )


def test_views_are_the_same_through_plain_sqlite(cluster: Path) -> None:
    """What Datasette and sqlite-utils read is the file's own views, not the command's unions."""
    path = (cluster / "sidecar-fsm" / "node-b.db").resolve()
    conn = sqlite3.connect(f"{path.as_uri()}?immutable=1", uri=True)
    try:
        outcomes = sorted(row[0] for row in conn.execute("SELECT outcome FROM run_summary"))
    finally:
        conn.close()
    assert outcomes == ["ended", "reaped"]
