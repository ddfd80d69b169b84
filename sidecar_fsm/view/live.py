"""What each running sidecar is doing now: its ``GET /metrics``, read under a deadline.

The caller scrapes only instances proved ours: a dead sidecar's port may belong to someone else
by now. A sidecar that does not answer in time reads ``no answer``; it never delays the others
nor the command past the deadline, and is never an error of the command: ``status`` and
``top`` must work best exactly when something is wrong.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from sidecar_fsm.base import fanout

__all__ = ["NO_ANSWER", "SCRAPE_TIMEOUT_SECONDS", "Figures", "Scrape", "parse", "scrape_all"]

# One deadline for the whole scrape. A healthy proxy answers in a millisecond, but on a GPU node
# whose every core is busy it can be held for hundreds, and a miss makes `status` exit 3 (a false
# alarm). A second suits a starved node and still a person waiting on a stuck sidecar.
SCRAPE_TIMEOUT_SECONDS = 1.0
NO_ANSWER = "no answer"
# /metrics is a few kilobytes; more than this is not our proxy, and is not read on.
_MAX_BODY_BYTES = 1 << 20

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Figures:
    """One scrape's figures; counters count since the proxy started."""

    requests_in_flight: int
    oldest_request_age_seconds: float
    requests_total: int
    pings_sent: int
    ping_acks: int
    ping_rtt_seconds: float
    upstream_up: bool
    upstream_connections: int
    # Every kind the proxy reported, zeros included, so a reader can tell "none" from "unknown";
    # in the proxy's order (its kindNames), which is the order of its samples.
    upstream_errors: Mapping[str, int] = field(default_factory=dict)
    # The proxy's last upstream error in its own words (GET /upstream), read only while the
    # upstream is down; None when up, or when the proxy could not say.
    upstream_error: str | None = None
    # True while the gauge is 0 only because nothing was dialled yet: a proxy a moment after its
    # ready file, before its first upstream check (GET /upstream: not checked, no error). Such
    # an upstream is not known to be down, and a status taken then must not say it is.
    upstream_unchecked: bool = False

    @property
    def upstream_down(self) -> bool:
        """The upstream failed its last dial or response (not merely "not dialled yet")."""
        return not self.upstream_up and not self.upstream_unchecked

    def errors_counted(self) -> dict[str, int]:
        """The error kinds with a non-zero count, in the proxy's order."""
        return {kind: count for kind, count in self.upstream_errors.items() if count}


@dataclass(frozen=True)
class Scrape:
    """The outcome for one metrics address: ``figures``, or ``problem`` (one line) saying why not."""

    address: str
    figures: Figures | None
    problem: str | None = None


class _BadAnswer(ValueError):
    """The listener answered, but not with the proxy's metrics."""


def parse(text: str) -> Figures:
    """The figures in a ``/metrics`` body (Prometheus text 0.0.4). Pure.

    Raises ``ValueError`` when the text does not parse or lacks a figure ``status`` shows: a
    listener that is not an h2-ping-sidecar (or an older one) must read as such, not as zeros.
    """
    values: dict[str, float] = {}
    errors: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "h2ping_upstream_errors_total" and "kind" in sample.labels:
                errors[sample.labels["kind"]] = int(sample.value)
            elif not sample.labels:
                values[sample.name] = sample.value

    def get(name: str) -> float:
        if name not in values:
            raise _BadAnswer(f"no {name} in the answer")
        return values[name]

    return Figures(
        requests_in_flight=int(get("h2ping_requests_in_flight")),
        oldest_request_age_seconds=get("h2ping_oldest_request_age_seconds"),
        requests_total=int(get("h2ping_requests_total")),
        pings_sent=int(get("h2ping_pings_sent_total")),
        ping_acks=int(get("h2ping_ping_acks_total")),
        ping_rtt_seconds=get("h2ping_ping_rtt_seconds"),
        upstream_up=get("h2ping_upstream_up") >= 1,
        upstream_connections=int(get("h2ping_upstream_connections")),
        upstream_errors=errors,
    )


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _scrape_one(address: str, deadline: float) -> Scrape:
    """GET /metrics at ``address``, each socket operation waiting at most until ``deadline``."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return Scrape(address, None, NO_ANSWER)
    try:
        host, port = _host_port(address)
    except ValueError:
        return Scrape(address, None, f"recorded metrics address '{address}' is not host:port")
    conn = http.client.HTTPConnection(host, port, timeout=remaining)
    try:
        conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        response = conn.getresponse()
        body = response.read(_MAX_BODY_BYTES)
        if response.status != 200:
            return Scrape(address, None, f"bad answer: HTTP {response.status}")
        figures = parse(body.decode("utf-8", errors="replace"))
        if not figures.upstream_up:
            error, unchecked = _upstream_report(conn)
            figures = dataclasses.replace(figures, upstream_error=error, upstream_unchecked=unchecked)
        return Scrape(address, figures)
    except TimeoutError:
        return Scrape(address, None, NO_ANSWER)
    except ConnectionRefusedError:
        # Nothing listens there: the proxy is exiting, or closed its metrics listener.
        return Scrape(address, None, f"{NO_ANSWER}: connection refused")
    except (OSError, http.client.HTTPException) as error:
        return Scrape(address, None, f"{NO_ANSWER}: {error or type(error).__name__}")
    except ValueError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "not Prometheus text"
        return Scrape(address, None, f"bad answer: {reason}")
    finally:
        conn.close()


def _upstream_report(conn: http.client.HTTPConnection) -> tuple[str | None, bool]:
    """The proxy's last upstream error (``GET /upstream``'s ``last_error``, on the scrape's
    connection) and whether nothing was checked yet; ``(None, False)`` when it cannot say.

    Not a metric: an error's words would make an unbounded label value.
    """
    try:
        conn.request("GET", "/upstream")
        response = conn.getresponse()
        body = response.read(_MAX_BODY_BYTES)
        if response.status != 200:
            return None, False
        document = json.loads(body)
    except (OSError, http.client.HTTPException, ValueError):
        return None, False
    if not isinstance(document, dict):
        return None, False
    error = document.get("last_error")
    words = " ".join(str(error).split()) or None if error is not None else None
    return words, words is None and document.get("checked") is False


def scrape_all(addresses: Mapping[K, str], timeout: float = SCRAPE_TIMEOUT_SECONDS) -> dict[K, Scrape]:
    """Scrape every address at once; a ``Scrape`` per key within ``timeout`` seconds, whatever happens.

    One daemon thread per address, all against one deadline: N sidecars take one timeout, not N.
    A thread still blocked then is abandoned, not joined (its socket timeout ends it soon after).
    """
    deadline = time.monotonic() + timeout
    results = fanout.each_by_deadline(
        addresses, lambda address: _scrape_one(address, deadline), deadline, name="scrape"
    )
    return {key: results.get(key) or Scrape(address, None, NO_ANSWER) for key, address in addresses.items()}
