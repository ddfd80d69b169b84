"""The ``top`` display: one frame of text redrawn in place on a terminal until Ctrl-C (printed
frame after frame into a pipe or a log, where nothing can be redrawn).

On Ctrl-C (or SIGTERM) the terminal is restored and the exit code is 0: stopping ``top`` is
how it is meant to end. Must not read state or lay out figures: ``frame()`` gives each frame.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from rich.console import Console
from rich.live import Live
from rich.text import Text

__all__ = ["show"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _text(frame: str) -> Text:
    # Lines cut at the terminal's width, as top does: wrapped table rows would no longer line
    # up under their headers.
    return Text.from_ansi(frame, no_wrap=True, overflow="ellipsis")


def show(frame: Callable[[], str], interval: float, console: Console | None = None) -> int:
    """Draw ``frame()`` now and every ``interval`` seconds until Ctrl-C or SIGTERM; then 0.

    On a terminal each frame replaces the last; elsewhere (a pipe, a log file, ``TERM=dumb``)
    there is nothing to redraw, so frames follow one another with a blank line between, as
    ``top -b`` prints them. The first frame is built before the terminal is taken over, so an
    error in it (an unknown run, an unusable log dir) is printed as the command's one line, not
    inside a live region. An error in a later frame stops the display (terminal restored) and
    propagates.
    """
    first = frame()
    console = console or Console()
    # SIGTERM (a closed terminal, a process manager) ends it like Ctrl-C: the terminal is
    # restored by the display's exit, which a default SIGTERM death would skip.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if console.is_terminal and not console.is_dumb_terminal:
            _redraw(first, frame, interval, console)
        else:
            _append(first, frame, interval)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _redraw(first: str, frame: Callable[[], str], interval: float, console: Console) -> NoReturn:
    with Live(
        _text(first),
        console=console,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as live:
        while True:
            # Pacing between frames, not ordering: a frame shows what is true when it is built.
            time.sleep(interval)
            live.update(_text(frame()), refresh=True)


def _append(first: str, frame: Callable[[], str], interval: float) -> NoReturn:
    text = first
    while True:
        print(text + "\n", flush=True)
        time.sleep(interval)
        text = frame()
