"""What one build of the proxy is: its inputs, their hash, the ``go build`` command and environment.

Shared by the build cache (``buildcache``) and the wheel's build hook (``hatch_build.py``), so a
binary packaged in a wheel and one built into the cache carry the same sources-hash stamp and
are built the same way (CGO off, ``-trimpath``, ``-buildvcs=false``, ``GOTOOLCHAIN=local``).
The hook loads this file by its path at wheel-build time, when none of sidecar_fsm's
dependencies are installed: it imports the standard library only, and nothing of the package.
Must not run anything, choose a cache path, or raise the package's errors (it returns None
where the caller has the words).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

# Directories the go tool itself ignores: they cannot change what gets built.
_IGNORED_DIR_PREFIXES = (".", "_")
# Hex digits of the sources hash: a path component of the cache and the binary's version label.
HASH_LENGTH = 16


def source_files(source_dir: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(relative posix name, path) of every non-test ``*.go``, ``go.mod`` and ``go.sum``, sorted,
    skipping folders go ignores. ``os.scandir`` rather than pathlib: this runs on every start."""
    found: list[tuple[str, str]] = []
    pending = [("", os.fspath(source_dir))]
    while pending:
        prefix, directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if entry.is_dir():
                    if not name.startswith(_IGNORED_DIR_PREFIXES) and name != "testdata":
                        pending.append((f"{prefix}{name}/", entry.path))
                    continue
                is_go = name.endswith(".go") and not name.endswith("_test.go")
                if is_go or name in ("go.mod", "go.sum"):
                    found.append((prefix + name, entry.path))
    found.sort(key=lambda item: item[0])
    return found


def digest_of(files: list[tuple[str, str]]) -> str | None:
    """The ``HASH_LENGTH``-hex-digit digest of ``files`` (from :func:`source_files`); None if empty.

    Names count too (a rename can change the build: ``_linux.go``); each is length-prefixed, so
    no two file sets give the same byte stream.
    """
    if not files:
        return None
    digest = hashlib.sha256()
    for relative, path in files:
        with open(path, "rb") as file:
            content = file.read()
        encoded = relative.encode()
        digest.update(len(encoded).to_bytes(8, "big") + encoded + len(content).to_bytes(8, "big"))
        digest.update(content)
    return digest.hexdigest()[:HASH_LENGTH]


def build_command(go: str | os.PathLike[str], output: str | os.PathLike[str], sources_hash: str) -> list[str]:
    """``go build`` of the package in the working directory into ``output``, stamped with the hash.

    The hash is ``h2ping_build_info``'s version label; ``-trimpath`` keeps the build folder's
    path out. ``-s -w`` drop the symbol table and DWARF (11 MB to 7 MB, keeping the demo's venv
    under 100 MB); stack traces and pprof read the pclntab, which stays.
    """
    stamp = f"-ldflags=-s -w -X main.version={sources_hash}"
    return [os.fspath(go), "build", "-buildvcs=false", "-trimpath", stamp, "-o", os.fspath(output), "."]


def build_environment(base: Mapping[str, str], temp_dir: str | None = None) -> dict[str, str]:
    """``base`` plus what every ``go`` command of ours runs with; ``temp_dir`` for go's work files.

    CGO off: a static binary for any Linux of its architecture. ``GOTOOLCHAIN=local``: a go.mod
    ``toolchain`` line must not make ``go`` download another (the cache path's version would
    lie). ``GOWORK=off``: a parent's go.work must not change the build. ``temp_dir`` holds go's
    work folder (tens of MB), which go removes itself only when it exits normally.
    """
    env = {
        **base,
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-buildvcs=false",
        "GOWORK": "off",
    }
    if temp_dir is not None:
        env["TMPDIR"] = temp_dir
        env["GOTMPDIR"] = temp_dir
    return env
