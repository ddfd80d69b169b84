"""The start's upstream check: each proxy's first upstream dial, awaited and put in words.

Right after its ready file a proxy dials its upstream once (go/upcheck.go) and keeps the verdict
at ``GET /upstream`` on its metrics listener (JSON: ``checked``, ``ok``, ``error`` in the
proxy's own words, ``seconds``). This module waits for those verdicts, every proxy at once
against one deadline (``upstream_check_seconds``: four unreachable upstreams cost one wait, not
four), and words one line per instance. What a failure means for the start (``warn`` or
``fail``) is the caller's decision; ``off`` never calls here.

Must not start, signal or judge processes, fire events or open the database: it reads loopback
HTTP answers and returns values. A proxy without a metrics listener (``metrics: false``, or
NeMo Gym's binary, which has no ``-metrics-listen``) is "not checked", never an error.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sidecar_fsm.base import fanout

__all__ = ["CheckTarget", "Verdict", "await_verdicts"]

# Between two asks of one proxy: its check starts 200 ms after its ready file and a loopback
# handshake takes a few ms more, so a faster poll only costs CPU the proxies are starting on.
POLL_SECONDS = 0.025
# One ask's own limit: a proxy that does not answer its metrics listener within this is asked
# again (until the deadline) rather than holding the wait.
_ASK_TIMEOUT_SECONDS = 1.0
_MAX_BODY_BYTES = 64 * 1024
# What a client of a sidecar sees while its upstream does not answer (proxy.go's 502 body).
CONSEQUENCE = "requests will get 502 until it answers"

Outcome = Literal["ok", "failed", "no verdict", "not checked"]


@dataclass(frozen=True)
class CheckTarget:
    """One instance to check: its name and upstream (for the words), its metrics address
    (None: nothing to ask) and, when None, why (``metrics: false``, or a binary without it)."""

    name: str
    upstream: str
    metrics: str | None
    unchecked_because: str = "metrics: false"


@dataclass(frozen=True)
class Verdict:
    """How one instance's first upstream check ended, as its proxy reported it.

    ``ok``: dialled (TCP, TLS, ALPN h2) in ``seconds``. ``failed``: ``error`` is the proxy's
    own one-line words. ``no verdict``: none before the deadline (``error`` says what was seen
    last, if anything). ``not checked``: the proxy cannot say (``error`` says why).
    """

    name: str
    upstream: str
    outcome: Outcome
    error: str | None = None
    seconds: float | None = None

    @property
    def failed(self) -> bool:
        """True when ``upstream_check: fail`` must fail the start for this instance."""
        return self.outcome in ("failed", "no verdict")

    def line(self, timeout: float) -> str:
        """The start's one line for this instance (without host or run: the caller adds them)."""
        head = f"{self.name} upstream {self.upstream}"
        if self.outcome == "ok":
            return f"{head} ok: TLS and HTTP/2 in {self.seconds or 0.0:.3f}s"
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
    """The proxy did not give a verdict this time; the text says what it did instead."""


def _ask(address: str, timeout: float) -> tuple[bool, bool, str | None, float | None]:
    """GET /upstream once: (checked, ok, error, seconds). Raises ``_NotAnswered``."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise _NotAnswered(f"recorded metrics address '{address}' is not host:port")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        conn.request("GET", "/upstream")
        response = conn.getresponse()
        body = response.read(_MAX_BODY_BYTES)
        if response.status == 404:
            raise _NotAnswered("the proxy has no GET /upstream (an older build)")
        if response.status != 200:
            raise _NotAnswered(f"GET /upstream answered HTTP {response.status}")
        document = json.loads(body)
        if not isinstance(document, dict):
            raise _NotAnswered("GET /upstream answered no JSON object")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _NotAnswered(f"metrics listener {address}: {exc or type(exc).__name__}") from None
    finally:
        conn.close()
    error = document.get("error")
    seconds = document.get("seconds")
    return (
        bool(document.get("checked")),
        bool(document.get("ok")),
        str(error) if error is not None else None,
        float(seconds) if isinstance(seconds, (int, float)) else None,
    )


def _wait_one(target: CheckTarget, deadline: float) -> Verdict:
    """Ask ``target`` until it has a verdict or ``deadline`` (monotonic) passes. Bounded."""
    assert target.metrics is not None
    last: str | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Verdict(target.name, target.upstream, "no verdict", last)
        try:
            checked, ok, error, seconds = _ask(target.metrics, min(remaining, _ASK_TIMEOUT_SECONDS))
        except _NotAnswered as exc:
            last = str(exc)
            if "no GET /upstream" in last:
                return Verdict(target.name, target.upstream, "not checked", last)
        else:
            if checked:
                outcome: Outcome = "ok" if ok else "failed"
                return Verdict(target.name, target.upstream, outcome, error or None, seconds)
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))


def await_verdicts(targets: Sequence[CheckTarget], timeout: float) -> list[Verdict]:
    """Each target's verdict, in ``targets``' order, within ``timeout`` seconds for all together.

    One thread per proxy, all against one deadline, so the wait is the slowest check's, not the
    sum. Read-only (loopback GETs); never raises for a proxy: one that does not answer is
    ``no verdict``. A thread still asking at the deadline is a daemon whose ask times out
    within ``_ASK_TIMEOUT_SECONDS``; its late answer is dropped.
    """
    deadline = time.monotonic() + timeout
    unchecked = {
        index: Verdict(target.name, target.upstream, "not checked", target.unchecked_because)
        for index, target in enumerate(targets)
        if target.metrics is None
    }
    asked = {index: target for index, target in enumerate(targets) if index not in unchecked}
    # Each ask ends within _ASK_TIMEOUT_SECONDS of the deadline (its own socket timeout): that
    # slack is waited for, so an answer the proxy gave just at the deadline is not lost.
    answered = fanout.each_by_deadline(
        asked, lambda target: _wait_one(target, deadline), deadline + _ASK_TIMEOUT_SECONDS, name="upcheck"
    )
    results = {**unchecked, **answered}
    return [
        results.get(index) or Verdict(target.name, target.upstream, "no verdict")
        for index, target in enumerate(targets)
    ]
