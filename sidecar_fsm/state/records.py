"""The state database's rows as Python values: runs, instances, history rows, a new instance.

Owns the record types ``store`` returns and takes, and turning a row into one (``run_record``
decodes the stored config summary); a traffic record is the proxy's own document, its counters
named only by the documented views. Plain values: no SQL, no I/O; a record is a snapshot as of
the query that returned it, never updated in place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["InstanceRecord", "NewInstance", "RunRecord", "TrafficRecord", "TransitionRecord", "run_record"]


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


class TrafficRecord(NamedTuple):
    """One proxy process's traffic record (go/traffic.go), checked by ``run.traffic.parse``.

    ``document`` is the record as the proxy wrote it: numbers, the two times and nothing else, so
    it can hold no header, query or userinfo; the store keeps it whole and the documented views
    name its counters. ``pid`` and ``as_of`` (unix seconds) are read out of it because the importer
    decides by them (whose figures, and which of two records of one process is newer).
    """

    pid: int
    as_of: float
    document: Mapping[str, Any]
