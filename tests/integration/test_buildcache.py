"""The build cache with the real Go: 8 processes on a cold shared cache build once, atomically.

A wrapper named ``go``, first on the workers' PATH, logs every call and execs the real
toolchain, so the number of ``go build`` runs is counted, not inferred.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import SIDECAR_FSM

from sidecar_fsm.base import buildcache
from sidecar_fsm.base.resources import SIDECAR_SOURCE_DIR

WORKERS = 8

# Reports "armed" once imported, waits for the go signal on stdin, resolves the cache, runs
# the binary it got and reports what it saw.
WORKER = r"""
import hashlib, json, subprocess, sys, time
from pathlib import Path
from sidecar_fsm.base.buildcache import ensure_binary
print("armed", flush=True)
sys.stdin.read(1)
began = time.monotonic()
path = ensure_binary(Path(sys.argv[1]), source_dir=Path(sys.argv[2]))
resolved = time.monotonic()
out = subprocess.run([str(path)], capture_output=True, text=True).stdout
print(json.dumps({"path": str(path), "out": out, "sha": hashlib.sha256(path.read_bytes()).hexdigest(),
                  "seconds": resolved - began}), flush=True)
"""


@pytest.fixture
def tiny_source(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "go.mod").write_text("module example.com/tiny\n\ngo 1.22\n")
    (source / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("tiny ok") }\n'
    )
    return source


@pytest.fixture
def counting_go(tmp_path: Path, go_tool: Path) -> tuple[Path, Path]:
    """(bin dir holding a logging ``go`` wrapper, its log)."""
    bin_dir = tmp_path / "wrapper-bin"
    bin_dir.mkdir()
    log = tmp_path / "go-calls.log"
    log.touch()
    wrapper = bin_dir / "go"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{go_tool}" "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir, log


def _run_workers(
    count: int, cache: Path, source: Path, bin_dir: Path, gocache: Path | None = None
) -> tuple[list[dict[str, object]], float]:
    """Start ``count`` workers, release them together; their reports and the wall time from release."""
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    if gocache is not None:
        env["GOCACHE"] = str(gocache)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(cache), str(source)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        for _ in range(count)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline() == b"armed\n"
        began = time.monotonic()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"x")
            worker.stdin.close()
        reports = []
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline()
            assert worker.wait(timeout=600) == 0
            reports.append(json.loads(line))
        return reports, time.monotonic() - began
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()


def _builds(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("build")]


def test_concurrent_cold_starts_build_once_and_never_see_a_partial_binary(
    tmp_path: Path, tiny_source: Path, counting_go: tuple[Path, Path], go_tool: Path
) -> None:
    bin_dir, log = counting_go
    # One cold build alone first, in its own cache: the yardstick, and it warms Go's compile
    # cache for this package so the concurrent round below pays the same (link-only) cost.
    _, single_seconds = _run_workers(1, tmp_path / "single-cache", tiny_source, bin_dir)
    assert len(_builds(log)) == 1
    log.write_text("")

    cache = tmp_path / "shared-cache"
    version = buildcache.go_version(go_tool, tmp_path / "probe-cache")
    final = buildcache.binary_path(cache, buildcache.sources_hash(tiny_source), version)

    # Watch the final path the whole time: every sighting must already be the complete file.
    seen: list[bytes] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(final.read_bytes())
            stop.wait(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        reports, concurrent_seconds = _run_workers(WORKERS, cache, tiny_source, bin_dir)
    finally:
        stop.set()
        watcher.join()

    assert len(_builds(log)) == 1, log.read_text()
    complete = final.read_bytes()
    digest = hashlib.sha256(complete).hexdigest()
    assert {report["path"] for report in reports} == {str(final)}
    assert {report["out"] for report in reports} == {"tiny ok\n"}
    assert {report["sha"] for report in reports} == {digest}
    assert seen and all(sighting == complete for sighting in seen)
    assert [p.name for p in final.parent.iterdir()] == ["h2-ping-sidecar"]  # locks and temps elsewhere
    ratio = concurrent_seconds / single_seconds
    print(
        f"one cold build {single_seconds:.2f}s; {WORKERS} concurrent cold starts {concurrent_seconds:.2f}s "
        f"({ratio:.2f}x); per-worker resolve median "
        f"{statistics.median(float(str(r['seconds'])) for r in reports):.2f}s"
    )
    # No assertion on the ratio: the < 1.3x target is a benchmark figure for the real proxy
    # (bench/launcher.py), and a timed assertion on a shared 2-core machine only measures the
    # neighbours. What this test proves is the behaviour: one build, no partial file ever seen.

    # Warm: the same 8 again run no go at all (version remembered, binary found).
    log.write_text("")
    reports, warm_seconds = _run_workers(WORKERS, cache, tiny_source, bin_dir)
    assert log.read_text() == ""
    assert {report["path"] for report in reports} == {str(final)}
    print(f"{WORKERS} concurrent warm starts {warm_seconds:.2f}s")


def test_real_proxy_is_built_into_the_cache_layout(
    cache_dir: Path, sidecar_binary: Path, go_tool: Path
) -> None:
    """The session's proxy came through the cache; a warm lookup finds it in a few milliseconds."""
    expected = buildcache.binary_path(
        cache_dir, buildcache.sources_hash(), buildcache.go_version(go_tool, cache_dir)
    )
    assert sidecar_binary == expected
    timings = []
    for _ in range(20):
        began = time.perf_counter()
        assert buildcache.ensure_binary(cache_dir) == expected
        timings.append(time.perf_counter() - began)
    median_ms = statistics.median(timings) * 1000
    print(f"warm lookup of the real proxy: median {median_ms:.2f} ms")
    assert median_ms < 5
    result = subprocess.run([str(sidecar_binary), "-h"], capture_output=True, text=True, timeout=30)
    assert "-listen" in result.stdout + result.stderr


@pytest.mark.skipif(
    not os.environ.get("SIDECAR_FSM_BENCH_COLD_BUILD"),
    reason="benchmark (two full compiles of the proxy, ~1 min): set SIDECAR_FSM_BENCH_COLD_BUILD=1",
)
def test_bench_real_proxy_cold_build_one_vs_eight(tmp_path: Path, counting_go: tuple[Path, Path]) -> None:
    """The issue's target on the real proxy, Go's compile cache empty each time: 8 cold < 1.3x one."""
    bin_dir, log = counting_go
    source = SIDECAR_SOURCE_DIR
    _, single_seconds = _run_workers(1, tmp_path / "cache-1", source, bin_dir, gocache=tmp_path / "gocache-1")
    reports, concurrent_seconds = _run_workers(
        WORKERS, tmp_path / "cache-8", source, bin_dir, gocache=tmp_path / "gocache-8"
    )
    assert len(_builds(log)) == 2  # one per round
    assert len({report["path"] for report in reports}) == 1
    ratio = concurrent_seconds / single_seconds
    print(
        f"real proxy: one cold build {single_seconds:.1f}s; {WORKERS} concurrent cold starts "
        f"{concurrent_seconds:.1f}s ({ratio:.2f}x)"
    )
    assert ratio < 1.3


def test_build_prints_the_cached_binary(cache_dir: Path, sidecar_binary: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SIDECAR_FSM), "build", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.is_file() and os.access(path, os.X_OK)
    assert path.is_relative_to(cache_dir)
    # Which binary and why, on stderr: an editable install packages none, so the cache's.
    assert done.stderr == (
        "sidecar-fsm build: from the build cache, built before; "
        "no binary is packaged with this install (editable, or no wheel for this platform)\n"
    )
