"""live and its rendering: the proxy's /metrics text to figures, the status columns and JSON, and
a scrape that never waits past its deadline (a listener that accepts and never answers)."""

from __future__ import annotations

import dataclasses
import json
import socket
import time

import pytest

from sidecar_fsm.observe.verdicts import Process
from sidecar_fsm.state.store import InstanceRecord, RunRecord
from sidecar_fsm.view import live, render
from sidecar_fsm.view import status as view_status
from sidecar_fsm.view.live import Figures, Scrape

NOW = 1_800_000_000.0  # a fixed "now" so relative times are exact

# GET /metrics of a real h2-ping-sidecar whose start-up dial was refused, one request waiting.
PROXY_TEXT = """\
# HELP h2ping_requests_in_flight Client requests received and not yet answered in full.
# TYPE h2ping_requests_in_flight gauge
h2ping_requests_in_flight 1
# HELP h2ping_oldest_request_age_seconds Age of the oldest request in flight (0 when idle).
# TYPE h2ping_oldest_request_age_seconds gauge
h2ping_oldest_request_age_seconds 125.5
# HELP h2ping_requests_total Client requests received.
# TYPE h2ping_requests_total counter
h2ping_requests_total 7
# HELP h2ping_responses_total Responses completed to clients, by status code.
# TYPE h2ping_responses_total counter
h2ping_responses_total{code="200"} 6
# HELP h2ping_upstream_connections Upstream HTTP/2 connections open.
# TYPE h2ping_upstream_connections gauge
h2ping_upstream_connections 0
# HELP h2ping_upstream_dials_total Upstream connections dialled (TCP, TLS, ALPN h2), by result.
# TYPE h2ping_upstream_dials_total counter
h2ping_upstream_dials_total{result="ok"} 0
h2ping_upstream_dials_total{result="error"} 4
# HELP h2ping_upstream_errors_total Upstream failures, by kind (dial, tls, alpn, ping_timeout, reset, other).
# TYPE h2ping_upstream_errors_total counter
h2ping_upstream_errors_total{kind="dial"} 3
h2ping_upstream_errors_total{kind="tls"} 1
h2ping_upstream_errors_total{kind="alpn"} 0
h2ping_upstream_errors_total{kind="ping_timeout"} 0
h2ping_upstream_errors_total{kind="reset"} 0
h2ping_upstream_errors_total{kind="other"} 0
# HELP h2ping_upstream_up 1 after a successful upstream dial or response, 0 after a failure.
# TYPE h2ping_upstream_up gauge
h2ping_upstream_up 0
# HELP h2ping_pings_sent_total HTTP/2 PING frames sent upstream.
# TYPE h2ping_pings_sent_total counter
h2ping_pings_sent_total 14
# HELP h2ping_ping_acks_total HTTP/2 PING acknowledgements received for them.
# TYPE h2ping_ping_acks_total counter
h2ping_ping_acks_total 13
# HELP h2ping_ping_rtt_seconds Round trip of the last acknowledged PING (0 before the first).
# TYPE h2ping_ping_rtt_seconds gauge
h2ping_ping_rtt_seconds 0.0021
"""


def figures(**overrides: object) -> Figures:
    return dataclasses.replace(live.parse(PROXY_TEXT), **overrides)  # type: ignore[arg-type]


def instance_record(id: int, name: str, metrics: str | None) -> InstanceRecord:
    return InstanceRecord(
        id=id,
        run_id="4c1e9a3f2b10",
        name=name,
        listen=f"127.0.0.1:{1249 + id}",
        upstream="https://api.example.com",
        state="ready",
        state_since=NOW - 192,
        pid=41029 + id,
        pid_start_time=NOW - 193,
        binary="/cache/h2-ping-sidecar",
        log_path=None,
        ready_path=None,
        exit_code=None,
        error=None,
        restart_count=0,
        metrics=metrics,
    )


def test_parse_reads_the_figures_status_shows() -> None:
    found = live.parse(PROXY_TEXT)
    assert (found.requests_in_flight, found.oldest_request_age_seconds, found.requests_total) == (1, 125.5, 7)
    assert (found.pings_sent, found.ping_acks, found.ping_rtt_seconds) == (14, 13, 0.0021)
    assert (found.upstream_up, found.upstream_connections) == (False, 0)
    assert found.upstream_errors == {
        "dial": 3,
        "tls": 1,
        "alpn": 0,
        "ping_timeout": 0,
        "reset": 0,
        "other": 0,
    }
    assert found.errors_counted() == {"dial": 3, "tls": 1}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<html>not metrics</html>\n", None),
        (PROXY_TEXT.replace("h2ping_pings_sent_total 14\n", ""), "no h2ping_pings_sent_total in the answer"),
        ("", "no h2ping_requests_in_flight in the answer"),
    ],
)
def test_parse_refuses_what_is_not_the_proxys_answer(text: str, reason: str | None) -> None:
    with pytest.raises(ValueError) as refused:
        live.parse(text)
    if reason is not None:
        assert str(refused.value) == reason


def status_with(scrapes: dict[int, Scrape]) -> view_status.RunStatus:
    return view_status.RunStatus(
        run=RunRecord("4c1e9a3f2b10", "node7", 41022, NOW - 501, NOW - 500, None, None, {}),
        owner="alive",
        instances=[
            instance_record(1, "policy", "127.0.0.1:9101"),
            instance_record(2, "judge", "127.0.0.1:9102"),
            instance_record(3, "nometrics", None),
        ],
        processes={
            1: Process.RUNNING,
            2: Process.RUNNING,
            3: Process.RUNNING,
        },
        live=scrapes,
    )


def test_status_table_shows_the_figures_and_no_answer() -> None:
    up = figures(upstream_up=True, upstream_errors={}, ping_acks=14)
    status = status_with({1: Scrape("127.0.0.1:9101", up), 2: Scrape("127.0.0.1:9102", None, live.NO_ANSWER)})
    lines = render.status_lines([status], now=NOW)
    header, policy, judge, plain = lines[2:6]
    assert "IN FLIGHT" in header and "PINGS SENT/ACKED" in header

    def column(line: str, name: str) -> str:
        # After SINCE: "LISTEN → UPSTREAM" also holds the word UPSTREAM.
        return line[header.index(name, header.index("SINCE")) :].split("  ")[0]

    assert [column(policy, name) for name in render.LIVE_HEADERS] == ["1", "2m05s", "14/14", "up"]
    assert [column(judge, name) for name in render.LIVE_HEADERS] == ["no answer", "-", "-", "-"]
    assert judge[header.index("DETAIL") :] == "/metrics at 127.0.0.1:9102: no answer"
    assert [column(plain, name) for name in render.LIVE_HEADERS] == ["-", "-", "-", "-"]
    # Down: the error counts by kind, since the proxy exposes no error text.
    down = render.status_lines([status_with({1: Scrape("a:1", figures())})], now=NOW)
    assert column(down[3], "UPSTREAM") == "down: dial 3, tls 1"
    # Down with the proxy's words for its last error: they go to DETAIL, not the column.
    words = "dial tcp 127.0.0.1:1: connect: connection refused"
    reason = render.status_lines([status_with({1: Scrape("a:1", figures(upstream_error=words))})], now=NOW)
    assert column(reason[3], "UPSTREAM") == "down: dial 3, tls 1"
    assert reason[3].endswith(f"upstream: {words}")
    # Up: an old error's words are not shown.
    up = status_with({1: Scrape("a:1", figures(upstream_up=True, upstream_error=words))})
    assert "connection refused" not in "\n".join(render.status_lines([up], now=NOW))
    # Idle: no oldest age to speak of.
    idle = status_with({1: Scrape("a:1", figures(requests_in_flight=0, oldest_request_age_seconds=0.0))})
    assert column(render.status_lines([idle], now=NOW)[3], "OLDEST") == "-"


def test_a_proxy_before_its_first_upstream_check_is_not_down() -> None:
    """The gauge is 0 until the first dial: a status taken a moment after the ready file (before
    the check the proxy starts 200 ms later) must not call a healthy upstream down."""
    pending = status_with({1: Scrape("a:1", figures(upstream_errors={}, upstream_unchecked=True))})
    assert view_status.needs_attention(pending) is None
    line = render.status_lines([pending], now=NOW)[3]
    assert "not checked yet" in line and "down" not in line
    failed = status_with({1: Scrape("a:1", figures(upstream_errors={"dial": 1}))})
    assert view_status.needs_attention(failed) == "policy: upstream https://api.example.com is down"


def test_runs_with_nothing_scraped_keep_the_plain_table() -> None:
    lines = render.status_lines([status_with({})], now=NOW)
    assert lines[2].split() == ["NAME", "STATE", "PID", "LISTEN", "→", "UPSTREAM", "SINCE", "DETAIL"]


def test_status_json_live_object() -> None:
    status = status_with(
        {1: Scrape("127.0.0.1:9101", figures()), 2: Scrape("127.0.0.1:9102", None, "no answer")}
    )
    policy, judge, plain = json.loads(render.status_json([status]))["runs"][0]["instances"]
    assert policy["metrics"] == "127.0.0.1:9101"
    assert policy["live"] == {
        "metrics": "127.0.0.1:9101",
        "answered": True,
        "problem": None,
        "requests_in_flight": 1,
        "oldest_request_age_seconds": 125.5,
        "requests_total": 7,
        "pings_sent": 14,
        "ping_acks": 13,
        "ping_rtt_seconds": 0.0021,
        "upstream_up": False,
        "upstream_connections": 0,
        "upstream_errors": {"dial": 3, "tls": 1, "alpn": 0, "ping_timeout": 0, "reset": 0, "other": 0},
        "upstream_error": None,
    }
    assert judge["live"]["answered"] is False and judge["live"]["problem"] == "no answer"
    assert judge["live"]["requests_in_flight"] is None and judge["live"]["upstream_errors"] is None
    assert plain["metrics"] is None and plain["live"] is None


def test_status_json_names_the_upstream_error_only_while_down() -> None:
    words = "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    down = status_with({1: Scrape("127.0.0.1:9101", figures(upstream_error=words))})
    up = status_with({1: Scrape("127.0.0.1:9101", figures(upstream_up=True, upstream_error=words))})
    assert (
        json.loads(render.status_json([down]))["runs"][0]["instances"][0]["live"]["upstream_error"] == words
    )
    assert json.loads(render.status_json([up]))["runs"][0]["instances"][0]["live"]["upstream_error"] is None


def test_top_frame_has_a_heading_and_the_table() -> None:
    status = status_with({1: Scrape("127.0.0.1:9101", figures())})
    lines = render.top_lines([status], where="/logs", interval=2, now=NOW)
    assert lines[0].startswith("sidecar-fsm top: 1 live run in /logs, ") and lines[0].endswith(
        ", every 2s; Ctrl-C to quit"
    )
    assert lines[2:] == render.status_lines([status], now=NOW)
    assert render.top_lines([], where="/logs", interval=0.5, now=NOW)[2] == (
        "no live runs (start one: sidecar-fsm start)"
    )


def test_scrape_all_answers_every_key_by_its_deadline() -> None:
    """A listener that accepts (the kernel does) and never answers, and a closed port."""
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        addresses = {
            "silent": f"127.0.0.1:{silent.getsockname()[1]}",
            "closed": f"127.0.0.1:{closed.getsockname()[1]}",
            "garbled": "no-port-here",
        }
        started = time.monotonic()
        scrapes = live.scrape_all(addresses, timeout=0.3)
        took = time.monotonic() - started
    assert took < 1.0, took
    assert scrapes["silent"] == Scrape(addresses["silent"], None, live.NO_ANSWER)
    assert scrapes["closed"].figures is None
    assert scrapes["closed"].problem == "no answer: connection refused"
    assert scrapes["garbled"].problem == "recorded metrics address 'no-port-here' is not host:port"
