"""Waiting on a condition with a deadline, and the error a benchmark phase fails with.

Owns the one ``wait_until`` of bench/ (the tests have theirs in tests/helpers.py, which bench
must not import). Must not sleep to order events: every wait is on a condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# A ready file or a listening port shows within milliseconds; 5 ms keeps the poll from taking a
# visible share of one of this machine's two cores while the process being waited for starts.
_POLL_SECONDS = 0.005


class BenchError(RuntimeError):
    """A phase could not run (missing tool, a child that did not start): that phase is reported
    as failed, its children are ended and the next phase runs."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *, poll: float = _POLL_SECONDS) -> T:
    """Poll ``predicate`` every ``poll`` seconds until it returns something truthy; return that value.

    Raises ``BenchError`` naming ``what`` when ``timeout`` passes; an exception from
    ``predicate`` propagates at once (a child that died is not a wait). The last call happens
    after the deadline, so a condition that became true just in time wins. A costly predicate
    (a scan of every process) takes a longer ``poll``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchError(f"{what}: not ready after {timeout:g}s")
        time.sleep(poll)
