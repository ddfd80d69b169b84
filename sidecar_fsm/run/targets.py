"""The Prometheus file_sd target file of a host: every live sidecar with metrics, one entry each.

Owns ``<log_dir>/sidecar-fsm/prometheus/<host>.json`` (SPEC, "Prometheus"), rewritten at every
start, restart, stop and reap with exactly the sidecars ``status`` scrapes, so a start also drops
the targets a launcher killed with -9 left. Written atomically (a temp name not ending in
``.json``) under a file lock with the database read inside it: otherwise two runs stopping at
once could rename an older reading over a newer one. A file that cannot be written costs
Prometheus its targets, never the run its sidecars: ``refresh`` returns a warning.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from filelock import FileLock, Timeout

from sidecar_fsm.base import atomicfile, trust
from sidecar_fsm.observe.verdicts import metrics_claimed, metrics_proven, process_of
from sidecar_fsm.state.store import Store

__all__ = ["refresh", "target_entries", "target_file"]

PROMETHEUS_DIR_NAME = "prometheus"
# Rewrites take milliseconds; a lock held longer belongs to a stuck process, and a stale file
# until the next rewrite is better than a start or stop that waits on it.
_LOCK_SECONDS = 10.0


def target_file(store: Store) -> Path:
    """``<log_dir>/sidecar-fsm/prometheus/<host>.json`` for ``store``'s host (beside its database)."""
    return store.path.parent / PROMETHEUS_DIR_NAME / f"{store.host}.json"


def _upstream_label(upstream: str) -> str:
    """``host[:port]`` of a recorded upstream (stored without userinfo or query)."""
    parts = urlsplit(upstream)
    return parts.netloc.rpartition("@")[2] or upstream


def target_entries(store: Store) -> list[dict[str, Any]]:
    """The file's content now: one entry per sidecar recorded serving ``/metrics`` whose process
    is still ours and itself listens on the address (``observe.verdicts``: a dead one's port may
    belong to someone else). Read-only."""
    return [
        {
            "targets": [inst.metrics],
            "labels": {
                "run": inst.run_id,
                "sidecar": inst.name,
                "upstream": _upstream_label(inst.upstream),
                "host": store.host,
            },
        }
        for inst in store.metrics_targets()
        if metrics_claimed(inst, process_of(store.host, inst)) and metrics_proven(inst)
    ]


def refresh(store: Store) -> str | None:
    """Rewrite ``store``'s host's target file from what runs now; None, or the one-line warning
    (also printed on stderr) when it could not be. Idempotent; a file or database read that
    fails never raises."""
    path = target_file(store)
    try:
        # Readable by all (a Prometheus server of another user must list it), written by us only,
        # whatever the umask.
        for made in trust.make_dirs(path.parent):
            os.chmod(made, trust.DIR_MODE)
        lock = path.parent / f".{path.name}.lock"
        with FileLock(str(lock), timeout=_LOCK_SECONDS, mode=trust.FILE_MODE):
            # Under the lock every writer takes, a temp file left here is a killed writer's.
            atomicfile.remove_stale_temps(path)
            entries = target_entries(store)
            atomicfile.write_atomically(path, json.dumps(entries, indent=2) + "\n", mode=trust.FILE_MODE)
    except (OSError, Timeout, RuntimeError) as exc:
        warning = f"WARNING: Prometheus target file {path} not rewritten: {exc}"
        print(warning, file=sys.stderr, flush=True)
        return warning
    return None
