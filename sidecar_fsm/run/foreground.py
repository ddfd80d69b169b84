"""Running a started set of sidecars in the foreground until a signal or a failure.

Owns the signals of ``sidecar-fsm start`` from its first spawn to its last drain, and its wait:
``check()`` every interval, woken at once by SIGINT or SIGTERM through a self-pipe. Once the
start has returned the handler only records the signal and writes a byte, so nothing runs in a
handler that could interleave badly with ``check()``'s database writes. Stopping the sidecars,
printing and exit codes are the caller's.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import CodeType, FrameType

from sidecar_fsm.errors import SidecarError

# How often ``check()`` asks whether a sidecar stopped. A signal wakes the wait at once, so this
# bounds only how late a crashed sidecar is noticed.
CHECK_INTERVAL_SECONDS = 0.5

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Signals:
    """The stop signals received while :func:`catching_stop_signals` is active, oldest first;
    ``raise_in``: see there."""

    received: list[signal.Signals] = field(default_factory=list)
    raise_in: CodeType | None = None
    _wake_fd: int = -1
    _read_fd: int = -1

    def wait(self, timeout: float) -> None:
        """Return after ``timeout`` seconds or as soon as a signal arrives, whichever is first."""
        with contextlib.suppress(InterruptedError):
            select.select([self._read_fd], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            os.read(self._read_fd, 64)


class Interrupted(KeyboardInterrupt):
    """A stop signal raised where ``Signals.raise_in`` runs; its text is the signal's name."""


@contextlib.contextmanager
def catching_stop_signals(raise_in: CodeType | None = None) -> Iterator[Signals]:
    """SIGINT and SIGTERM recorded in a :class:`Signals` instead of raising; handlers restored
    on exit. Main thread only (Python delivers signals there).

    ``raise_in`` (e.g. ``start_h2_ping_sidecar.__code__``): a signal that arrives while that
    function runs (anywhere up the stack) is also raised there as :class:`Interrupted`, so it
    cleans up as for Ctrl-C; one after it returned is only recorded, so the manager it returns
    is never lost. One handler throughout: no moment when a signal meets the default. A SIGINT
    ignored when this begins (a background job, ``nohup``) stays ignored, as POSIX intends.
    """
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signals = Signals(raise_in=raise_in, _wake_fd=write_fd, _read_fd=read_fd)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.received.append(signal.Signals(signum))
        with contextlib.suppress(BlockingIOError):
            os.write(write_fd, b"!")
        if signals.raise_in is not None and _running(frame, signals.raise_in):
            raise Interrupted(signal.Signals(signum).name)

    caught = [sig for sig in STOP_SIGNALS if not _ignored_from_the_start(sig)]
    previous = {sig: signal.signal(sig, on_signal) for sig in caught}
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(read_fd)
        os.close(write_fd)


def _ignored_from_the_start(sig: signal.Signals) -> bool:
    return sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN


def _running(frame: FrameType | None, code: CodeType) -> bool:
    """True if ``code`` runs in ``frame`` or any frame that called it."""
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def watch_until_signal(
    check: Callable[[], None], signals: Signals, interval: float = CHECK_INTERVAL_SECONDS
) -> SidecarError | None:
    """Call ``check()`` every ``interval`` until a stop signal arrives or it raises; the
    ``SidecarError`` that ended the watch, or None when a signal did (``signals.received``)."""
    while not signals.received:
        try:
            check()
        except SidecarError as error:
            return error
        signals.wait(interval)
    return None
