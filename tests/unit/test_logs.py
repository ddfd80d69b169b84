"""Reading a proxy's log: the last N lines and a follow both give whole lines only."""

from __future__ import annotations

from pathlib import Path

from sidecar_fsm.view import logs


def test_tail_and_follow_read_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"one\ntwo\nthree\npart")
    lines, offset = logs.tail(str(log), 2)
    assert lines == ["two", "three"]
    follower = logs.Follower([str(log), str(tmp_path / "missing.log")], [offset, 0])
    assert follower.read() == []  # "part" has no newline yet
    with open(log, "ab") as handle:
        handle.write(b"ial\nfour\n")
    assert follower.read() == [(0, "partial"), (0, "four")]
    assert logs.tail(str(tmp_path / "missing.log"), None) == ([], 0)
    assert logs.prefixed("judge", "x", 6) == "judge  | x"
