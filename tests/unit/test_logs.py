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


def rotate(log: Path) -> None:
    """What the proxy does at -log-max-bytes with backups kept: PATH to PATH.1, a new PATH."""
    log.rename(log.with_name(log.name + ".1"))
    log.write_bytes(b"")


def test_follow_reads_the_rest_of_a_rotated_log_then_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "policy.log"
    log.write_bytes(b"old 1\n")
    _, offset = logs.tail(str(log), None)
    follower = logs.Follower([str(log)], [offset])
    with open(log, "ab") as handle:
        handle.write(b"old 2\nold 3\n")  # written after the last read, just before the rotation
    rotate(log)
    log.write_bytes(b"new 1\n")
    assert follower.read() == [(0, "old 2"), (0, "old 3"), (0, "new 1")]
    with open(log, "ab") as handle:
        handle.write(b"new 2\n")
    assert follower.read() == [(0, "new 2")]  # nothing read twice


def test_follow_rereads_a_log_cut_in_place(tmp_path: Path) -> None:
    log = tmp_path / "policy.log"
    log.write_bytes(b"a long first line\n")
    follower = logs.Follower([str(log)], [logs.tail(str(log), None)[1]])
    with open(log, "r+b") as handle:  # -log-backups 0: the proxy truncates PATH itself
        handle.truncate(0)
    with open(log, "ab") as handle:
        handle.write(b"cut\n")
    assert follower.read() == [(0, "cut")]


def test_follow_through_two_rotations_between_reads_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "policy.log"
    log.write_bytes(b"before\n")
    follower = logs.Follower([str(log)], [logs.tail(str(log), None)[1]])
    with open(log, "ab") as handle:
        handle.write(b"first file\n")
    (tmp_path / "policy.log.1").write_bytes(b"an older backup\n")
    (tmp_path / "policy.log.1").rename(tmp_path / "policy.log.2")
    rotate(log)
    log.write_bytes(b"middle file\n")
    (tmp_path / "policy.log.2").rename(tmp_path / "policy.log.3")
    (tmp_path / "policy.log.1").rename(tmp_path / "policy.log.2")
    rotate(log)
    log.write_bytes(b"newest\n")
    assert follower.read() == [(0, "first file"), (0, "middle file"), (0, "newest")]


def test_follow_of_a_log_rotated_past_its_backups_goes_on_with_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "policy.log"
    log.write_bytes(b"before\n")
    follower = logs.Follower([str(log)], [logs.tail(str(log), None)[1]])
    rotate(log)
    (tmp_path / "policy.log.1").unlink()  # -log-backups 1, rotated again: the file is gone
    log.write_bytes(b"newest\n")
    assert follower.read() == [(0, "newest")]
