"""The host name that names this host's state database (``<log_dir>/sidecar-fsm/<host>.db``).

Owns one decision: which name a host's launcher, reaper and readers use for "this host". It is
``socket.gethostname()`` unless ``SIDECAR_FSM_HOST`` is set, which lets several nodes that share
one machine (a local Ray cluster, a test) keep one database each, as separate machines would.
Must not open files or import anything heavier than the standard library: ``cluster`` calls it
on every Ray node.
"""

from __future__ import annotations

import os
import re
import socket

from sidecar_fsm.errors import ConfigError

HOST_ENV = "SIDECAR_FSM_HOST"

# The name becomes a file name in a directory every host shares: no separators, no dot-only names.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def host_name() -> str:
    """``$SIDECAR_FSM_HOST`` when set and non-empty, else ``socket.gethostname()``.

    Raises ``ConfigError`` for a value that could not be a database file name of its own
    (``a/b``, ``..``): it would write another host's database, or outside the log dir.
    """
    chosen = os.environ.get(HOST_ENV, "")
    if not chosen:
        return socket.gethostname()
    if not _HOST_NAME.fullmatch(chosen):
        raise ConfigError(f"{HOST_ENV}: '{chosen}' is not a host name; use letters, digits, '.', '-' or '_'")
    return chosen
