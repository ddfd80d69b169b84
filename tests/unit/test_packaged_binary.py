"""The wheel's packaged binary against the build cache: which one a start runs, and why.

A packaged binary is a file in ``buildcache.PACKAGED_BIN_DIR`` with the sources hash it was
built from beside it (``hatch_build.py`` writes both into the wheel; tests/integration/
test_wheel.py checks a real wheel). Here the folder is a test's own, the toolchain the fake
``go`` of test_buildcache_unit (so a build that should not happen is seen in its log).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar_fsm.base import buildcache, trust
from sidecar_fsm.errors import ConfigError
from tests.unit.test_buildcache_unit import _calls, fake_go, no_go, src

__all__ = ["fake_go", "no_go", "src"]  # fixtures, used by name


@pytest.fixture
def packaged(tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A packaged binary built from ``src`` (as the wheel's hook leaves it); its path."""
    bin_dir = tmp_path / "site-packages" / "sidecar_fsm" / "_bin"
    bin_dir.mkdir(parents=True)
    binary = bin_dir / "h2-ping-sidecar"
    binary.write_text("#!/bin/sh\necho packaged\n")
    binary.chmod(0o755)
    (bin_dir / "h2-ping-sidecar.sources").write_text(buildcache.sources_hash(src) + "\n")
    monkeypatch.setattr(buildcache, "PACKAGED_BIN_DIR", bin_dir)
    return binary


def test_the_packaged_binary_of_these_sources_runs_with_no_go_and_no_build(
    tmp_path: Path, no_go: None, src: Path, packaged: Path
) -> None:
    cache = tmp_path / "cache"
    choice = buildcache.choose_binary(cache, source_dir=src)
    assert choice.path == packaged and choice.packaged
    sources = buildcache.sources_hash(src)
    assert (
        choice.why
        == f"packaged with sidecar-fsm, built from sources {sources}, which the installed go/ matches"
    )
    assert not cache.exists()  # the cache is not even made


def test_a_changed_go_dir_is_built_into_the_cache_and_the_reason_named(
    tmp_path: Path, fake_go: Path, src: Path, packaged: Path
) -> None:
    built_from = buildcache.sources_hash(src)
    (src / "main.go").write_text('package main\n\nfunc main() { println("changed") }\n')
    cache = tmp_path / "cache"

    choice = buildcache.choose_binary(cache, source_dir=src)

    assert not choice.packaged and choice.path.is_relative_to(cache)
    assert choice.why.startswith("from the build cache, built now with ")
    assert choice.why.endswith(
        f"; the packaged binary was built from sources {built_from}, the installed go/ differs"
    )
    assert [call for call in _calls(fake_go) if call.startswith("build")] != []


def test_an_install_without_a_packaged_binary_uses_the_cache_and_says_so(
    tmp_path: Path, fake_go: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(buildcache, "PACKAGED_BIN_DIR", tmp_path / "editable" / "_bin")
    cache = tmp_path / "cache"
    buildcache.choose_binary(cache, source_dir=src)

    again = buildcache.choose_binary(cache, source_dir=src)

    assert again.why == (
        "from the build cache, built before; "
        "no binary is packaged with this install (editable, or no wheel for this platform)"
    )


def test_a_packaged_binary_in_a_folder_others_can_write_is_refused_in_one_line(
    tmp_path: Path, no_go: None, src: Path, packaged: Path
) -> None:
    site = packaged.parent.parent.parent
    os.chmod(site, 0o777)
    with pytest.raises(ConfigError) as raised:
        buildcache.choose_binary(tmp_path / "cache", source_dir=src)
    me = trust.owner_name(os.geteuid())
    assert str(raised.value) == (
        f"packaged h2-ping-sidecar: '{packaged}': '{site}' (owner {me}, mode 0777) is writable by "
        "group or others, who could replace what runs; refusing to run it: install sidecar-fsm in a "
        "venv only you can write (chmod go-w its folders)"
    )


def test_a_cache_others_can_write_is_refused_before_any_build(
    tmp_path: Path, fake_go: Path, src: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(ConfigError, match=f"^cache_dir: .* '{cache}' .* is writable by group or others"):
        buildcache.choose_binary(cache, source_dir=src)
    assert [call for call in _calls(fake_go) if call.startswith("build")] == []
    assert list(cache.iterdir()) == []  # no lock, no temp folder, no binary
