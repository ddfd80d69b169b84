"""The first hour of a new user (issue 30): the places that answered "fine" to a mistake.

Each test is a behaviour a user relies on, run through the real entry point (``cli.main`` in
this process, a real SQLite file, the real config and rewrite code); no child processes (the
lab, ``start`` and the README's walkthrough are ``tests/integration/test_first_run.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar_fsm.cli import main

# -- reap and prune never say "nothing to do" for a log dir that is not there ------------------

UPKEEP = [["reap"], ["reap", "--dry-run"], ["prune"], ["prune", "--dry-run"]]


@pytest.mark.parametrize("command", UPKEEP, ids=" ".join)
def test_reap_and_prune_on_a_missing_log_dir_exit_1_naming_it(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "forgot-log-dir"
    assert main(["--log-dir", str(missing), *command]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"sidecar-fsm {command[0]}: log dir '{missing}' does not exist; "
        "give the --log-dir (or SIDECAR_FSM_LOG_DIR) the run was started with\n"
    )
    assert not missing.exists()


def _a_file(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "notes.txt"
    path.write_text("not a log dir\n")
    return path, str(path)


def _state_folder_a_file(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "sidecar-fsm").write_text("not a folder\n")
    return tmp_path, str(tmp_path / "sidecar-fsm")


def _writable_by_others(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    return folder, "writable by group or others"


@pytest.mark.parametrize("unusable", [_a_file, _state_folder_a_file, _writable_by_others])
@pytest.mark.parametrize("command", UPKEEP, ids=" ".join)
def test_reap_and_prune_on_an_unusable_log_dir_exit_2_in_one_line(
    command: list[str], unusable: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert callable(unusable)
    log_dir, named = unusable(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert main(["--log-dir", str(log_dir), *command]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and named in err, err
    assert sorted(os.listdir(tmp_path)) == before


# -- prune's age needs a unit ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "says"),
    [
        ("60", "--older-than '60' has no unit; add a unit: 60s, 60m, 60h or 60d"),
        ("1.5", "--older-than '1.5' has no unit; add a unit: 1.5s, 1.5m, 1.5h or 1.5d"),
        ("-1d", "--older-than '-1d' is negative; give an age such as 7d, 36h or 90m"),
        ("-60", "--older-than '-60' is negative; give an age such as 7d, 36h or 90m"),
        ("7 days", "--older-than '7 days' is not a duration; try 7d, 36h or 90m"),
        ("1d-2h", "--older-than '1d-2h' is not a duration; try 7d, 36h or 90m"),
    ],
)
@pytest.mark.parametrize("spelled", ["separate", "joined"])
def test_prune_refuses_an_age_with_no_unit_or_a_negative_one_in_one_line(
    age: str, says: str, spelled: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    option = ["--older-than", age] if spelled == "separate" else [f"--older-than={age}"]
    assert main(["--log-dir", str(tmp_path), "prune", *option, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"sidecar-fsm prune: {says}\n")


def test_prune_with_a_unit_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-dir", str(tmp_path), "prune", "--older-than", "60s", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("nothing to prune: no run ended more than 1m")


def test_a_dash_value_of_another_option_is_still_an_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``--older-than`` takes a value that starts with a dash; ``--dry-run`` stays a flag."""
    assert main(["--log-dir", str(tmp_path), "prune", "--older-than", "--dry-run"]) == 2
    assert "--older-than: expected one argument" in capsys.readouterr().err
