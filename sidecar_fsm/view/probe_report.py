"""The words of ``sidecar-fsm probe``: its progress line, its report and its ``--json``.

Owns rendering the probe's events (go/probe.go prints them; ``run.probe`` reads them): one line
per connection, the request's line, the verdict. Decides nothing: the verdict and the exit code
are the probe's. Must not print a header value (none reaches it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["json_document", "progress_line", "report_lines", "start_line"]

# The --json keys, in order (SPEC): what a script may rely on.
_JSON_KEYS = ("upstream", "route", "for_s", "silent", "pinged", "request", "verdict")


def _seconds(value: object) -> str:
    return f"{float(value):.1f}s" if isinstance(value, (int, float)) else "-"


def _pings(count: object) -> str:
    return f"{count} PING" if count == 1 else f"{count} PINGs"


def start_line(event: Mapping[str, Any]) -> str:
    """What is probed, by which route, for how long."""
    request = f"; GET {event['request']} on the PINGed one" if event.get("request") else ""
    return (
        f"probing {event.get('upstream')} ({event.get('route')}) for {event.get('for_s', 0):g}s: "
        f"two idle HTTP/2 connections, one silent, one PINGed every {event.get('ping_interval_s', 0):g}s"
        f"{request}"
    )


def _connection(name: str, conn: Mapping[str, Any], elapsed: object) -> str:
    if conn.get("open"):
        state = f"open after {_seconds(elapsed)}"
    else:
        state = f"closed after {_seconds(conn.get('closed_after_s'))}: {conn.get('how')}"
    if "pings" in conn:
        rtt = conn.get("ping_rtt_seconds")
        last = f" (last round trip {float(rtt) * 1000:.1f} ms)" if isinstance(rtt, (int, float)) else ""
        state += f"; {_pings(conn.get('pings'))} sent, {conn.get('acks')} answered{last}"
    return f"{name:<8}{state}"


def _request(request: Mapping[str, Any]) -> str:
    head = f"{'request':<8}GET {request.get('path')}: "
    if not request.get("done"):
        return head + "no answer yet"
    if request.get("error"):
        status = f"status {request['status']}, then " if request.get("status") else ""
        return head + f"{status}failed after {_seconds(request.get('after_s'))}: {request['error']}"
    answer = head + f"status {request.get('status')} after {_seconds(request.get('after_s'))}"
    if request.get("nvcf_pending"):  # not the answer, which a client must poll for
        answer += " with NVCF-REQID: NVCF's poll window passed (the sidecar follows it)"
    return answer


def progress_line(event: Mapping[str, Any]) -> str:
    """One line that replaces itself on a terminal while the probe runs."""
    silent, pinged = event.get("silent", {}), event.get("pinged", {})
    parts = [
        f"{_seconds(event.get('elapsed_s'))} of {event.get('for_s', 0):g}s",
        "silent "
        + ("open" if silent.get("open") else f"closed after {_seconds(silent.get('closed_after_s'))}"),
        "pinged "
        + ("open" if pinged.get("open") else f"closed after {_seconds(pinged.get('closed_after_s'))}")
        + f" ({_pings(pinged.get('pings', 0))}, {pinged.get('acks', 0)} answered)",
    ]
    request = event.get("request")
    if isinstance(request, Mapping):
        parts.append(f"request {request.get('status') or 'waiting'}")
    return "probe: " + "; ".join(parts)


def report_lines(result: Mapping[str, Any]) -> list[str]:
    """The report: each connection, the request, the verdict."""
    lines = [
        _connection("silent", result.get("silent", {}), result.get("elapsed_s")),
        _connection("pinged", result.get("pinged", {}), result.get("elapsed_s")),
    ]
    request = result.get("request")
    if isinstance(request, Mapping):
        lines.append(_request(request))
    lines.append(f"verdict: {result.get('verdict')}")
    return lines


def json_document(result: Mapping[str, Any]) -> dict[str, Any]:
    """``--json``: SPEC's keys, in order."""
    return {key: result.get(key) for key in _JSON_KEYS}
