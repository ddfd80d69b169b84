"""CLI usage errors: exit 2 with one line on stderr, before anything starts or is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar_fsm.cli import main

BAD_USAGE = [
    ([], "sidecar-fsm: the following arguments are required: COMMAND"),
    (["frobnicate"], "sidecar-fsm: argument COMMAND: invalid choice: 'frobnicate'"),
    (["status", "--bogus"], "sidecar-fsm: unrecognized arguments: --bogus"),
    (["history"], "sidecar-fsm history: the following arguments are required: RUN"),
    (["history", "a", "b", "c"], "sidecar-fsm: unrecognized arguments: c"),
    (["start"], "sidecar-fsm start: the following arguments are required: CONFIG.yaml|key=value"),
    (["start", "a=b"], "sidecar-fsm start: no CONFIG.yaml given; pass at least one YAML file"),
    (["start", "/nonexistent/x.yaml"], "sidecar-fsm start: '/nonexistent/x.yaml' is not a file"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_USAGE, ids=[" ".join(a) or "none" for a, _ in BAD_USAGE])
def test_bad_usage_exits_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["--log-dir", str(tmp_path), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(message), err
    assert not (tmp_path / "sidecar-fsm").exists()


def test_start_with_sidecar_disabled_is_bad_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text("sidecar:\n  enabled: false\n")
    assert main(["--log-dir", str(tmp_path), "start", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == "sidecar-fsm start: sidecar.enabled is not true in the config; set sidecar.enabled=true\n"


def test_start_with_invalid_yaml_is_bad_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text("sidecar: [unclosed\n")
    assert main(["--log-dir", str(tmp_path), "start", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sidecar-fsm start: '{config}' is not valid YAML (")
    assert err.count("\n") == 1


def test_start_with_invalid_sidecar_block_names_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text(
        "sidecar:\n  enabled: true\n  ping_interval: 6m\n"
        "  instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:0'}]\n"
    )
    assert main(["--log-dir", str(tmp_path), "start", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sidecar.ping_interval: '6m'"), err
    assert err.count("\n") == 1
    assert not list(tmp_path.glob("h2ping-*"))


def test_write_config_into_missing_directory_is_refused_before_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text(
        "sidecar:\n  enabled: true\n"
        "  instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:0'}]\n"
    )
    out = tmp_path / "missing" / "out.yaml"
    assert main(["--log-dir", str(tmp_path), "start", str(config), "--write-config", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"sidecar-fsm start: --write-config '{out}': its directory does not exist\n"


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("start", "status", "history", "reap", "build", "demo"):
        assert command in out


def test_config_error_keeps_its_example_on_later_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "gym.yaml"
    config.write_text("sidecar:\n  enabled: true\n")
    assert main(["--log-dir", str(tmp_path), "start", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sidecar.instances"), err
    assert err.splitlines()[0].strip() and not err.splitlines()[0].endswith(".")
