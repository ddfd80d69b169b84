"""The start's upstream verdicts: their words, and the wait against a GET /upstream that answers.

A threaded loopback HTTP server stands in for a proxy's metrics listener (no child process);
the real proxy is tests/integration/test_upstream_check.py's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sidecar_fsm.run.upcheck import CONSEQUENCE, CheckTarget, Verdict, await_verdicts, waiting_line

UP = "https://api.example.com"

LINES = [
    (Verdict("a", UP, "ok", None, 0.0123), f"a upstream {UP} ok: TLS and HTTP/2 in 0.012s"),
    (
        Verdict("a", UP, "ok", None, 0.034, 0.0021),
        f"a upstream {UP} ok: TLS and HTTP/2 in 0.034s, PING answered in 0.002s",
    ),
    (
        Verdict(
            "a",
            UP,
            "failed",
            "PING not answered within 10s: PINGs cannot keep this path open",
            0.03,
            None,
            True,
        ),
        f"a upstream {UP} failed: TLS and HTTP/2 in 0.030s, but PING not answered within 10s: "
        "PINGs cannot keep this path open",
    ),
    (
        Verdict("a", UP, "failed", "dial tcp 1.2.3.4:443: connect: connection refused", 0.001),
        f"a upstream {UP} failed: dial tcp 1.2.3.4:443: connect: connection refused; {CONSEQUENCE}",
    ),
    (
        Verdict("a", UP, "no verdict"),
        f"a upstream {UP}: no verdict within 2.5s (upstream_check_seconds); {CONSEQUENCE}",
    ),
    (Verdict("a", UP, "not checked", "metrics: false"), "a upstream not checked (metrics: false)"),
]


@pytest.mark.parametrize(("verdict", "line"), LINES)
def test_each_outcome_is_one_line(verdict: Verdict, line: str) -> None:
    assert verdict.line(2.5) == line
    assert verdict.failed == (verdict.outcome in ("failed", "no verdict"))


class _Proxy(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict[str, Any]]] = []
    asked = 0
    delay = 0.0  # seconds before each answer: a proxy on a node with every core busy

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        assert self.path.split("?")[0] == "/upstream"
        cls = type(self)
        time.sleep(cls.delay)  # the slow proxy itself, not a wait for an event
        status, document = cls.answers[min(cls.asked, len(cls.answers) - 1)]
        cls.asked += 1
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[tuple[str, type[_Proxy]]]:
    handler = type("Handler", (_Proxy,), {"answers": [], "asked": 0, "delay": 0.0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_wait_asks_until_the_check_has_a_verdict(proxy: tuple[str, type[_Proxy]]) -> None:
    address, handler = proxy
    error = "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    handler.answers = [(200, {"checked": False})] * 3 + [
        (200, {"checked": True, "ok": False, "error": error, "seconds": 0.004})
    ]
    (verdict,) = await_verdicts([CheckTarget("a", UP, address)], timeout=5)
    assert verdict == Verdict("a", UP, "failed", error, 0.004)
    assert handler.asked == 4


def test_a_proxy_without_the_endpoint_is_not_checked_and_none_without_metrics(
    proxy: tuple[str, type[_Proxy]],
) -> None:
    address, handler = proxy
    handler.answers = [(404, {})]
    started = time.monotonic()
    old, plain = await_verdicts(
        [CheckTarget("old", UP, address), CheckTarget("plain", UP, None, "its binary serves no metrics")],
        timeout=5,
    )
    assert time.monotonic() - started < 2
    assert old.outcome == "not checked" and "no GET /upstream" in str(old.error)
    assert plain == Verdict("plain", UP, "not checked", "its binary serves no metrics")


def test_no_verdict_at_the_deadline_for_all_at_once(proxy: tuple[str, type[_Proxy]]) -> None:
    address, handler = proxy
    handler.answers = [(200, {"checked": False})]
    started = time.monotonic()
    verdicts = await_verdicts([CheckTarget(f"s{i}", UP, address) for i in range(4)], timeout=0.5)
    took = time.monotonic() - started
    assert [v.outcome for v in verdicts] == ["no verdict"] * 4
    assert 0.5 <= took < 1.5, took  # one wait for all four, not four


def test_a_ping_still_out_at_the_deadline_fails_in_its_own_words(proxy: tuple[str, type[_Proxy]]) -> None:
    address, handler = proxy
    handler.answers = [
        (200, {"checked": True, "ok": True, "error": None, "seconds": 0.003, "ping": None})
    ] + [(200, {"checked": True, "ok": True, "error": None, "seconds": 0.003, "ping": "pending"})]
    (verdict,) = await_verdicts([CheckTarget("a", UP, address)], timeout=0.5)
    assert verdict == Verdict(
        "a",
        UP,
        "failed",
        "PING not answered within 0.5s: PINGs cannot keep this path open",
        0.003,
        None,
        True,
    )
    assert verdict.failed
    assert verdict.reason(0.5) == (
        f"upstream {UP} failed its check: PING not answered within 0.5s: PINGs cannot keep this path open"
    )


def test_an_answered_ping_and_a_goaway_are_verdicts(proxy: tuple[str, type[_Proxy]]) -> None:
    address, handler = proxy
    dialled = {"checked": True, "ok": True, "error": None, "seconds": 0.004}
    handler.answers = [
        (200, {**dialled, "ping": "pending"}),
        (200, {**dialled, "ping": "answered", "ping_rtt_seconds": 0.002}),
    ]
    (ok,) = await_verdicts([CheckTarget("a", UP, address)], timeout=5)
    assert ok == Verdict("a", UP, "ok", None, 0.004, 0.002)
    words = "GOAWAY ENHANCE_YOUR_CALM answered the PING: the upstream refuses PINGs this often; try 120s"
    handler.answers, handler.asked = [(200, {**dialled, "ping": "goaway", "ping_error": words})], 0
    (calm,) = await_verdicts([CheckTarget("a", UP, address)], timeout=5)
    assert calm == Verdict("a", UP, "failed", words, 0.004, None, True)


def test_the_wait_says_once_when_it_passes_the_notice(
    proxy: tuple[str, type[_Proxy]], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, handler = proxy
    handler.answers = [(200, {"checked": False})]
    monkeypatch.setattr("sidecar_fsm.run.upcheck.SLOW_NOTICE_SECONDS", 0.2)
    said: list[list[str]] = []
    verdicts = await_verdicts([CheckTarget("a", UP, address), CheckTarget("b", UP, None)], 0.6, said.append)
    assert said == [["a"]]  # b has its answer at once (not checked), a is still awaited
    assert waiting_line(["a"], 10) == "waiting up to 10s (upstream_check_seconds) for the upstream check of a"
    assert [v.outcome for v in verdicts] == ["no verdict", "not checked"]
    quick: list[list[str]] = []
    handler.answers, handler.asked = [(200, {"checked": True, "ok": True, "seconds": 0.001})], 0
    await_verdicts([CheckTarget("a", UP, address)], 0.6, quick.append)
    assert quick == []  # answered before the notice: nothing said


def test_an_ask_cut_short_by_the_deadline_is_not_reported_as_the_proxys_fault(
    proxy: tuple[str, type[_Proxy]],
) -> None:
    """A slow proxy (0.4 s an answer) and a 0.5-s check: the last ask has a few milliseconds
    left and times out. That is the deadline, not the proxy: "no verdict", with no "last:
    timed out" sending the user to look at a healthy metrics listener."""
    address, handler = proxy
    handler.answers, handler.delay = [(200, {"checked": False})], 0.4
    (verdict,) = await_verdicts([CheckTarget("a", UP, address)], timeout=0.5)
    assert verdict == Verdict("a", UP, "no verdict", None)


def test_a_listener_that_answers_no_ask_in_its_own_time_is_reported(
    proxy: tuple[str, type[_Proxy]],
) -> None:
    address, handler = proxy
    handler.answers, handler.delay = [(200, {"checked": False})], 2.5
    (verdict,) = await_verdicts([CheckTarget("a", UP, address)], timeout=2.0)
    assert verdict.outcome == "no verdict"
    assert verdict.error == f"metrics listener {address}: timed out"
