"""A command line that answers at once: ``--help`` (and ``status`` with no log dir) load no layer.

Every start builds the whole parser, so whatever a command module imports at its top every
command pays: omegaconf, pydantic, sqlite-utils and rich cost ~290 ms together, the build cache's
filelock and psutil ~60 ms, which ``--help`` never uses. Each case runs in a fresh interpreter
(this one has imported everything already) and reads its ``sys.modules`` at exit. The figures
themselves: ``bench/cli.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar_fsm.cli import launch
from sidecar_fsm.cli import query as cli_query

HEAVY = ("filelock", "psutil", "omegaconf", "pydantic", "sqlite_utils", "rich", "transitions")

PROBE = r"""
import contextlib, io, json, sys
from sidecar_fsm.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as done:
        code = done.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _loaded(*argv: str) -> tuple[object, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(done.stdout)
    return report["code"], report["modules"]


@pytest.mark.parametrize(
    "argv", [["--help"], ["status", "--help"], ["start", "--help"], ["probe", "--help"], ["query", "--help"]]
)
def test_help_imports_none_of_the_heavy_layers(argv: list[str]) -> None:
    code, modules = _loaded(*argv)
    assert code == 0
    heavy = [name for name in modules if name.split(".")[0] in HEAVY]
    ours = [name for name in modules if name.startswith("sidecar_fsm.")]
    assert heavy == [], f"{' '.join(argv)} loaded {sorted({h.split('.')[0] for h in heavy})}; ours: {ours}"


def test_status_with_no_log_dir_answers_without_the_store(tmp_path: Path) -> None:
    code, modules = _loaded("--log-dir", str(tmp_path / "none"), "status")
    assert code == 1  # "log dir ... does not exist"
    assert [name for name in modules if name.split(".")[0] in HEAVY] == []
    assert "sidecar_fsm.state.store" not in modules


def test_the_parsers_own_copies_of_layer_defaults_agree_with_the_layers() -> None:
    from sidecar_fsm import configfile
    from sidecar_fsm.state import query

    assert cli_query.DEFAULT_TIMEOUT_SECONDS == query.DEFAULT_TIMEOUT_SECONDS
    assert tuple(query.VIEWS) == cli_query.VIEWS
    assert launch.OVERRIDE_EXAMPLE == configfile.OVERRIDE_EXAMPLE
