"""``sidecar-fsm probe``'s child: the proxy binary in its ``-probe`` mode, and its JSON lines.

The probe itself is go/probe.go. Request headers go on the child's stdin and nowhere else
(never its command line, which any user can read in ``ps``). The child ends after ``--for``, or
at once when its stdin closes, which is how it is stopped early: no signal, so no ``procs``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProbeEnded", "ProbeRequest", "probe_events"]

# How long the child may take to exit once its stdin is closed.
_EXIT_SECONDS = 10.0


@dataclass(frozen=True)
class ProbeRequest:
    """What to probe: the flags of ``-probe`` and the headers for ``-request`` (kept off argv)."""

    upstream: str
    for_duration: str
    ping_interval: str | None  # None: the probe's default (60s or a quarter of for)
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    request: str | None = None
    headers: Sequence[tuple[str, str]] = field(default=(), repr=False)

    def argv(self, binary: str) -> list[str]:
        argv = [binary, "-probe", "-probe-stdin", "-upstream", self.upstream]
        argv += ["-for", self.for_duration]
        if self.ping_interval:
            argv += ["-ping-interval", self.ping_interval]
        if self.ca_file:
            argv += ["-ca-file", self.ca_file]
        if self.insecure_skip_verify:
            argv.append("-insecure-skip-verify")
        if self.request:
            argv += ["-request", self.request]
        return argv


class ProbeEnded(Exception):
    """The child exited with no result: ``exit_code`` and its stderr's first line (bad flags: 2)."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def probe_events(binary: str, request: ProbeRequest) -> Iterator[dict[str, Any]]:
    """Run the probe; yield each event (``start``, ``progress``, then ``result`` or ``error``).

    Raises ``ProbeEnded`` when the child exits without a ``result`` or ``error`` line. Closing
    the generator early ends the child and waits for it: no child outlives the call.
    """
    process = subprocess.Popen(
        request.argv(binary),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        close_fds=True,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    ended = False
    try:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(json.dumps({"headers": [list(h) for h in request.headers]}) + "\n")
            process.stdin.flush()
        for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                ended = event.get("event") in ("result", "error")
                yield event
        process.wait(_EXIT_SECONDS)
        if not ended:
            message = process.stderr.read().strip().splitlines()
            raise ProbeEnded(
                process.returncode, message[0] if message else f"exited with code {process.returncode}"
            )
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_EXIT_SECONDS)
        process.stdout.close()
        process.stderr.close()
