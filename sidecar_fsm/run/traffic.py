"""Bringing each proxy's traffic figures into the state database.

The proxy writes its ``-traffic-file`` beside its log atomically, every ``-traffic-interval`` and
once more when its drain ends (go/traffic.go, docs/query.md). This module checks it and hands it
to ``Store.record_traffic`` (one row per instance and pid: a re-import changes nothing). No thread
of ours runs in NeMo Gym's process, so ``check()`` and the supervise loop call ``poll``,
throttled; ``stop`` imports after the drain, a restart before its new process writes the same
path, ``reap`` after the sidecars ended. A file is read only where no other user can write
(``trust``). Never raises: a bad file, a full disk or a locked database never breaks ``check``,
``stop``, ``reap`` or ``prune`` (a bad file gets one warning and is ignored).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sidecar_fsm.base import trust
from sidecar_fsm.run import crashpoints
from sidecar_fsm.run.runfiles import TRAFFIC, sibling
from sidecar_fsm.state.records import TrafficRecord

if TYPE_CHECKING:
    from sidecar_fsm.run.children import Child, SidecarRun
    from sidecar_fsm.state.store import InstanceRecord, Store

# Version 2 is version 1 and the NVCF counters (go/traffic.go; traffic_summary names them).
FORMAT_VERSIONS = (1, 2)
# The supervise loop and Gym's check() run every fraction of a second to every few seconds; the
# proxy writes every 30 s by default. A minute keeps `query` at most about a minute behind (the
# issue's bound) for one small read and at most one commit per instance.
POLL_SECONDS = 60.0
# The first poll after a start may come before the proxy's first file: until figures are found,
# look again this soon (an open() that fails, per instance: what a NeMo Gym binary's run pays).
RETRY_SECONDS = 1.0
# A record is a few KB (two histograms of a few dozen buckets); anything much larger is not one,
# and is not read into memory whole.
MAX_FILE_BYTES = 256 * 1024
_MAX_BUCKETS = 1000
# What the importer reads itself; every other field is a figure, checked by its shape.
_HEADER = ("version", "pid", "started_at", "as_of", "final")
# The histograms traffic_quantiles is computed from: a record without them is not one.
_HISTOGRAMS = ("ttfb_seconds", "duration_seconds")
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)")

# The throttle's clock (a test turns it forward instead of waiting a minute).
_clock = time.monotonic

_warned: set[str] = set()
_warned_lock = threading.Lock()


class NotFigures(ValueError):
    """The file is not a traffic record of a known version of the expected process; the words say why."""


# -- the file -------------------------------------------------------------------------------------


def traffic_path(log_path: str) -> str:
    """The traffic file of the instance whose log is ``log_path``. Pure."""
    return sibling(log_path, TRAFFIC)


def parse(text: str | bytes) -> TrafficRecord:
    """The record in a traffic file's text, checked. Pure; raises ``NotFigures`` saying why not.

    The counters are not listed here (the documented views name them): every field but the
    header must be a figure by its shape (``_figure``), so a record holds nothing but numbers
    and the two times.
    """
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotFigures(f"not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise NotFigures("not a JSON object")
    version = document.get("version")
    if version not in FORMAT_VERSIONS or isinstance(version, bool):
        known = " or ".join(str(known) for known in FORMAT_VERSIONS)
        raise NotFigures(f"version {json.dumps(version)} is not {known}")
    pid = _count(document.get("pid"), "pid")
    if pid <= 0:
        raise NotFigures(f"pid {pid} is not a process id")
    _time(document, "started_at")
    as_of = _time(document, "as_of")
    if not isinstance(document.get("final"), bool):
        raise NotFigures(f"final {json.dumps(document.get('final'))} is not true or false")
    for name in _HISTOGRAMS:
        if not isinstance(document.get(name), dict) or "bounds" not in document[name]:
            raise NotFigures(f"{name} is not a histogram")
    for name, value in document.items():
        if name not in _HEADER:
            _figure(value, name)
    return TrafficRecord(pid, as_of, document)


def _figure(value: Any, name: str) -> None:
    """Check one field by its shape: a histogram, an object of counts (``upstream_errors``),
    seconds (a name ending in ``_s``), else a count (a whole number >= 0)."""
    if isinstance(value, dict) and "bounds" in value:
        _histogram(value, name)
    elif isinstance(value, dict):
        for key, count in value.items():
            _count(count, f"{name}.{key}")
    elif name.endswith("_s"):
        _seconds(value, name)
    else:
        _count(value, name)


def _count(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise NotFigures(f"{name} {json.dumps(value)} is not a count")
    return value


def _seconds(value: Any, name: str) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        raise NotFigures(f"{name} {json.dumps(value)} is not a number of seconds")
    return float(value)


def _time(document: Mapping[str, Any], key: str) -> float:
    """An RFC 3339 time (what Go's time.RFC3339Nano writes) as unix seconds."""
    value = document.get(key)
    match = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise NotFigures(f"{key} {json.dumps(value)} is not an RFC 3339 time")
    zone = "+00:00" if match[3] == "Z" else match[3]
    try:
        moment = datetime.fromisoformat(match[1] + zone)
    except ValueError:
        raise NotFigures(f"{key} {json.dumps(value)} is not an RFC 3339 time") from None
    return moment.astimezone(timezone.utc).timestamp() + float(match[2] or 0)


def _histogram(value: Mapping[str, Any], key: str) -> None:
    """The file's ``{"bounds", "counts", "sum", "count"}``: increasing finite bounds, one more
    count (the last is +Inf), ``count`` their sum, and nothing else."""
    bounds, counts = value.get("bounds"), value.get("counts")
    if not isinstance(bounds, list) or not isinstance(counts, list) or len(bounds) > _MAX_BUCKETS:
        raise NotFigures(f"{key}: bounds and counts are not lists of buckets")
    if len(counts) != len(bounds) + 1:
        raise NotFigures(f"{key}: {len(counts)} counts for {len(bounds)} bounds; want one more count")
    floats = [_seconds(bound, f"{key}.bounds") for bound in bounds]
    if any(later <= earlier for earlier, later in zip(floats, floats[1:], strict=False)):
        raise NotFigures(f"{key}: bounds are not increasing")
    whole = [_count(count, f"{key}.counts[{index}]") for index, count in enumerate(counts)]
    count = _count(value.get("count"), f"{key}.count")
    if count != sum(whole):
        raise NotFigures(f"{key}: count {count} is not the sum of its counts ({sum(whole)})")
    _seconds(value.get("sum"), f"{key}.sum")
    extra = sorted(set(value) - {"bounds", "counts", "sum", "count"})
    if extra:
        raise NotFigures(f"{key}.{extra[0]} is not a histogram field")


def read(path: str, pids: Iterable[int]) -> TrafficRecord | None:
    """The record at ``path`` if it is a traffic record of one of ``pids``; else None.

    None without a word when there is no file yet or another user could have written it
    (``status`` says so); any other file is ignored with one warning, once per path.
    """
    folder = os.path.dirname(path) or "."
    if trust.log_dir_problem(folder) is not None or trust.file_problem(path) is not None:
        return None
    try:
        # O_NOFOLLOW: the name is ours; a link in its place was not made by the proxy.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            text = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn(path, exc.strerror or str(exc))
        return None
    if len(text) > MAX_FILE_BYTES:
        _warn(path, f"larger than {MAX_FILE_BYTES} bytes")
        return None
    try:
        figures = parse(text)
    except NotFigures as exc:
        _warn(path, str(exc))
        return None
    wanted = sorted(set(pids))
    if figures.pid not in wanted:
        _warn(path, f"pid {figures.pid} is not one of this instance's processes ({wanted or 'none'})")
        return None
    return figures


def _warn(path: str, reason: str, line: str | None = None) -> None:
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    print(line or f"WARNING: traffic figures {path} ignored: {reason}", file=sys.stderr, flush=True)


# -- importing -------------------------------------------------------------------------------------


def import_instances(store: Store, instances: Iterable[InstanceRecord]) -> None:
    """Import the figures of each of ``instances`` (recorded rows: ``reap``). Never raises."""
    _import(store, [(inst.id, inst.log_path, {inst.pid} if inst.pid else set()) for inst in instances])


def import_children(run: SidecarRun, children: Iterable[Child] | None = None) -> None:
    """Import the figures of ``run``'s ``children`` (default: all), each checked against its
    current process's pid: ``stop``, a restart (before its spawn). Never raises."""
    if run.store is None or run.unrecordable is not None:
        return  # nothing recorded this run, or its database is gone: nowhere to put them
    chosen = run.children if children is None else list(children)
    found = _import(
        run.store,
        [
            (child.machine.instance_id, child.log_path, {child.process.pid} if child.process else set())
            for child in chosen
        ],
    )
    run.traffic_due = _clock() + (POLL_SECONDS if found else RETRY_SECONDS)


def poll(run: SidecarRun) -> None:
    """``import_children`` at most once per ``POLL_SECONDS`` of ``run`` (``check()``, the supervise loop)."""
    if run.running and _clock() >= run.traffic_due:
        import_children(run)


def _import(store: Store, wanted: list[tuple[int, str | None, set[int]]]) -> int:
    """Record what is new in each (instance id, log path, pids) file, in one commit; how many
    instances had figures. A pid already stored counts too: after a restart the file holds the
    dead process's figures until the new one writes its first."""
    try:
        found = []
        for instance_id, log_path, pids in wanted:
            if not log_path:
                continue
            figures = read(traffic_path(log_path), pids | store.traffic_pids(instance_id))
            if figures is not None:
                found.append((instance_id, figures))
        if not found:
            return 0
        with store.transaction():
            for instance_id, figures in found:
                store.record_traffic(instance_id, figures)
        crashpoints.hit("traffic-recorded")
        return len(found)
    except Exception as exc:  # noqa: BLE001 - a figure never breaks check, stop, reap or prune
        _warn(str(store.path), str(exc), f"WARNING: traffic figures not recorded in {store.path}: {exc}")
        return 0
