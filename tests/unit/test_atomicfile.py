"""The one temp-and-rename of the package's small files, and the sweep of a killed writer's temps."""

from __future__ import annotations

import os
from pathlib import Path

from sidecar_fsm.base import atomicfile


def test_a_write_replaces_the_whole_file_with_the_mode_asked_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "host.json"
    target.write_text("old")
    previous = os.umask(0o077)
    try:
        atomicfile.write_atomically(target, "new\n", mode=0o644)
    finally:
        os.umask(previous)
    assert target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host.json"]  # no temp left behind


def test_a_killed_writers_temp_is_swept_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "host.json"
    atomicfile.write_atomically(target, "[]\n")
    # What a writer SIGKILLed between its temp file and the rename leaves.
    stale = tmp_path / (atomicfile.temp_prefix(target) + "k3x9")
    stale.write_text("[half")
    other = tmp_path / ".other.json.tmp-k3x9"
    other.write_text("not ours")
    atomicfile.remove_stale_temps(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.tmp-k3x9", "host.json"]
    assert target.read_text() == "[]\n"
