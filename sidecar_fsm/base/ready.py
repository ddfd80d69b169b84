"""The ready-file protocol, launcher side: mirrors ``go/ready.go``.

sidecar-fsm's proxy binds, then renames in a JSON file (the ``ready_file`` keys its
``-describe`` lists), so a reader sees no file or the whole file; it counts only when its pid is
the child's. NeMo Gym's writes its bare pid in place, which counts when it is the child's pid or
a whole line (Gym's test doubles write ``1``; a ready path is unique to its run): a partial read
never does. Its listen is the configured address.

Words in a file are not enough: whoever can write the log dir could name the child's pid and a
port of their own, so every address a JSON file names must be a socket the child itself listens
on (``procs.listens_on``), or the child is refused. The proxy binds before it writes.

Owns reading that file and waiting for many children at once. Must not spawn, signal or remove
anything: the caller owns the processes and the files (``temp_files``).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from dataclasses import dataclass, field

from sidecar_fsm.base import procs

# How often a wait re-reads the files: a proxy takes several of these to start, and a shorter
# poll only burns the cores the proxies are starting on.
POLL_SECONDS = 0.005


@dataclass(frozen=True)
class ReadyInfo:
    """The content of a ready file: who wrote it, the address it bound, its metrics address and
    its upstream's route if it says (a binary of NeMo Gym's says neither)."""

    pid: int
    listen: str
    metrics: str | None = None
    route: str | None = None
    # False for a bare pid, whose ``listen`` is the configured address, not words from the file.
    named: bool = field(default=True, compare=False)


@dataclass
class ReadyWait:
    """One child to wait for; ``listen`` is the configured address, reported for a bare pid."""

    name: str
    ready_path: str
    process: subprocess.Popen[bytes]
    listen: str | None = None


@dataclass
class ReadyOutcome:
    """How the wait for one child ended: exactly one of ``info``, ``exit_code``, ``timed_out``,
    ``refused`` (one line: its ready file names an address the child does not listen on)."""

    name: str
    info: ReadyInfo | None
    exit_code: int | None
    timed_out: bool
    refused: str | None = None


def temp_files(ready_path: str) -> list[str]:
    """The temp files (``.<name>.tmp-<random>``) beside ``ready_path`` a proxy that died mid-write
    left; whoever removes the ready file removes them too."""
    directory, base = os.path.split(ready_path)
    return glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}.tmp*"))


def read_ready_file(path: str | os.PathLike[str], pid: int, listen: str | None = None) -> ReadyInfo | None:
    """The ready file at ``path`` if it names ``pid``; None if missing, partial, malformed or not ``pid``'s.

    JSON must carry ``pid`` and a non-empty ``listen``. A bare pid needs ``listen`` (the
    configured address); a writer caught half-way has written fewer digits and no newline.
    """
    try:
        with open(path, "rb") as file:
            text = file.read().decode()
    except (OSError, UnicodeDecodeError):
        return None
    bare = text.strip()
    if bare.isascii() and bare.isdigit():
        whole = int(bare) == pid or (text.endswith("\n") and int(bare) > 0)
        return ReadyInfo(pid, listen, named=False) if whole and listen else None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    # bool is an int subclass: {"pid": true} is not a pid.
    found, bound = data.get("pid"), data.get("listen")
    if not isinstance(found, int) or isinstance(found, bool) or found != pid:
        return None
    if not isinstance(bound, str) or not bound:
        return None
    return ReadyInfo(pid, bound, _text(data.get("metrics")), _text(data.get("route")))


def _text(value: object) -> str | None:
    """``value`` if it is a non-empty string (an optional key), else None."""
    return value if isinstance(value, str) and value else None


def address_refusal(path: str, info: ReadyInfo) -> str | None:
    """One line if an address ``info`` names is not a socket ``info.pid`` itself listens on; else None
    (always for a bare pid). It says nothing of who does listen there: maybe another user."""
    if not info.named:
        return None
    for what, address in (("listen", info.listen), ("metrics", info.metrics)):
        if address and not procs.listens_on(info.pid, address):
            return (
                f"ready file '{path}': {what} address {address} is not a socket pid {info.pid} "
                "listens on; refusing it (another process wrote the file or holds the port): "
                "check who can write the log dir"
            )
    return None


def wait_all_ready(waits: list[ReadyWait], timeout: float) -> dict[str, ReadyOutcome]:
    """Wait for every child at once until each is ready, has exited, or ``timeout`` seconds passed.

    One outcome per name. A child that exits is reaped and its code reported (a dead child is
    not ready, whatever its file says); a ``refused`` one is left running for the caller. The
    last look is after the deadline, so a file that appeared just in time wins. Raises
    ``ValueError`` for duplicate names.
    """
    names = [wait.name for wait in waits]
    if len(set(names)) != len(names):
        raise ValueError(f"wait_all_ready: duplicate names in {names}; names must be unique")
    deadline = time.monotonic() + timeout
    outcomes: dict[str, ReadyOutcome] = {}
    pending = {wait.name: wait for wait in waits}
    while True:
        for name, wait in list(pending.items()):
            code = wait.process.poll()
            info = (
                None if code is not None else read_ready_file(wait.ready_path, wait.process.pid, wait.listen)
            )
            refused = None if info is None else address_refusal(wait.ready_path, info)
            if refused is not None:
                outcomes[name] = ReadyOutcome(name, None, None, False, refused)
                del pending[name]
            elif code is not None or info is not None:
                outcomes[name] = ReadyOutcome(name, info, code, False)
                del pending[name]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            break
        time.sleep(min(POLL_SECONDS, remaining))
    for name in pending:
        outcomes[name] = ReadyOutcome(name, None, None, True)
    return {name: outcomes[name] for name in names}
