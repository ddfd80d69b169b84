"""The life cycle the lab's servers share: one asyncio loop in a daemon thread, started and stopped.

A subclass says what ``_begin`` binds and ``_shutdown`` closes; this module must not know what is
served. The thread is a daemon so a test that forgets ``stop()`` cannot hang the interpreter at
exit, but every fixture still stops it: a daemon thread killed at exit leaves its sockets to the
kernel, and a pending task in a closed loop warns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_Self = TypeVar("_Self", bound="StartStop")
_Closing = TypeVar("_Closing", bound="ClosesOnExit")
_Loop = TypeVar("_Loop", bound="LoopThread")

# How long a call into the loop may take before the caller gives up: binding, a GOAWAY to every
# connection or a shutdown take milliseconds on loopback; ten seconds means the loop is stuck.
CALL_SECONDS = 10.0
# How long ``stop`` waits for the thread once the loop is told to stop.
_JOIN_SECONDS = 10.0


class StartStop:
    """``with server:`` starts it and stops it however the block ends: a failing test leaves no
    thread or socket behind."""

    def start(self: _Self) -> _Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class Counted:
    """Totals a server bumps on its own thread and tests read from any: ``_counts`` under ``_lock``."""

    _lock: threading.Lock
    _counts: dict[str, int]

    def count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _read(self, name: str) -> int:
        with self._lock:
            return self._counts[name]


class ClosesOnExit:
    """``with client:`` closes it however the block ends (a client is open once constructed)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class LoopThread(StartStop):
    """An asyncio loop in its own thread, for a server driven from blocking code (the tests')."""

    thread_name = "sidecar-fsm-lab"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _begin(self) -> None:
        """Bind and start serving (on the loop). A failure here stops the loop and re-raises."""

    async def _shutdown(self) -> None:
        """Close every connection and server (on the loop); errors are ignored by ``stop``."""

    @property
    def running(self) -> bool:
        """True while the loop thread lives (between ``start`` and ``stop``)."""
        return self._loop is not None and self._thread is not None and self._thread.is_alive()

    def start(self: _Loop) -> _Loop:
        """Start the loop thread and run ``_begin`` on it; returns once it has. Idempotent."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        try:
            self.call(self._begin())
        except BaseException:
            self.stop()
            raise
        return self

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = CALL_SECONDS) -> Any:
        """Run ``coro`` on the loop and return its result, from any thread but the loop's own.

        Not started: ``RuntimeError``, and ``coro`` is closed so it never warns "never awaited".
        """
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{type(self).__name__}: not started; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        """Run ``_shutdown``, stop the loop, join its thread. Idempotent; a failed ``_shutdown`` is
        ignored: a stop in a failing test's cleanup must not hide its failure."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            if thread.is_alive():
                with contextlib.suppress(Exception):
                    self.call(self._shutdown())
                loop.call_soon_threadsafe(loop.stop)
                thread.join(_JOIN_SECONDS)
            # A loop still running in a thread that did not end cannot be closed; leaving it is
            # better than raising from a cleanup.
            if not thread.is_alive():
                loop.close()
        self._loop, self._thread = None, None

    @staticmethod
    async def _cancel_other_tasks() -> None:
        """Cancel every task on the loop but the caller's and wait for them: none dies pending."""
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
