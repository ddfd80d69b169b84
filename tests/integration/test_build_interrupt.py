"""A build interrupted leaves nothing: no go process, no go work folder, no temp binary.

SPEC "Build cache". A real launcher process builds the real proxy into an empty cache with an
empty Go cache (so the build lasts long enough to be caught in the middle: go has made its
``go-build*`` work folder), in its own session as a shell would start it, with ``TMPDIR`` a
folder of the test's, so a work folder leaked to the usual place is seen too. Then a Ctrl-C
(SIGINT to its process group, as a terminal sends it) or a SIGKILL, and the machine is read:
the processes by pid, the folders by listing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import wait_until

from sidecar_fsm.base import buildcache

BUILD = r"""
import sys
from pathlib import Path
from sidecar_fsm.base.buildcache import ensure_binary
print(ensure_binary(Path(sys.argv[1])), flush=True)
"""


class Builder:
    """A launcher building into ``cache``; its go and compilers as seen mid-build."""

    def __init__(self, tmp_path: Path, go_tool: Path) -> None:
        self.cache = tmp_path / "cache"
        self.tmpdir = tmp_path / "tmpdir"
        self.tmpdir.mkdir()
        env = {
            **os.environ,
            "GOCACHE": str(tmp_path / "gocache"),  # cold: the build lasts tens of seconds
            "TMPDIR": str(self.tmpdir),
            "PATH": f"{go_tool.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(self.cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.build_dir = self.cache / "h2-ping-sidecar" / ".build"
        # Every go process seen, so teardown ends any a failed test left running.
        self.seen: list[psutil.Process] = []

    def temp_folders(self) -> list[Path]:
        return sorted(self.build_dir.glob("*.tmp-*")) if self.build_dir.is_dir() else []

    def go_work_folders(self) -> list[Path]:
        return [*self.build_dir.glob("*.tmp-*/go-tmp/go-build*"), *self.tmpdir.glob("go-build*")]

    def mid_build(self) -> list[psutil.Process]:
        """Wait until go has made its work folder and started compiling; go and its children."""
        wait_until(self.go_work_folders, timeout=120, message="go build's work folder")
        launcher = psutil.Process(self.proc.pid)
        found = wait_until(
            lambda: [p for p in launcher.children(recursive=True) if p.is_running()],
            timeout=30,
            message="go build's processes",
        )
        self.seen.extend(found)
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def builder(tmp_path: Path, go_tool: Path) -> Iterator[Builder]:
    started = Builder(tmp_path, go_tool)
    try:
        yield started
    finally:
        started.stop()
        for process in started.seen:  # whatever a failed test left running
            if process.is_running():
                process.kill()
        shutil.rmtree(tmp_path / "gocache", ignore_errors=True)


def _gone(processes: list[psutil.Process]) -> bool:
    def alive(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return not any(alive(process) for process in processes)


def test_ctrl_c_ends_go_build_and_removes_its_work_folder(builder: Builder) -> None:
    processes = builder.mid_build()
    assert any("go" in os.path.basename(p.exe()) for p in processes)

    os.killpg(builder.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground group

    builder.proc.wait(timeout=60)
    assert builder.proc.stderr is not None
    assert b"KeyboardInterrupt" in builder.proc.stderr.read()
    assert _gone(processes)  # go and its compilers ended before the launcher exited
    assert builder.temp_folders() == []  # no temp binary, no work folder
    assert builder.go_work_folders() == []
    assert not list(builder.cache.rglob("h2-ping-sidecar/*/*/h2-ping-sidecar"))


def test_a_sigkilled_launcher_takes_go_build_with_it_and_the_next_start_cleans_up(
    builder: Builder, sidecar_binary: Path, go_tool: Path
) -> None:
    processes = builder.mid_build()
    go = next(p for p in processes if p.ppid() == builder.proc.pid)

    os.kill(builder.proc.pid, signal.SIGKILL)
    builder.proc.wait(timeout=30)

    wait_until(lambda: _gone([go]), timeout=10, message="go build ending with its launcher")
    # go's last compilers finish the file they were given, then exit: no orphan stays.
    wait_until(lambda: _gone(processes), timeout=120, message="go's compilers exiting")
    assert builder.temp_folders() != []  # what no finally could remove...

    # ...the next start removes, even when it finds the binary built meanwhile by another run.
    final = buildcache.binary_path(
        builder.cache, buildcache.sources_hash(), buildcache.go_version(go_tool, builder.cache)
    )
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(sidecar_binary, final)
    assert buildcache.ensure_binary(builder.cache) == final
    assert builder.temp_folders() == []
    assert builder.go_work_folders() == []
