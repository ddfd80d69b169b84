"""The state database's rows as Python values: runs, instances, history rows, a new instance.

Owns the record types ``store`` returns and takes, and turning a row into one (``run_record``
decodes the stored config summary). Plain values: no SQL, no I/O; a record is a snapshot as of
the query that returned it, never updated in place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["InstanceRecord", "NewInstance", "RunRecord", "TransitionRecord", "run_record"]


@dataclass(frozen=True)
class RunRecord:
    """One launcher run. ``ended_at``/``outcome`` are None while the run is live."""

    run_id: str
    host: str
    owner_pid: int
    owner_start_time: float | None
    started_at: float
    ended_at: float | None
    outcome: str | None
    config_summary: dict[str, Any]


@dataclass(frozen=True)
class InstanceRecord:
    """One sidecar instance of a run, as of its last transition. Times are unix seconds."""

    id: int
    run_id: str
    name: str
    listen: str
    upstream: str
    state: str
    state_since: float
    pid: int | None
    pid_start_time: float | None
    binary: str | None
    log_path: str | None
    ready_path: str | None
    exit_code: int | None
    error: str | None
    restart_count: int
    # The proxy's /metrics listener (host:port), recorded by the ``ready`` event; None when the
    # instance runs without metrics or has not been ready yet. Defaulted, so a record built by
    # hand (a test, another tool) from the columns of schema 2 still type-checks.
    metrics: str | None = None


class NewInstance(NamedTuple):
    """An instance to record (``Store.create_instances``): what its launcher knows before it starts."""

    name: str
    listen: str
    upstream: str
    binary: str | None
    log_path: str | None
    ready_path: str | None


@dataclass(frozen=True)
class TransitionRecord:
    """One history row: ``source`` -> ``dest`` by ``event`` at ``at`` (unix seconds)."""

    id: int
    instance_id: int
    source: str
    dest: str
    event: str
    at: float
    detail: str | None


def run_record(row: Mapping[str, Any]) -> RunRecord:
    """A run row (``config_summary`` still JSON text) as a ``RunRecord``."""
    fields = dict(row)
    fields["config_summary"] = json.loads(fields["config_summary"] or "{}")
    return RunRecord(**fields)


# -- traffic (issue 28) ---------------------------------------------------------------------------

# The upstream error kinds of the proxy's ``h2ping_upstream_errors_total{kind}``, in its order.
UPSTREAM_ERROR_KINDS = ("dial", "tls", "alpn", "ping_timeout", "reset", "other")


@dataclass(frozen=True)
class TrafficFigures:
    """What one proxy process carried, as of ``as_of`` (unix seconds): one traffic file, checked.

    Numbers only, and the two times: nothing in it can hold a header, a query or userinfo.
    ``upstream_errors`` maps each of ``UPSTREAM_ERROR_KINDS`` to its count; each histogram is
    ``{"buckets": [[le, n], ..., [None, n]], "sum", "count"}``: per-bucket (not cumulative)
    counts beside their upper bounds, the last bucket +Inf.
    """

    pid: int
    started_at: float
    as_of: float
    final: bool
    requests: int
    responses_2xx: int
    responses_4xx: int
    responses_5xx: int
    responses_502: int
    responses_other: int
    client_disconnects: int
    upstream_errors: Mapping[str, int]
    pings_sent: int
    ping_acks: int
    goaways: int
    retries: int
    rotations: int
    ttfb_seconds: Mapping[str, Any]
    duration_seconds: Mapping[str, Any]
    duration_max_s: float


@dataclass(frozen=True)
class InstanceTraffic:
    """One instance's figures as ``traffic_summary`` gives them: its processes summed.

    ``upstream_errors`` by kind; percentiles are bucket upper bounds (see migrations/0005), None
    when no request finished; ``final`` when every process had drained when it wrote them.
    """

    name: str
    requests: int
    responses_502: int
    upstream_errors: Mapping[str, int]
    ttfb_p50_s: float | None
    ttfb_p99_s: float | None
    duration_p99_s: float | None
    duration_max_s: float
    as_of: str
    final: bool
    processes: int
