"""The start's upstream check: each proxy's first upstream dial, awaited and put in words.

Right after its ready file a proxy dials its upstream once, sends one PING on that connection and
keeps the verdict at ``GET /upstream`` on its metrics listener (go/upcheck.go, go/procmetrics.go). A
path that passes TLS and HTTP/2 but answers no PING fails: every long wait through it would be
cut at the PING timeout. Every proxy is awaited at once against one deadline, so four unreachable
upstreams cost one wait, not four. What a failure means for the start is the caller's decision.
Only reads loopback HTTP: starts, signals and records nothing. A proxy without a metrics listener
(``metrics: false``, NeMo Gym's binary) is "not checked", never an error.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from sidecar_fsm.base import fanout

__all__ = ["CheckTarget", "Verdict", "await_verdicts", "waiting_line"]

# Between two asks of one proxy that answered at once (a build without ``?wait``, or one whose
# listener failed): a faster poll only costs CPU the proxies are starting on.
POLL_SECONDS = 0.025
# How long one ask lets the proxy hold its answer until its check ends (``?wait``): the verdict
# comes when known, not at the next poll (a proxy that ignores it answers at once, and is polled).
_WAIT_SECONDS = 0.5
# One ask's own limit beyond that hold: a proxy that does not answer its metrics listener in
# time is asked again (until the deadline) rather than holding the wait.
_ASK_TIMEOUT_SECONDS = 1.0
_MAX_BODY_BYTES = 64 * 1024
# What a client of a sidecar sees while its upstream does not answer (proxy.go's 502 body).
CONSEQUENCE = "requests will get 502 until it answers"
# A wait this long is said (``on_slow``), so a start that waits up to upstream_check_seconds for
# an upstream that does not answer does not look hung.
SLOW_NOTICE_SECONDS = 2.0

Outcome = Literal["ok", "failed", "no verdict", "not checked"]


@dataclass(frozen=True)
class CheckTarget:
    """One instance to check: its name and upstream (for the words), its metrics address
    (None: nothing to ask) and, when None, why (``metrics: false``, or a binary without it)."""

    name: str
    upstream: str
    metrics: str | None
    unchecked_because: str = "metrics: false"

    def verdict(
        self,
        outcome: Outcome,
        error: str | None = None,
        seconds: float | None = None,
        ping_seconds: float | None = None,
        *,
        ping_failed: bool = False,
    ) -> Verdict:
        return Verdict(self.name, self.upstream, outcome, error, seconds, ping_seconds, ping_failed)


@dataclass(frozen=True)
class Verdict:
    """How one instance's first upstream check ended, as its proxy reported it.

    ``ok``: dialled (TCP, TLS, ALPN h2) in ``seconds`` and its PING answered in ``ping_seconds``
    (None: a proxy too old to send one). ``failed``: ``error`` is the proxy's own one-line words;
    with ``ping_failed`` the dial worked and the PING did not (unanswered, a GOAWAY, a close).
    ``no verdict``: none before the deadline (``error`` says what was seen last, if anything).
    ``not checked``: the proxy cannot say (``error`` says why).
    """

    name: str
    upstream: str
    outcome: Outcome
    error: str | None = None
    seconds: float | None = None
    ping_seconds: float | None = None
    ping_failed: bool = False

    @property
    def failed(self) -> bool:
        """True when ``upstream_check: fail`` must fail the start for this instance."""
        return self.outcome in ("failed", "no verdict")

    def line(self, timeout: float) -> str:
        """The start's one line for this instance (without host or run: the caller adds them)."""
        head = f"{self.name} upstream {self.upstream}"
        if self.outcome == "ok":
            ping = f", PING answered in {self.ping_seconds:.3f}s" if self.ping_seconds is not None else ""
            return f"{head} ok: TLS and HTTP/2 in {self.seconds or 0.0:.3f}s{ping}"
        if self.ping_failed:
            return f"{head} failed: TLS and HTTP/2 in {self.seconds or 0.0:.3f}s, but {self.error}"
        if self.outcome == "failed":
            return f"{head} failed: {self.error}; {CONSEQUENCE}"
        if self.outcome == "no verdict":
            seen = f" (last: {self.error})" if self.error else ""
            return f"{head}: no verdict within {timeout:g}s (upstream_check_seconds){seen}; {CONSEQUENCE}"
        return f"{self.name} upstream not checked ({self.error})"

    def reason(self, timeout: float) -> str:
        """Why ``upstream_check: fail`` failed the start, for the error's first line."""
        if self.outcome == "failed":
            return f"upstream {self.upstream} failed its check: {self.error}"
        return f"upstream {self.upstream} gave no verdict within {timeout:g}s (upstream_check_seconds)"


class _NotAnswered(Exception):
    """No verdict this time; the text says what happened instead. ``no_endpoint``: the proxy has
    no ``GET /upstream`` (an older build), so asking again cannot help."""

    def __init__(self, words: str, *, timed_out: bool = False, no_endpoint: bool = False) -> None:
        super().__init__(words)
        self.timed_out = timed_out
        self.no_endpoint = no_endpoint


@dataclass(frozen=True)
class _Answer:
    """One ``GET /upstream``: the dial's verdict and the PING's (``ping`` None: none sent yet;
    ``has_ping`` False: a proxy that sends none)."""

    checked: bool
    ok: bool
    error: str | None
    seconds: float | None
    has_ping: bool
    ping: str | None
    ping_seconds: float | None
    ping_error: str | None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _ask(address: str, timeout: float, wait: float = 0.0) -> _Answer:
    """GET /upstream once, letting the proxy hold the answer up to ``wait`` seconds until its
    check ends. Raises ``_NotAnswered``."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise _NotAnswered(f"recorded metrics address '{address}' is not host:port")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout + wait)
    try:
        conn.request("GET", f"/upstream?wait={int(wait * 1000)}ms" if wait > 0 else "/upstream")
        response = conn.getresponse()
        body = response.read(_MAX_BODY_BYTES)
        if response.status == 404:
            raise _NotAnswered("the proxy has no GET /upstream (an older build)", no_endpoint=True)
        if response.status != 200:
            raise _NotAnswered(f"GET /upstream answered HTTP {response.status}")
        document = json.loads(body)
        if not isinstance(document, dict):
            raise _NotAnswered("GET /upstream answered no JSON object")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        words = f"metrics listener {address}: {exc or type(exc).__name__}"
        raise _NotAnswered(words, timed_out=isinstance(exc, TimeoutError)) from None
    finally:
        conn.close()
    return _Answer(
        bool(document.get("checked")),
        bool(document.get("ok")),
        _text(document.get("error")),
        _number(document.get("seconds")),
        "ping" in document,
        _text(document.get("ping")),
        _number(document.get("ping_rtt_seconds")),
        _text(document.get("ping_error")),
    )


def ping_unanswered(timeout: float) -> str:
    """The words of a PING still unanswered at the start's deadline."""
    return f"PING not answered within {timeout:g}s: PINGs cannot keep this path open"


def _wait_one(target: CheckTarget, deadline: float, timeout: float) -> Verdict:
    """Ask ``target`` until it has a verdict or ``deadline`` (monotonic) passes. A dial that
    worked with its PING still out then is a failure, not "no verdict": only the PING failed."""
    assert target.metrics is not None
    last: str | None = None
    dialled: _Answer | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if dialled is not None:
                return target.verdict("failed", ping_unanswered(timeout), dialled.seconds, ping_failed=True)
            return target.verdict("no verdict", last)
        wait = min(_WAIT_SECONDS, max(0.0, remaining - 0.05))
        asked = time.monotonic()
        budget = min(remaining, _ASK_TIMEOUT_SECONDS)
        try:
            answer = _ask(target.metrics, budget, wait)
        except _NotAnswered as exc:
            # An ask cut short by the start's own deadline timed out because the time was up,
            # not because the proxy failed (the busy node's last ask often does): said as
            # "last: timed out", it would send the user looking at a healthy listener.
            if not (exc.timed_out and budget < _ASK_TIMEOUT_SECONDS):
                last = str(exc)
            if exc.no_endpoint:
                return target.verdict("not checked", str(exc))
        else:
            verdict = _verdict_of(target, answer)
            if verdict is not None:
                return verdict
            if answer.checked and answer.ok:
                dialled = answer
            if time.monotonic() - asked >= wait / 2:
                continue  # the proxy held the answer: no need to sleep before asking again
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))


def _verdict_of(target: CheckTarget, answer: _Answer) -> Verdict | None:
    """The verdict ``answer`` gives, or None while the dial or its PING is still out."""
    if not answer.checked:
        return None
    if not answer.ok:
        return target.verdict("failed", answer.error or None, answer.seconds)
    if not answer.has_ping:  # a proxy that sends no PING: its dial is the whole check
        return target.verdict("ok", None, answer.seconds)
    if answer.ping == "answered":
        return target.verdict("ok", None, answer.seconds, answer.ping_seconds)
    if answer.ping in (None, "pending"):
        return None
    ping_error = answer.ping_error or f"PING {answer.ping}"
    return target.verdict("failed", ping_error, answer.seconds, ping_failed=True)


def waiting_line(names: Sequence[str], timeout: float) -> str:
    """What a start says when its check waits past ``SLOW_NOTICE_SECONDS``."""
    return f"waiting up to {timeout:g}s (upstream_check_seconds) for the upstream check of {', '.join(names)}"


def await_verdicts(
    targets: Sequence[CheckTarget],
    timeout: float,
    on_slow: Callable[[list[str]], None] | None = None,
) -> list[Verdict]:
    """Each target's verdict, in order, within ``timeout`` seconds for all together (a thread
    each); never raises for a proxy: one that does not answer is ``no verdict``. ``on_slow`` is
    called once, from a timer thread but before this returns, with the names still awaited if
    the wait passes ``SLOW_NOTICE_SECONDS``.
    """
    deadline = time.monotonic() + timeout
    unchecked = {
        index: target.verdict("not checked", target.unchecked_because)
        for index, target in enumerate(targets)
        if target.metrics is None
    }
    asked = {index: target for index, target in enumerate(targets) if index not in unchecked}
    done: set[int] = set()
    lock = threading.Lock()

    def work(item: tuple[int, CheckTarget]) -> Verdict:
        verdict = _wait_one(item[1], deadline, timeout)
        with lock:
            done.add(item[0])
        return verdict

    def notice() -> None:
        with lock:
            waiting = [target.name for index, target in asked.items() if index not in done]
        if waiting and on_slow is not None:
            on_slow(waiting)

    timer = threading.Timer(SLOW_NOTICE_SECONDS, notice)
    timer.daemon = True
    if on_slow is not None and asked and timeout > SLOW_NOTICE_SECONDS:
        timer.start()
    try:
        # Each ask ends within _ASK_TIMEOUT_SECONDS of the deadline (its own socket timeout): that
        # slack is waited for, so an answer the proxy gave just at the deadline is not lost.
        answered = fanout.each_by_deadline(
            {index: (index, target) for index, target in asked.items()},
            work,
            deadline + _ASK_TIMEOUT_SECONDS,
            name="upcheck",
        )
    finally:
        timer.cancel()
        if timer.is_alive():
            timer.join()  # a notice being said is said before the verdicts, never after
    results = {**unchecked, **answered}
    return [results.get(index) or target.verdict("no verdict") for index, target in enumerate(targets)]
