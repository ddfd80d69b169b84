"""Writes a benchmark's figures into bench/README.md, between that benchmark's markers.

Each script under bench/ owns one section of bench/README.md, delimited by
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``; a run replaces what is between them and
nothing else, so the README's figures are always the output of the command printed beside
them. The full report (method, per-round figures, profiles) goes to ``bench/results/NAME.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "bench" / "README.md"
RESULTS = REPO / "bench" / "results"


def update_readme(name: str, markdown: str, readme: Path = README) -> None:
    """Replace the README's ``bench:NAME`` section with ``markdown``; atomic (temp + rename).

    Raises ``SystemExit`` naming the missing marker rather than appending somewhere arbitrary:
    a figure in the wrong section would be worse than none.
    """
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = readme.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{readme}: no '{begin}' ... '{end}' section; add the markers where the figures go")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    tmp = readme.with_name(f".{readme.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{head}{begin}\n{markdown.strip()}\n{end}{tail}")
    tmp.replace(readme)


def results_path(name: str) -> Path:
    """``bench/results/NAME.md``, the full report of one benchmark (created on demand)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}.md"
