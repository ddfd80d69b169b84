"""Pruning: removing ended runs, and what crashed launchers left, from this host's log dir.

A run that ended more than the given age ago loses its rows (``Store.delete_ended_run`` checks
again under the write lock that it ended) and its instances' files (``runfiles.instance_files``);
database temp files whose creator was SIGKILLed go too. A live run is never touched, however
old: its owner may still be writing (``reap`` closes a run whose owner died). Only this host's
database is written. Must not judge or signal processes; must not print.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sidecar_fsm.run.runfiles import instance_files
from sidecar_fsm.state import tempfiles
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import RunRecord, Store, database_path


@dataclass(frozen=True)
class PrunedRun:
    """One ended run removed (or, in a dry run, to be removed), with its files."""

    run: RunRecord
    files: list[str]


@dataclass
class PruneReport:
    dry_run: bool
    older_than_seconds: float
    runs: list[PrunedRun] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)


def _files_of(store: Store, run: RunRecord) -> list[str]:
    instances = store.instances_of(run.run_id)
    return [path for inst in instances for path in instance_files(inst.log_path, inst.ready_path)]


def prune(
    store: Store,
    log_dir: str | Path,
    *,
    older_than_seconds: float,
    dry_run: bool = False,
    now: float | None = None,
) -> PruneReport:
    """Remove this host's runs that ended more than ``older_than_seconds`` ago, and abandoned
    database temp files; the report says what went (or would go, with ``dry_run``).

    Files go first, then the row: a prune killed in between leaves a row whose logs are gone,
    which the next prune finds and finishes; the other order would leave files no row names,
    which nothing would ever remove. Idempotent; two prunes at once are safe (a file already
    gone is no error, the second finds the row gone and deletes nothing).
    """
    now = time.time() if now is None else now
    report = PruneReport(dry_run=dry_run, older_than_seconds=older_than_seconds)
    for run in store.runs_ended_before(now - older_than_seconds):
        files = _files_of(store, run)
        if not dry_run:
            for path in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            store.delete_ended_run(run.run_id)
        report.runs.append(PrunedRun(run, files))
    report.temp_files = take_temp_files(log_dir, store.host, dry_run)
    return report


def take_temp_files(log_dir: str | Path, host: str, dry_run: bool) -> list[str]:
    """The database temp files of killed creators (``tempfiles``), removed unless ``dry_run``."""
    take = tempfiles.abandoned_temp_files if dry_run else tempfiles.remove_abandoned_temp_files
    return [str(path) for path in take(log_dir, host)]


_AGE_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float | None:
    """``7d``, ``36h``, ``1d12h``, ``90m``, ``2w`` or a number of seconds; None if malformed."""
    text = text.strip()
    with contextlib.suppress(ValueError):
        seconds = float(text)
        return seconds if seconds >= 0 else None
    parts = _AGE_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def prune_here(log_dir: str, *, older_than_seconds: float, dry_run: bool = False) -> PruneReport:
    """``prune`` of this host's database under ``log_dir``; a missing database is not created
    (only a killed creator's temp files can be there)."""
    host = host_name()
    if not database_path(log_dir, host).exists():
        return PruneReport(dry_run, older_than_seconds, temp_files=take_temp_files(log_dir, host, dry_run))
    with Store.open(log_dir) as store:
        return prune(store, log_dir, older_than_seconds=older_than_seconds, dry_run=dry_run)
