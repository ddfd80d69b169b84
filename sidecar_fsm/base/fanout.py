"""Asking many local processes at once against one deadline: the start's verdicts, the scrapes.

Owns the one fan-out the launcher and the views share: a daemon thread per item against one
deadline, so N sidecars cost the slowest answer, and one that never answers (a SIGSTOPped
proxy) costs the deadline, not a hang. A thread still blocked then is abandoned (its socket
timeout ends it; a daemon never holds the process open) and its late result dropped. Must not
know what is asked: the work and what a missing answer means are the caller's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

K = TypeVar("K")
A = TypeVar("A")
R = TypeVar("R")


def each_by_deadline(
    items: Mapping[K, A], work: Callable[[A], R], deadline: float, *, name: str = "fanout"
) -> dict[K, R]:
    """``work(item)`` for every item, each in its own daemon thread; the results that were in
    by ``deadline`` (a ``time.monotonic()`` value), keyed like ``items``. A key is missing when
    its work had not returned by then or raised: the caller says what that means."""
    results: dict[K, R] = {}
    lock = threading.Lock()

    def run(key: K, item: A) -> None:
        outcome = work(item)
        with lock:
            results[key] = outcome

    threads = [
        threading.Thread(target=run, args=(key, item), name=f"{name} {key}", daemon=True)
        for key, item in items.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return dict(results)
