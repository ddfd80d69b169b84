"""The first hour of a new user (issue 30): the places that answered "fine" to a mistake.

Each test is a behaviour a user relies on, run through the real entry point (``cli.main`` in
this process, a real SQLite file, the real config and rewrite code); no child processes (the
lab, ``start`` and the README's walkthrough are ``tests/integration/test_first_run.py``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import missing_log_dir_line
from omegaconf import OmegaConf

from sidecar_fsm.cli import build_parser, main
from sidecar_fsm.config import h2_ping_sidecar_config_from_global_config
from sidecar_fsm.configfile import EXAMPLE_CONFIG, EXAMPLE_MODEL_BASE_URL
from sidecar_fsm.errors import ConfigWarning
from sidecar_fsm.run import messages
from sidecar_fsm.state import query
from sidecar_fsm.state.store import InstanceRecord, RunRecord, Store
from sidecar_fsm.view import cells, upkeep_report

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
    assert err == missing_log_dir_line(command[0], missing)
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
    assert err.startswith(f"sidecar-fsm {command[0]}: "), err  # the command first, not a path
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize(
    "command", [["status"], ["query", "SELECT 1"], ["history", "x"], ["reap"]], ids=" ".join
)
def test_a_log_dir_through_a_file_is_exit_2_naming_the_command_and_the_file(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("")
    assert main(["--log-dir", str(tmp_path / "afile" / "sub"), *command]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"sidecar-fsm {command[0]}: log dir '{tmp_path}/afile/sub': '{tmp_path}/afile' is a file, "
        "not a directory; use another --log-dir\n"
    )


def test_reap_on_an_empty_log_dir_says_no_run_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--log-dir", str(tmp_path), "reap"]) == 0
    assert capsys.readouterr().out == "nothing to reap: no run is recorded on this host\n"


def test_query_help_lists_every_view_and_points_at_nothing_the_wheel_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"(views: {', '.join(query.VIEWS)};" in shown and "docs/" not in shown, shown


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


# -- query: refusals in the user's words, and the schema lists the views ------------------------


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("DROP VIEW run_summary", "'DROP VIEW run_summary' would change the schema: writes are refused"),
        (
            "CREATE TEMP TABLE notes (x)",
            "'CREATE TEMP TABLE notes (x)' would change the schema: writes are refused",
        ),
        (
            "CREATE VIEW mine AS SELECT 1",
            "'CREATE VIEW mine AS SELECT 1' would change the schema: writes are refused",
        ),
        ("DELETE FROM h0.runs", "'DELETE FROM h0.runs' would delete from 'runs': writes are refused"),
    ],
)
def test_a_refused_query_says_writes_are_refused_never_an_internal_table(
    sql: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Store.open(tmp_path, host="node-a").close()
    assert main(["--log-dir", str(tmp_path), "query", sql]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"sidecar-fsm query: {says}; query runs one read-only SELECT (or WITH)\n"
    assert "sqlite_" not in err


def test_sqlite_master_lists_the_views_and_they_still_read_every_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for host in ("node-a", "node-b"):
        with Store.open(tmp_path, host=host) as store:
            store.create_run("run-" + host, owner_pid=os.getpid(), owner_start_time=None, config_summary={})
    assert main(["--log-dir", str(tmp_path), "query", "SELECT type, name FROM sqlite_master", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["type"], row["name"]) for row in listed] == [("view", view) for view in query.VIEWS]
    result = query.run_query(tmp_path, "SELECT host, run_id FROM run_summary ORDER BY host")
    assert result.rows == [("node-a", "run-node-a"), ("node-b", "run-node-b")]


def test_status_shows_the_run_that_ended_last_not_the_one_started_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A serves; a second start (B) fails on A's busy port and ends at once; then A's proxy dies
    # and A fails: the run an operator asks about is A, which ended last.
    with Store.open(tmp_path, host="node-a") as store:
        store.create_run("run-served", owner_pid=os.getpid(), owner_start_time=None, config_summary={})
        store.create_run("run-busy-port", owner_pid=os.getpid(), owner_start_time=None, config_summary={})
        store.end_run("run-busy-port", "failed")
        store.end_run("run-served", "failed")
    assert main(["--log-dir", str(tmp_path), "status", "--json"]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)["runs"]] == ["run-served"]


# -- the global --json help names every command that takes it --------------------------------------


def test_the_global_json_help_names_every_command_that_takes_it() -> None:
    parser = build_parser()
    (json_help,) = re.findall(r"--json\s+machine-readable output \(([^)]*)\)", parser.format_help())
    named = [name.strip() for name in json_help.split(",")]
    commands = next(action for action in parser._actions if action.dest == "command").choices
    assert isinstance(commands, dict)
    taking = [name for name, command in commands.items() if "--json" in command.format_help()]
    assert named == taking
    assert {"status", "history", "reap", "prune", "query"} <= set(named)


# -- an exit by signal reads as the signal's name; stop says how long it waited ------------------


def _run(**overrides: object) -> RunRecord:
    fields: dict[str, object] = {
        "run_id": "4c1e9a3f2b10",
        "host": "vm",
        "owner_pid": 41022,
        "owner_start_time": None,
        "started_at": 1_800_000_000.0,
        "ended_at": 1_800_000_600.0,
        "outcome": "ended",
        "config_summary": {},
    }
    return RunRecord(**{**fields, **overrides})  # type: ignore[arg-type]


def _instance(**overrides: object) -> InstanceRecord:
    fields: dict[str, object] = {
        "id": 1,
        "run_id": "4c1e9a3f2b10",
        "name": "policy",
        "listen": "127.0.0.1:1250",
        "upstream": "https://api.example.com",
        "state": "failed",
        "state_since": 1_800_000_600.0,
        "pid": None,
        "pid_start_time": None,
        "binary": None,
        "log_path": None,
        "ready_path": None,
        "exit_code": -9,
        "error": "h2-ping-sidecar 'policy' (run 4c1e9a3f2b10): exited with code 137 (killed by SIGKILL)",
        "restart_count": 2,
    }
    return InstanceRecord(**{**fields, **overrides})  # type: ignore[arg-type]


def test_a_signal_reads_as_its_name_in_status_detail_and_in_the_stop_report() -> None:
    killed = _instance()
    assert cells.instance_detail(killed).startswith("killed by SIGKILL: h2-ping-sidecar 'policy'")
    assert cells.instance_detail(killed).endswith("; 2 restarts")
    assert cells.instance_detail(_instance(exit_code=1, error=None, restart_count=0)) == "exit 1"
    head, _, row, clean = upkeep_report.stopped_lines(
        _run(),
        [killed, _instance(name="judge", state="stopped", exit_code=0, error=None, restart_count=0)],
        2.04,
    )
    assert head == "run 4c1e9a3f2b10 ended; stop waited 2.0s for it to close"
    assert row.split()[:3] == ["policy", "failed", "SIGKILL"]
    assert clean.split()[:4] == ["judge", "stopped", "0", "exit"]
    assert "-9" not in "\n".join([head, row, cells.instance_detail(killed)])


@pytest.mark.parametrize(
    ("code", "before_ready", "says"),
    [
        (-9, False, "exited with code 137 (killed by SIGKILL) unexpectedly"),
        (-15, True, "exited with code 143 (killed by SIGTERM) before it was ready"),
        (2, False, "exited with code 2 unexpectedly"),
    ],
)
def test_the_failure_line_names_the_signal_and_keeps_the_words_the_reason_reads(
    code: int, before_ready: bool, says: str, tmp_path: Path
) -> None:
    line = messages.exit_message("h2-ping-sidecar 'p'", code, before_ready, str(tmp_path / "none.log"))
    assert line == f"h2-ping-sidecar 'p': {says}; see {tmp_path / 'none.log'}"


def test_ctrl_c_again_is_offered_only_after_a_ctrl_c() -> None:
    busy = [("nvcf", None)]
    assert upkeep_report.draining_lines(busy, 60.0, "SIGINT")[1].endswith("; Ctrl-C again to stop now")
    by_term = upkeep_report.draining_lines(busy, 60.0, "SIGTERM")
    assert by_term == [
        "SIGTERM: draining the sidecars",
        "draining nvcf: requests in flight unknown, up to 60s; a second signal stops it now",
    ]


# -- a misspelled sidecar block is named, never silently disabled ---------------------------------


@pytest.mark.parametrize("key", ["sidcar", "Sidecar", "side_car", "sidecars"])
def test_a_misspelled_top_level_block_asks_did_you_mean_sidecar(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text(f"{key}:\n  enabled: true\n")
    assert main(["--log-dir", str(tmp_path), "start", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"sidecar-fsm start: '{key}': top-level key not read; did you mean 'sidecar'?\n"
    )
    with pytest.warns(ConfigWarning, match=rf"^'{key}': top-level key not read; did you mean 'sidecar'\?"):
        assert not h2_ping_sidecar_config_from_global_config(
            OmegaConf.create({key: {"enabled": True}})
        ).enabled


def test_an_unrelated_top_level_key_is_not_taken_for_the_block(recwarn: pytest.WarningsRecorder) -> None:
    assert not h2_ping_sidecar_config_from_global_config({"policy_model": {}, "scheduler": {}}).enabled
    assert not recwarn.list


def test_a_misspelled_key_inside_a_disabled_looking_block_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text("sidecar:\n  enabeld: true\n")
    assert main(["--log-dir", str(tmp_path), "start", str(config)]) == 2
    assert capsys.readouterr().err == "sidecar.enabeld: unknown key; did you mean 'enabled'?\n"


def test_the_config_lab_writes_is_the_readmes_example_word_for_word() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, flags=re.DOTALL)
    assert block is not None
    assert block.group(1) == EXAMPLE_CONFIG
    assert OmegaConf.select(OmegaConf.create(EXAMPLE_CONFIG), EXAMPLE_MODEL_BASE_URL).startswith("https://")
