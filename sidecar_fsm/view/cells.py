"""The building blocks of every table and JSON document: cells, columns, times, colour.

Must not know what a run or a reap is beyond an instance's detail cell: the shapes of each
command's output live in ``render`` and the reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sidecar_fsm.base.exitstatus import exit_cell

if TYPE_CHECKING:
    from sidecar_fsm.state.store import InstanceRecord

UNKNOWN = "-"

# ANSI SGR codes. Colour is decoration only: the state name is always printed in full, so a log
# file, a pipe or a colour-blind reader loses nothing.
_STYLE_CODES = {
    "green": "32",
    "red": "31",
    "yellow": "33",
    "dim": "2",
    "bold": "1",
}
STATE_STYLES = {
    "configured": "dim",
    "building": "yellow",
    "spawned": "yellow",
    "ready": "green",
    "draining": "yellow",
    "stopped": "dim",
    "failed": "red",
}
OWNER_STYLES = {"alive": "green", "dead": "red", "reused": "red", "unproven": "yellow"}

# --------------------------------------------------------------------------------- formatting


def format_age(seconds: float | None) -> str:
    """A short, coarse duration: ``41s``, ``3m12s``, ``2h05m``, ``3d04h``, ``7d`` (a zero second
    part is dropped); ``-`` when unknown.

    Clock steps can make a stored time lie in the future; that reads as ``0s``, not a negative.
    """
    if seconds is None:
        return UNKNOWN
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    unit, first, second, rest = (
        (60, "m", "s", 1) if s < 3600 else (3600, "h", "m", 60) if s < 86400 else (86400, "d", "h", 3600)
    )
    part = s % unit // rest
    return f"{s // unit}{first}" + (f"{part:02d}{second}" if part else "")


def format_elapsed(seconds: float) -> str:
    """Offset from the first transition of a history: ``+0.000s``, ``+1.234s``, ``+3m12s``."""
    if seconds < 60:
        return f"+{max(0.0, seconds):.3f}s"
    return "+" + format_age(seconds)


def format_local_time(ts: float | None, *, seconds: bool = False) -> str:
    """Wall-clock time in the local zone for people (``2026-11-30 12:03``); ``-`` when unknown."""
    if ts is None:
        return UNKNOWN
    moment = datetime.fromtimestamp(ts)
    if seconds:
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return moment.strftime("%Y-%m-%d %H:%M")


def iso_utc(ts: float | None) -> str | None:
    """ISO-8601 UTC with microseconds and a ``Z`` (the JSON form); ``None`` stays ``null``."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short_run_id(run_id: str) -> str:
    """The first 12 characters: unique in practice, and ``history`` accepts any unique prefix."""
    return run_id[:12]


def first_line(text: str | None) -> str | None:
    if not text:
        return None
    return text.strip().splitlines()[0] if text.strip() else None


def instance_detail(instance: InstanceRecord) -> str:
    """The free-text column: ``exit 1: bind: address already in use``, restarts, or ``-``.

    Only the first line of a stored error is shown; the JSON and ``history`` keep all of it.
    """
    parts: list[str] = []
    error = first_line(instance.error)
    if instance.exit_code is not None:
        ended = exit_cell(instance.exit_code)  # "killed by SIGKILL", not "exit -9"
        parts.append(f"{ended}: {error}" if error else ended)
    elif error:
        parts.append(error)
    if instance.restart_count:
        parts.append(f"{instance.restart_count} restart{'s' if instance.restart_count != 1 else ''}")
    return "; ".join(parts) or UNKNOWN


# ------------------------------------------------------------------------------------- tables


Cell = tuple[str, "str | None"]


def styled(text: str, style: str | None, color: bool) -> str:
    if not color or not style or not text:
        return text
    return f"\x1b[{_STYLE_CODES[style]}m{text}\x1b[0m"


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Cell]],
    *,
    indent: str = "",
    color: bool = False,
) -> list[str]:
    """Lines of a table whose columns are padded to the widest value (header included).

    A cell is a string or ``(text, style)``; styles are applied after padding, so escape codes
    never skew the alignment. The last column is free text and is not padded (no trailing
    blanks). Empty strings become ``-``.
    """
    matrix: list[list[Cell]] = [[(h, "bold") for h in headers]]
    for row in rows:
        normalized: list[Cell] = []
        for cell in row:
            text, style = (cell, None) if isinstance(cell, str) else cell
            normalized.append((text if text != "" else UNKNOWN, style))
        matrix.append(normalized)
    widths = [max(len(row[i][0]) for row in matrix) for i in range(len(headers))]
    lines = []
    for row in matrix:
        parts = []
        for i, (text, style) in enumerate(row):
            padded = text if i == len(row) - 1 else text.ljust(widths[i])
            # Style only the text, not the padding, so underlines/backgrounds stay tight.
            parts.append(styled(text, style, color) + padded[len(text) :])
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines


def dumps(document: Mapping[str, Any]) -> str:
    """The one JSON document a ``--json`` command prints: sorted keys, so diffs stay small."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)
