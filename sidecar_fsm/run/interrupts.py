"""Holding SIGINT and SIGTERM across the few lines that must not be cut in half.

Owns ``interrupts_deferred``: around "create a process, remember it" and "rewrite the caller's
config", an exception raised by a signal handler would leave a sidecar nothing knows or a config
half rewritten. Must not decide anything about processes or state; it only delays handlers.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

_DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the body; then run their handlers for what arrived, in order.

    Only Python-level handlers are held (a default or ignored disposition raises nothing to
    defer), and only in the main thread, where Python runs them. Keep the body short: the
    caller's Ctrl-C waits for it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    held: dict[int, Any] = {}
    try:
        for deferred in _DEFERRED_SIGNALS:
            if callable(signal.getsignal(deferred)):
                held[deferred] = signal.signal(deferred, hold)
        yield
    finally:
        for restored, handler in held.items():
            signal.signal(restored, handler)
        # With the frame it runs in (this one, called from the body's ``with``), as Python
        # would pass it: a handler may judge by it where the program is (the CLI's start does).
        here = sys._getframe()
        for arrived in pending:
            held[arrived](arrived, here)
