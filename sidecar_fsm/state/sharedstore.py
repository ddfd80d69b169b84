"""This process's open ``Store`` per log dir, and this process's identity as a run's owner.

Owns the per-process cache of open host databases (closed at interpreter exit) and reading the
owner's pid and start time once. Must not write anything itself: runs and instances are written
by ``supervise`` through ``fsm`` and ``store``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from sidecar_fsm.base import procs
from sidecar_fsm.state.storagefault import RecordWatch
from sidecar_fsm.state.store import Store

_shared_stores: dict[tuple[int, str], tuple[Store, RecordWatch]] = {}
_shared_stores_lock = threading.Lock()
_owner_identities: dict[int, procs.ProcessIdentity | None] = {}


def shared_store(log_dir: str) -> Store:
    """This process's ``Store`` for ``log_dir``'s host database, opened once and kept open.

    Opening takes the migration lock and closing a WAL database's last connection checkpoints it,
    so a process starting many runs keeps one connection. Keyed by pid: a forked child must not
    use its parent's SQLite handle. A file removed or replaced since (a log dir cleaned between
    runs) is opened anew: writing to the unlinked file would hide the run from every reader.
    """
    key = (os.getpid(), os.path.realpath(log_dir))
    with _shared_stores_lock:
        cached = _shared_stores.get(key)
        if cached is not None:
            store, watch = cached
            if watch.lost() is None:
                return store
            with contextlib.suppress(Exception):
                store.close()
        store = Store.open(log_dir)
        watch = RecordWatch.of(store.path)
        if watch.identity is not None:
            _shared_stores[key] = (store, watch)
        return store


def owner_identity() -> procs.ProcessIdentity | None:
    """This process's identity (pid, start time), read once per process: it cannot change."""
    pid = os.getpid()
    if pid not in _owner_identities:
        _owner_identities[pid] = procs.identity_of(pid)
    return _owner_identities[pid]


@atexit.register
def _close_shared_stores() -> None:
    with _shared_stores_lock:
        for (pid, _), (store, _file) in list(_shared_stores.items()):
            if pid == os.getpid():
                with contextlib.suppress(Exception):
                    store.close()
        _shared_stores.clear()
