"""What each sidecar carried, where a person looks: ``history``'s traffic lines, ``status --all``.

The figures are ``traffic_summary``'s rows (docs/query.md) as the last import left them (a read
command never writes), so a live run's line says when its figures were taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sidecar_fsm.state.store import Store
from sidecar_fsm.view.cells import UNKNOWN

__all__ = ["InstanceTraffic", "instance_traffic", "run_totals", "totals_text", "traffic_json", "traffic_line"]

# One instance's ``traffic_summary`` row (docs/query.md), by column name.
InstanceTraffic = Mapping[str, Any]
_KIND = "upstream_errors_"


def instance_traffic(store: Store, run_id: str) -> dict[str, InstanceTraffic]:
    """The figures of each instance of ``run_id`` that has some, by name. Read-only."""
    return {row["name"]: row for row in store.traffic_summary(run_id)}


def run_totals(stores: Iterable[Store]) -> dict[str, tuple[int, int]]:
    """``run_id -> (requests, 502s)`` of every run with figures in ``stores``. Read-only."""
    totals: dict[str, tuple[int, int]] = {}
    for store in stores:
        for row in store.traffic_summary():
            requests, bad = totals.get(row["run_id"], (0, 0))
            totals[row["run_id"]] = (requests + row["requests"], bad + row["responses_502"])
    return totals


def _errors(figures: InstanceTraffic) -> dict[str, int]:
    """The upstream errors by kind, in the view's order (its ``upstream_errors_<kind>`` columns)."""
    return {name[len(_KIND) :]: count for name, count in figures.items() if name.startswith(_KIND)}


def _seconds(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    return f"{value * 1000:.3g}ms" if value < 1 else f"{value:.3g}s"


def traffic_line(name: str, figures: InstanceTraffic | None) -> str:
    """``traffic policy: 10 requests, 2 502s, ttfb p50 50ms p99 1s, duration p99 10s max 12.8s,
    upstream failures dial 1 (per connection, the start's check included), final``; ``none
    recorded`` without figures. Upstream failures count connections, so they stand apart from
    the 502s."""
    if figures is None:
        return f"traffic {name}: none recorded"
    kinds = ", ".join(f"{kind} {count}" for kind, count in _errors(figures).items() if count)
    failures = f", upstream failures {kinds} (per connection, the start's check included)" if kinds else ""
    when = "final" if figures["final"] else f"as of {figures['as_of']}"
    return (
        f"traffic {name}: {figures['requests']} requests, {figures['responses_502']} 502s, "
        f"ttfb p50 {_seconds(figures['ttfb_p50_s'])} p99 {_seconds(figures['ttfb_p99_s'])}, "
        f"duration p99 {_seconds(figures['duration_p99_s'])} "
        f"max {_seconds(figures['duration_max_s'])}{failures}, {when}"
    )


def traffic_json(figures: InstanceTraffic | None) -> dict[str, Any] | None:
    """An instance's ``traffic`` in ``history --json``; null without figures."""
    if figures is None:
        return None
    return {
        "requests": figures["requests"],
        "responses_502": figures["responses_502"],
        "upstream_errors": _errors(figures),
        "ttfb_p50_s": figures["ttfb_p50_s"],
        "ttfb_p99_s": figures["ttfb_p99_s"],
        "duration_p99_s": figures["duration_p99_s"],
        "duration_max_s": figures["duration_max_s"],
        "as_of": figures["as_of"],
        "final": bool(figures["final"]),
        "processes": figures["processes"],
    }


def totals_text(totals: Mapping[str, tuple[int, int]], run_id: str) -> str:
    """``5 requests, 0 502s`` for ``status --all``'s ended runs; ``-`` without figures."""
    if run_id not in totals:
        return UNKNOWN
    requests, bad = totals[run_id]
    return f"{requests} requests, {bad} 502s"


def totals_json(totals: Mapping[str, tuple[int, int]], run_id: str) -> dict[str, int] | None:
    """A run's ``traffic`` in ``status --json``: requests and 502s, null without figures."""
    if run_id not in totals:
        return None
    requests, bad = totals[run_id]
    return {"requests": requests, "responses_502": bad}
