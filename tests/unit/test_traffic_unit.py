"""Traffic figures: the record (versions 1 and 2), its import, the store's rows and ``traffic_summary``.

On real SQLite files and real files in a real log dir, written by hand as the proxy writes them;
no child processes (the real proxy is ``tests/integration/test_traffic.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar_fsm.config import H2PingSidecarConfig
from sidecar_fsm.errors import ConfigError
from sidecar_fsm.run import traffic
from sidecar_fsm.run.binaryflags import GYM_FLAGS, BinaryFlags, filter_command, refusals
from sidecar_fsm.run.command import sidecar_command
from sidecar_fsm.run.runfiles import instance_files, sibling
from sidecar_fsm.state import query
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store
from sidecar_fsm.view import traffic as view_traffic

BOUNDS = [0.005, 0.01, 0.05, 0.1, 1.0, 10.0, 100.0, 3600.0]


def histogram(counts: list[int], total_seconds: float = 1.0) -> dict[str, Any]:
    assert len(counts) == len(BOUNDS) + 1
    return {"bounds": BOUNDS, "counts": counts, "sum": total_seconds, "count": sum(counts)}


def document(pid: int = 4242, **overrides: Any) -> dict[str, Any]:
    """A version-1 traffic file as the proxy writes it (go/traffic.go)."""
    figures: dict[str, Any] = {
        "version": 1,
        "pid": pid,
        "started_at": "2026-12-01T20:00:00.123Z",
        "as_of": "2026-12-01T20:05:30.000Z",
        "final": False,
        "requests": 10,
        "responses_2xx": 8,
        "responses_4xx": 0,
        "responses_5xx": 2,
        "responses_502": 2,
        "responses_other": 0,
        "client_disconnects": 1,
        "upstream_errors": {"dial": 0, "tls": 0, "alpn": 0, "ping_timeout": 1, "reset": 1, "other": 0},
        "pings_sent": 30,
        "ping_acks": 29,
        "goaways": 1,
        "retries": 1,
        "rotations": 0,
        "ttfb_seconds": histogram([0, 3, 5, 0, 0, 0, 0, 0, 0], 0.2),
        "duration_seconds": histogram([0, 0, 0, 0, 4, 4, 1, 1, 0], 300.0),
        "duration_max_s": 512.25,
    }
    figures.update(overrides)
    return figures


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path, host="unit")
    yield opened
    opened.close()


def instance(
    store: Store, tmp_path: Path, run_id: str = "run1", name: str = "policy", pid: int = 4242
) -> Any:
    """A ready instance whose process is ``pid``, its log in ``tmp_path``."""
    if store.get_run(run_id) is None:
        store.create_run(run_id, 7, 1.0, {})
    log = str(tmp_path / f"h2ping-{name}-unit-{run_id}.log")
    record = store.create_instance(run_id, name, "127.0.0.1:0", "https://api.example.com", "/b", log, None)
    machine = InstanceMachine(store, record.id)
    machine.fire("build")
    machine.fire("spawn", pid=pid, pid_start_time=1.0)
    machine.fire("ready")
    return store.get_instance(record.id)


def write(log_path: str, figures: dict[str, Any] | str) -> str:
    path = traffic.traffic_path(log_path)
    Path(path).write_text(figures if isinstance(figures, str) else json.dumps(figures))
    os.chmod(path, 0o600)
    return path


def summary(tmp_path: Path, columns: str = "*") -> list[dict[str, Any]]:
    result = query.run_query(tmp_path, f"SELECT {columns} FROM traffic_summary ORDER BY run_id, name")
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


# -- the file -----------------------------------------------------------------------------------


def test_a_record_reads_as_written_with_its_process_and_time() -> None:
    written = document()
    record = traffic.parse(json.dumps(written))
    assert (record.pid, record.document) == (4242, written)
    assert record.as_of == pytest.approx(
        traffic.parse(json.dumps(document(as_of="2026-12-01T21:05:30+01:00"))).as_of
    )
    assert record.as_of == 1796155530.0  # 2026-12-01T20:05:30Z
    second = traffic.parse(
        json.dumps(document(version=2, nvcf_followed=3, nvcf_polls=7, nvcf_budget_exceeded=1))
    )
    assert second.document["nvcf_polls"] == 7


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"version": 1, "pid": 42, "req', "not JSON"),  # half-written (a copy, not our rename)
        ("[1, 2]", "not a JSON object"),
        (json.dumps(document(version=3)), "version 3 is not 1 or 2"),
        (json.dumps(document(version=True)), "version true is not 1 or 2"),
        (json.dumps({k: v for k, v in document().items() if k != "version"}), "version null is not 1 or 2"),
        (json.dumps(document(pid=0)), "pid 0 is not a process id"),
        (json.dumps(document(requests=-1)), "requests -1 is not a count"),
        (json.dumps(document(requests=1.5)), "requests 1.5 is not a count"),
        (json.dumps(document(version=2, nvcf_polls=-2)), "nvcf_polls -2 is not a count"),
        (json.dumps(document(note="Authorization: x")), 'note "Authorization: x" is not a count'),
        (json.dumps(document(final="yes")), 'final "yes" is not true or false'),
        (json.dumps(document(as_of="yesterday")), 'as_of "yesterday" is not an RFC 3339 time'),
        (json.dumps(document(upstream_errors={"dial": None})), "upstream_errors.dial null is not a count"),
        (json.dumps(document(duration_max_s=float("nan"))), "duration_max_s NaN is not a number of seconds"),
        (json.dumps(document(duration_max_s="long")), 'duration_max_s "long" is not a number of seconds'),
        (
            json.dumps({k: v for k, v in document().items() if k != "ttfb_seconds"}),
            "ttfb_seconds is not a histogram",
        ),
        (json.dumps(document(duration_seconds={"count": 0})), "duration_seconds is not a histogram"),
        (
            json.dumps(document(ttfb_seconds={"bounds": [1, 2], "counts": [1, 2], "sum": 1, "count": 3})),
            "ttfb_seconds: 2 counts for 2 bounds; want one more count",
        ),
        (
            json.dumps(document(ttfb_seconds={"bounds": [2, 1], "counts": [1, 2, 3], "sum": 1, "count": 6})),
            "ttfb_seconds: bounds are not increasing",
        ),
        (
            json.dumps(document(ttfb_seconds={"bounds": [1, 2], "counts": [1, 2, 3], "sum": 1, "count": 7})),
            "ttfb_seconds: count 7 is not the sum of its counts (6)",
        ),
        (
            json.dumps(document(ttfb_seconds={**histogram([0] * 9), "path": "/v1?key=x"})),
            "ttfb_seconds.path is not a histogram field",
        ),
    ],
)
def test_what_is_not_a_traffic_record_is_refused_saying_why(text: str, reason: str) -> None:
    with pytest.raises(traffic.NotFigures) as refused:
        traffic.parse(text)
    assert str(refused.value).startswith(reason)


def test_a_malformed_record_is_refused_in_one_line_and_the_stored_figures_stay(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = instance(store, tmp_path)
    write(inst.log_path, document())
    traffic.import_instances(store, [inst])
    before = summary(tmp_path)
    path = write(inst.log_path, document(as_of="2026-12-01T20:06:00.000Z", requests=12, retries=-1))
    traffic.import_instances(store, [inst])
    assert capsys.readouterr().err.splitlines() == [
        f"WARNING: traffic figures {path} ignored: retries -1 is not a count"
    ]
    assert summary(tmp_path) == before


def test_a_version_2_records_nvcf_counters_add_up_and_version_1_reads_0(store: Store, tmp_path: Path) -> None:
    old = instance(store, tmp_path, name="judge", pid=4243)
    write(old.log_path, document(pid=4243))
    inst = instance(store, tmp_path, pid=100)
    write(inst.log_path, document(pid=100, version=2, nvcf_followed=3, nvcf_polls=9, nvcf_budget_exceeded=1))
    traffic.import_instances(store, [inst, old])
    machine = InstanceMachine(store, inst.id, "ready")
    machine.fire("restart", pid=200, pid_start_time=2.0, restart_count=1)
    restarted = store.get_instance(inst.id)
    write(inst.log_path, document(pid=200, version=2, nvcf_followed=2, nvcf_polls=4, nvcf_budget_exceeded=0))
    traffic.import_instances(store, [restarted])
    instance(store, tmp_path, name="silent", pid=300)  # wrote no record: NULL, as every figure
    columns = "name, requests, processes, nvcf_followed, nvcf_polls, nvcf_budget_exceeded"
    assert summary(tmp_path, columns) == [
        {"name": "judge", "requests": 10, "processes": 1, "nvcf_followed": 0, "nvcf_polls": 0,
         "nvcf_budget_exceeded": 0},
        {"name": "policy", "requests": 20, "processes": 2, "nvcf_followed": 5, "nvcf_polls": 13,
         "nvcf_budget_exceeded": 1},
        {"name": "silent", "requests": None, "processes": None, "nvcf_followed": None, "nvcf_polls": None,
         "nvcf_budget_exceeded": None},
    ]  # fmt: skip


def test_a_file_of_another_process_or_corrupt_warns_once_and_is_ignored(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = instance(store, tmp_path, pid=4242)
    path = write(inst.log_path, document(pid=999))
    for _ in range(3):
        traffic.import_instances(store, [inst])
    warned = capsys.readouterr().err.splitlines()
    assert warned == [
        f"WARNING: traffic figures {path} ignored: pid 999 is not one of this instance's processes ([4242])"
    ]
    write(inst.log_path, '{"version": 1, "pid": 4242, "requ')
    other = instance(store, tmp_path, name="judge", pid=4243)
    corrupt = write(other.log_path, "garbage")
    for _ in range(3):
        traffic.import_instances(store, [inst, other])
    warned = capsys.readouterr().err.splitlines()
    assert warned == [
        f"WARNING: traffic figures {corrupt} ignored: not JSON (Expecting value: line 1 column 1 (char 0))"
    ]
    assert [row["as_of"] for row in summary(tmp_path)] == [None, None]


def test_no_file_yet_is_not_a_warning_and_a_log_dir_others_can_write_is_not_read(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = instance(store, tmp_path)
    traffic.import_instances(store, [inst])
    write(inst.log_path, document())
    os.chmod(tmp_path, 0o777)
    try:
        traffic.import_instances(store, [inst])
    finally:
        os.chmod(tmp_path, 0o755)
    os.chmod(traffic.traffic_path(inst.log_path), 0o666)
    traffic.import_instances(store, [inst])
    assert capsys.readouterr().err == ""
    assert summary(tmp_path, "requests") == [{"requests": None}]
    os.chmod(traffic.traffic_path(inst.log_path), 0o600)
    traffic.import_instances(store, [inst])
    assert summary(tmp_path, "requests") == [{"requests": 10}]


# -- the rows and the view ----------------------------------------------------------------------


def test_an_import_is_idempotent_and_a_later_as_of_replaces_the_earlier(store: Store, tmp_path: Path) -> None:
    inst = instance(store, tmp_path)
    write(inst.log_path, document())
    traffic.import_instances(store, [inst])
    before = summary(tmp_path)
    traffic.import_instances(store, [inst])
    figures = traffic.parse(json.dumps(document()))
    assert store.record_traffic(inst.id, figures) is False
    assert summary(tmp_path) == before
    assert before[0]["requests"] == 10 and before[0]["as_of"] == "2026-12-01T20:05:30.000Z"

    older = document(as_of="2026-12-01T20:05:00.000Z", requests=3)
    assert store.record_traffic(inst.id, traffic.parse(json.dumps(older))) is False
    newer = document(as_of="2026-12-01T20:06:00.000Z", requests=12, final=True)
    write(inst.log_path, newer)
    traffic.import_instances(store, [inst])
    (row,) = summary(tmp_path)
    assert (row["requests"], row["final"], row["processes"]) == (12, 1, 1)
    assert row["as_of"] == "2026-12-01T20:06:00.000Z"


def test_a_restart_adds_both_processes_figures(store: Store, tmp_path: Path) -> None:
    inst = instance(store, tmp_path, pid=100)
    write(inst.log_path, document(pid=100, final=True))
    traffic.import_instances(store, [inst])
    # The restart: the row now names the new process; the file still holds the dead one's
    # figures until the new one writes (accepted: that pid's figures are stored).
    machine = InstanceMachine(store, inst.id, "ready")
    machine.fire("restart", pid=200, pid_start_time=2.0, restart_count=1)
    restarted = store.get_instance(inst.id)
    traffic.import_instances(store, [restarted])
    assert summary(tmp_path, "requests, processes") == [{"requests": 10, "processes": 1}]
    second = document(
        pid=200,
        as_of="2026-12-01T20:09:00.000Z",
        requests=5,
        responses_502=1,
        upstream_errors={"dial": 1, "tls": 0, "alpn": 0, "ping_timeout": 0, "reset": 0, "other": 0},
        ttfb_seconds=histogram([0, 0, 0, 0, 0, 2, 0, 0, 0]),
        duration_max_s=700.0,
    )
    write(inst.log_path, second)
    traffic.import_instances(store, [restarted])
    (row,) = summary(tmp_path)
    assert (row["requests"], row["responses_502"], row["upstream_errors"]) == (15, 3, 3)
    assert (row["upstream_errors_dial"], row["upstream_errors_ping_timeout"], row["processes"]) == (1, 1, 2)
    assert (row["final"], row["duration_max_s"], row["as_of"]) == (0, 700.0, "2026-12-01T20:09:00.000Z")
    # 10 first bytes added up: 3 at <= 10 ms, 5 at <= 50 ms, 2 at <= 10 s.
    assert (row["ttfb_p50_s"], row["ttfb_p90_s"], row["ttfb_p99_s"]) == (0.05, 10.0, 10.0)


@pytest.mark.parametrize(
    ("counts", "max_s", "expected"),
    [
        # 100 requests: the p50 is the 50th, the p90 the 90th, the p99 the 99th, by bucket.
        ([0, 0, 50, 0, 40, 9, 1, 0, 0], 50.0, (0.05, 1.0, 10.0)),
        ([0, 0, 49, 1, 40, 9, 1, 0, 0], 50.0, (0.1, 1.0, 10.0)),  # the 50th is in the next bucket
        ([0, 0, 49, 2, 38, 10, 1, 0, 0], 50.0, (0.1, 10.0, 10.0)),  # the 90th too
        ([0, 0, 0, 0, 0, 0, 0, 99, 1], 4000.0, (3600.0, 3600.0, 3600.0)),
        ([0, 0, 0, 0, 0, 0, 0, 98, 2], 4000.0, (3600.0, 3600.0, 4000.0)),  # the +Inf bucket: the max
        # 7 requests: nearest rank 4, 7 and 7 (ceil(0.9 * 7) = 7).
        ([1, 1, 1, 1, 1, 1, 1, 0, 0], 100.0, (0.1, 100.0, 100.0)),
        # A bound above the exact maximum is never shown: the slowest of five requests in
        # (10, 100] took 15 s, so no percentile reads 100 s.
        ([0, 0, 0, 0, 0, 0, 5, 0, 0], 15.0, (15.0, 15.0, 15.0)),
        ([1, 1, 1, 1, 1, 1, 1, 0, 0], 90.0, (0.1, 90.0, 90.0)),
        ([0] * 9, 0.0, (None, None, None)),  # nothing finished
    ],
)
def test_percentiles_are_the_upper_bound_of_the_bucket_the_rank_falls_in(
    store: Store, tmp_path: Path, counts: list[int], max_s: float, expected: tuple[float | None, ...]
) -> None:
    inst = instance(store, tmp_path)
    write(inst.log_path, document(duration_seconds=histogram(counts), duration_max_s=max_s))
    traffic.import_instances(store, [inst])
    (row,) = summary(tmp_path, "duration_p50_s, duration_p90_s, duration_p99_s, duration_max_s")
    assert (row["duration_p50_s"], row["duration_p90_s"], row["duration_p99_s"]) == expected
    assert row["duration_max_s"] == max_s


def test_every_host_shows_its_instances_and_an_instance_without_figures_reads_null(tmp_path: Path) -> None:
    for host, requests in (("node-a", 10), ("node-b", 7)):
        with Store.open(tmp_path, host=host) as store:
            inst = instance(store, tmp_path, run_id=f"run-{host}")
            write(inst.log_path, document(requests=requests))
            traffic.import_instances(store, [inst])
            instance(store, tmp_path, run_id=f"run-{host}", name="gymbinary", pid=5)
    rows = summary(tmp_path, "host, run_id, name, requests, as_of IS NULL AS none")
    assert rows == [
        {"host": "node-a", "run_id": "run-node-a", "name": "gymbinary", "requests": None, "none": 1},
        {"host": "node-a", "run_id": "run-node-a", "name": "policy", "requests": 10, "none": 0},
        {"host": "node-b", "run_id": "run-node-b", "name": "gymbinary", "requests": None, "none": 1},
        {"host": "node-b", "run_id": "run-node-b", "name": "policy", "requests": 7, "none": 0},
    ]


def test_the_reads_of_history_and_status_and_prune_deleting_the_rows(store: Store, tmp_path: Path) -> None:
    inst = instance(store, tmp_path)
    write(inst.log_path, document(final=True))
    traffic.import_instances(store, [inst])
    (shown,) = view_traffic.instance_traffic(store, "run1").values()
    assert (shown["name"], shown["requests"], shown["responses_502"], shown["final"]) == ("policy", 10, 2, 1)
    assert (shown["ttfb_p50_s"], shown["ttfb_p99_s"], shown["duration_p99_s"], shown["duration_max_s"]) == (
        0.05,
        0.05,
        512.25,  # the bucket's bound is 3600 s; no percentile reads above the exact maximum
        512.25,
    )
    assert view_traffic.traffic_json(shown)["upstream_errors"] == document()["upstream_errors"]
    assert view_traffic.run_totals([store]) == {"run1": (10, 2)}
    store.end_run("run1", "ended")
    assert [record.id for record in store.delete_ended_run("run1")] == [inst.id]
    assert view_traffic.run_totals([store]) == {} and store.traffic_pids(inst.id) == set()


def test_a_database_full_or_gone_never_breaks_the_import(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = instance(store, tmp_path)
    write(inst.log_path, document())
    store.close()
    traffic.import_instances(store, [inst])  # a closed connection: every statement fails
    assert capsys.readouterr().err.startswith(f"WARNING: traffic figures not recorded in {store.path}: ")


# -- the files and the flags --------------------------------------------------------------------


def test_an_instances_files_share_its_stem_and_rotations_are_found(tmp_path: Path) -> None:
    log = str(tmp_path / "h2ping-policy-unit-run1.log")
    ready = sibling(log, ".ready")
    assert ready == str(tmp_path / "h2ping-policy-unit-run1.ready")
    assert (
        sibling(ready, ".traffic.json") == traffic.traffic_path(log) == log[: -len(".log")] + ".traffic.json"
    )
    names = [
        "h2ping-policy-unit-run1.log",
        "h2ping-policy-unit-run1.log.1",
        "h2ping-policy-unit-run1.log.12",
        "h2ping-policy-unit-run1.ready",
        "h2ping-policy-unit-run1.traffic.json",
        ".h2ping-policy-unit-run1.traffic.json.tmp-1234",
        "h2ping-policy-unit-run1.access.log",
        "h2ping-policy-unit-run1.access.log.3",
    ]
    others = [
        "h2ping-policy-unit-run1.log.old",
        "h2ping-policy-unit-run10.log",
        "h2ping-policy-unit-run1.log.1x",
    ]
    for name in names + others:
        (tmp_path / name).write_text("x")
    assert sorted(Path(path).name for path in instance_files(log, ready)) == sorted(names)


def _config(**block: Any) -> H2PingSidecarConfig:
    return H2PingSidecarConfig(enabled=True, instances=[{"upstream": "https://api.example.com"}], **block)


def test_our_binary_gets_the_traffic_file_and_log_flags_and_gyms_gets_none() -> None:
    config = _config(log_max_bytes="1MiB", log_backups=2)
    command = sidecar_command("/bin/h2", config, config.instances[0], "/logs/h2ping-a-h-r.ready")
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["-traffic-file"] == "/logs/h2ping-a-h-r.traffic.json"
    assert (flags["-log-file"], flags["-log-max-bytes"], flags["-log-backups"]) == (
        "/logs/h2ping-a-h-r.log",
        "1048576",
        "2",
    )
    assert "-access-log" not in command
    logged = _config(access_log=True)
    command = sidecar_command("/bin/h2", logged, logged.instances[0], "/logs/h2ping-a-h-r.ready")
    assert command[command.index("-access-log") + 1] == "/logs/h2ping-a-h-r.access.log"
    gym = BinaryFlags("/gym/h2", GYM_FLAGS, GYM_FLAGS - {"insecure-skip-verify"}, False)
    assert not {"-traffic-file", "-log-file", "-log-max-bytes", "-log-backups"} & set(
        filter_command(command, gym)
    )
    assert refusals(config, config.instances, gym) == []
    assert refusals(logged, logged.instances, gym) == [
        "sidecar.access_log: 'true' cannot be passed to '/gym/h2', which has no -access-log flag; "
        "drop access_log, or leave sidecar.binary unset to use sidecar-fsm's proxy"
    ]
    assert issubclass(ConfigError, ValueError)


# -- where a person looks -----------------------------------------------------------------------


def shown_row(
    requests: int,
    bad: int,
    errors: dict[str, int],
    seconds: tuple[float | None, ...],
    final: int,
    processes: int,
) -> dict[str, Any]:
    """The ``traffic_summary`` columns ``history`` shows (ttfb p50/p99, duration p99/max in ``seconds``)."""
    ttfb_p50, ttfb_p99, duration_p99, duration_max = seconds
    return {
        "name": "policy",
        "requests": requests,
        "responses_502": bad,
        **{f"upstream_errors_{kind}": count for kind, count in errors.items()},
        "ttfb_p50_s": ttfb_p50,
        "ttfb_p99_s": ttfb_p99,
        "duration_p99_s": duration_p99,
        "duration_max_s": duration_max,
        "as_of": "2026-12-01T20:05:30.000Z",
        "final": final,
        "processes": processes,
    }


def test_history_ends_with_a_traffic_line_per_instance_and_status_all_sums_each_run() -> None:
    from test_render import NOW, two_instance_status

    from sidecar_fsm.state.store import TransitionRecord
    from sidecar_fsm.view import render

    errors = {"dial": 0, "tls": 0, "alpn": 0, "ping_timeout": 2, "reset": 1, "other": 0}
    policy = shown_row(600, 3, errors, (0.05, 296.0, 514.0, 854.25), final=1, processes=2)
    status = two_instance_status()
    rows = [("policy", TransitionRecord(1, 1, "configured", "building", "build", NOW, None))]
    lines = render.history_lines(status.run, rows, status=status, traffic={"policy": policy})
    assert lines[-2:] == [
        "traffic policy: 600 requests, 3 502s, ttfb p50 50ms p99 296s, duration p99 514s max 854s, "
        "upstream failures ping_timeout 2, reset 1 (per connection, the start's check included), final",
        "traffic judge: none recorded",
    ]
    live = shown_row(1, 0, dict.fromkeys(errors, 0), (None, None, None, 0.0), final=0, processes=1)
    line = render.history_lines(status.run, rows, status=status, traffic={"policy": live})[-2]
    assert line == (
        "traffic policy: 1 requests, 0 502s, ttfb p50 - p99 -, duration p99 - max 0ms, "
        "as of 2026-12-01T20:05:30.000Z"
    )
    document = json.loads(render.history_json(status.run, rows, status=status, traffic={"policy": policy}))
    assert [inst["traffic"] and inst["traffic"]["responses_502"] for inst in document["instances"]] == [
        3,
        None,
    ]

    ended = dataclasses.replace(
        status, run=dataclasses.replace(status.run, ended_at=NOW - 10, outcome="ended")
    )
    table = render.status_lines(
        [ended], now=NOW, ended_in_one_table=True, traffic={ended.run.run_id: (600, 3)}
    )
    assert table[0].split()[-1] == "TRAFFIC" and table[1].endswith("600 requests, 3 502s")
    document = json.loads(render.status_json([ended], traffic={}))
    assert document["runs"][0]["traffic"] is None


def test_the_poll_loop_imports_at_most_once_a_minute_and_not_after_stop(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from sidecar_fsm.run.children import Child, SidecarRun

    inst = instance(store, tmp_path)
    config = _config()
    run = SidecarRun(config, config.instances, "/b", str(tmp_path), store=store, run_id="run1")
    run.started = True
    machine = InstanceMachine(store, inst.id, "ready")
    process: Any = SimpleNamespace(pid=4242)
    run.children = [Child(0, config.instances[0], machine, inst.log_path, "", "127.0.0.1:0", process=process)]
    clock = [1000.0]
    monkeypatch.setattr(traffic, "_clock", lambda: clock[0])

    def imported(requests: int, minute: int) -> int:
        as_of = f"2026-12-01T20:{minute:02d}:00.000Z"
        write(inst.log_path, document(requests=requests, as_of=as_of))
        traffic.poll(run)
        (row,) = summary(tmp_path, "requests")
        return int(row["requests"])

    traffic.poll(run)  # before the proxy's first file: looked for again a second later
    assert summary(tmp_path, "requests") == [{"requests": None}]
    clock[0] += traffic.RETRY_SECONDS
    assert imported(1, 1) == 1
    clock[0] += traffic.POLL_SECONDS - 1
    assert imported(2, 2) == 1  # within the minute: Gym's poll loop calls every few seconds
    clock[0] += 1
    assert imported(3, 3) == 3
    clock[0] += traffic.POLL_SECONDS
    run.stopped = True
    assert imported(4, 4) == 3  # stop imported the final figures; nothing after it
