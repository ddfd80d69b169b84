"""The style gates of the repo, run with the suite so a red lint is a red main.

ruff (lint and format) on everything, mypy --strict on the package (configured in
pyproject.toml). The Go side's gofmt and go vet run in tests/integration/test_go.py.
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_ruff(args: tuple[str, ...]) -> None:
    result = _run(str(BIN / "ruff"), *args)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_package() -> None:
    result = _run(sys.executable, "-m", "mypy", "sidecar_fsm")
    assert result.returncode == 0, result.stdout + result.stderr
