"""The README documents the CLI that exists, and the CLI documents itself.

Like sqlite-utils' docs tests: a subcommand added without a README line, or a README line
naming a subcommand that is gone, fails here rather than in a user's terminal.
"""

import argparse
import re
from pathlib import Path

import pytest

from sidecar_fsm.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("sidecar-fsm has no subcommands")


def _readme_subcommands() -> set[str]:
    return set(re.findall(r"^sidecar-fsm (\w+)", README.read_text(), flags=re.MULTILINE))


def test_every_subcommand_is_in_the_readme() -> None:
    assert set(_subcommands()) <= _readme_subcommands()


def test_every_readme_subcommand_exists() -> None:
    assert _readme_subcommands() <= set(_subcommands())


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_subcommand_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and name in out


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    assert ".venv/bin/pip install" in README.read_text()
    assert ".venv/bin/pytest" in ci


def test_readme_config_example_is_valid_and_rewrites_as_commented() -> None:
    from omegaconf import OmegaConf

    from sidecar_fsm.config import h2_ping_sidecar_config_from_global_config
    from sidecar_fsm.rewrite import plan_base_urls

    block = re.search(r"```yaml\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert block is not None, "README has no yaml config example"
    global_config = OmegaConf.create(block.group(1))
    config = h2_ping_sidecar_config_from_global_config(global_config)
    assert config.enabled
    changes = plan_base_urls(global_config, config.instances)
    assert [change.new for change in changes] == ["http://127.0.0.1:1250/v1"]
