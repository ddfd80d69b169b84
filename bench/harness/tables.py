"""Tables and the facts a report states about its run: number formats, plain-text and markdown
tables, the go/ revision that was built, a tool's version line, the load average.

Owns formatting only; writing a README section is ``bench.readme``'s and each benchmark owns
its rows. Must not run anything but ``git`` and a tool's version flag.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def fmt(v: float | None, nd: int = 1) -> str:
    """A figure with thousands separators; '-' for a missing one (None or NaN)."""
    return "-" if v is None or v != v else f"{v:,.{nd}f}"


def rfmt(ratio: float, targeted: bool) -> str:
    """A ratio; three decimals where a target judges it, so 0.649x never shows as 0.65x."""
    return f"{ratio:.3f}x" if targeted else f"{ratio:.2f}x"


def pf(ok: bool) -> str:
    return "yes" if ok else "NO"


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded for a terminal: the first left-aligned, the figures right-aligned."""
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub table, the figures' columns right-aligned."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def load_average() -> str:
    """The 1-minute load average, as /proc/loadavg writes it."""
    return Path("/proc/loadavg").read_text().split()[0]


def tool_version(argv: Sequence[str]) -> str:
    """The first line a tool prints for ``argv`` (its version flag); '?' when it cannot run."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"


def go_revision() -> str:
    """The last commit that touched go/, plus '+ uncommitted edits' when the tree differs: the
    figures belong to the sources that were built, which may be mid-edit."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "go"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "go"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (rev or "?") + (" + uncommitted edits" if dirty else "")
