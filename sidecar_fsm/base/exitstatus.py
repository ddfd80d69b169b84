"""How a process ended, in words: ``exited with code 1`` or ``killed by SIGKILL``, never ``-9``.

Owns turning a ``Popen.returncode`` (negative: the signal that ended it) into the words every
console line, status cell and history detail uses, so no output shows Python's private
convention. Must not read or signal processes.
"""

from __future__ import annotations

import signal


def signal_name(code: int) -> str | None:
    """``SIGKILL`` for ``-9``; None for a normal exit. An unknown number reads ``signal 77``."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def ended_words(code: int) -> str:
    """The sentence form: ``exited with code 1``, ``killed by SIGKILL``."""
    name = signal_name(code)
    return f"killed by {name}" if name else f"exited with code {code}"


def exit_cell(code: int) -> str:
    """The short form, for a column or a detail: ``exit 1``, ``killed by SIGKILL``."""
    name = signal_name(code)
    return f"killed by {name}" if name else f"exit {code}"
