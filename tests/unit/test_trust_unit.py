"""``trust``'s judgements on folders and files this user owns, by mode alone (no root needed).

Ownership by another user needs root to set up: ``tests/integration/test_trust.py`` covers it,
with the launcher and the CLI around each check.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar_fsm.base import trust
from sidecar_fsm.errors import ConfigError, UnusableStateError


def _binary(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "h2-ping-sidecar"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("mode", "trusted"),
    # Group-writable (0o775) depends on who else is in the group: test_trust_groups.py, with real
    # users and groups made for it.
    [(0o700, True), (0o755, True), (0o757, False), (0o777, False), (0o1777, False)],
)
def test_a_log_dir_is_trusted_only_when_no_group_or_other_can_write_it(
    tmp_path: Path, mode: int, trusted: bool
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    log_dir.chmod(mode)
    problem = trust.log_dir_problem(log_dir)
    if trusted:
        assert problem is None
        return
    assert problem is not None and "\n" not in problem
    owner = trust.owner_name(os.geteuid())
    assert problem.startswith(
        f"log dir '{log_dir}' (owner {owner}, mode {mode:04o}) is writable by group or others"
    )
    with pytest.raises(UnusableStateError):
        trust.check_log_dir(log_dir)


def test_a_missing_log_dir_is_no_problem_and_a_loose_state_folder_inside_is(tmp_path: Path) -> None:
    assert trust.log_dir_problem(tmp_path / "not-yet") is None
    state = tmp_path / "logs" / "sidecar-fsm"
    state.mkdir(parents=True)
    state.chmod(0o777)
    problem = trust.log_dir_problem(tmp_path / "logs", str(state))
    assert problem is not None and problem.startswith(f"log dir '{tmp_path / 'logs'}': '{state}' (owner ")


def test_make_dirs_makes_folders_others_cannot_write_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        made = trust.make_dirs(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(previous)
    assert made == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert {path.stat().st_mode & 0o777 for path in made} == {0o755}
    assert trust.make_dirs(tmp_path / "a") == []
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        trust.make_dirs(tmp_path / "file")


def test_a_binary_is_judged_from_its_root_down(tmp_path: Path) -> None:
    binary = _binary(tmp_path / "cache" / "h2-ping-sidecar" / "abc")
    assert trust.binary_problem(binary) is None
    (tmp_path / "cache").chmod(0o777)
    me = trust.owner_name(os.geteuid())
    loose = f"'{tmp_path / 'cache'}' (owner {me}, mode 0777) is writable by group or others"
    assert trust.binary_problem(binary) == loose
    # From the cache root down, a folder above the root is not the cache's to judge.
    assert trust.binary_problem(binary, tmp_path / "cache" / "h2-ping-sidecar") is None
    (tmp_path / "cache").chmod(0o1777)  # sticky: no one else can rename what is in it
    assert trust.binary_problem(binary) is None
    binary.chmod(0o757)
    with pytest.raises(ConfigError) as caught:
        trust.check_binary("sidecar.binary", binary)
    assert str(caught.value).startswith(f"sidecar.binary: '{binary}': '{binary}' (owner ")
    assert "mode 0757) is writable by group or others" in str(caught.value)


def test_a_symlinked_binary_is_judged_along_both_paths(tmp_path: Path) -> None:
    real = _binary(tmp_path / "real")
    links = tmp_path / "links"
    links.mkdir()
    link = links / "h2-ping-sidecar"
    link.symlink_to(real)
    assert trust.binary_problem(link) is None
    (tmp_path / "real").chmod(0o777)  # where the link leads, others could swap the file
    problem = trust.binary_problem(link)
    assert problem is not None and problem.startswith(f"'{tmp_path / 'real'}' (owner ")
