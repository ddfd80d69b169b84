"""Trust only what only you can write: the log dir, the ready file, the metrics address, the binary.

SPEC "Security". Each case is set up as another user would leave it on a shared node: folders
and files chowned to ``nobody`` (so the tests run as root, as CI does), world-writable folders
with and without the sticky bit, a stand-in proxy that names its own pid and a port another
process holds, a binary under a world-writable folder. Each is refused in one line, with
nothing started and nothing written. Real parts throughout: the launcher, the CLI as a
subprocess, the proxy from the build cache, real sockets and processes.

pytest's ``tmp_path`` lives under ``/tmp`` (sticky, world-writable: fine above a binary) in
``/tmp/pytest-of-root`` (0700), so the folders above each case's own are trusted.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from helpers import ProcessRegistry, wait_until
from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.base import buildcache, procs, sockets, trust
from sidecar_fsm.errors import ConfigError, SidecarError, UnusableStateError
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import start_h2_ping_sidecar
from sidecar_fsm.run import binaryflags
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, database_path

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to chown files to nobody (CI runs as root)"
)

NOBODY = 65534
SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"

# A stand-in proxy. `-h` answers with the real proxy's usage (so it gets our flags); otherwise it
# leaves a marker holding its pid (proof that it ran), binds the listen address it was given
# and writes a ready file naming its own pid and the address in $NAMED (default: the one it
# bound), as go/ready.go does (temp file + rename).
FAKE = """#!/bin/sh
if [ "$1" = -h ]; then exec "{real}" -h; fi
echo $$ > "{marker}"
while [ $# -gt 0 ]; do
  case "$1" in -ready-file) ready="$2";; -listen) listen="$2";; esac
  shift
done
exec "{python}" -c '
import json, os, socket, sys, time
host, _, port = sys.argv[2].rpartition(":")
sock = socket.socket()
sock.bind((host, int(port)))
sock.listen()
named = os.environ.get("NAMED") or "%s:%d" % sock.getsockname()
with open(sys.argv[1] + ".tmp", "w") as file:
    json.dump({{"pid": os.getpid(), "listen": named}}, file)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
' "$ready" "$listen"
"""


@pytest.fixture(autouse=True)
def _fresh_flags() -> Iterator[None]:
    binaryflags.forget()
    yield
    binaryflags.forget()


def fake_binary(folder: Path, marker: Path, real: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "h2-ping-sidecar"
    path.write_text(FAKE.format(real=real, marker=marker, python=sys.executable))
    path.chmod(0o755)
    return path


def gym_config(log_dir: Path, binary: Path | None, cache_dir: Path, **block: Any) -> DictConfig:
    sidecar: dict[str, Any] = {
        "enabled": True,
        "instances": [{"name": "nvcf", "upstream": "https://localhost:8443", "listen": "127.0.0.1:0"}],
        "startup_timeout_seconds": 20,
        "shutdown_grace": "1s",
        "metrics": False,
        "log_dir": str(log_dir),
        **({"binary": str(binary)} if binary is not None else {}),
        **block,
    }
    return OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "policy_model": {"responses_api_models": {"m": {"base_url": "https://localhost:8443/v1"}}},
            "sidecar": sidecar,
        }
    )


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text.strip(), text
    return text


def still_running(marker: Path) -> bool:
    """Whether the stand-in that left ``marker`` still runs (its pid, as a live non-zombie)."""
    pid = int(marker.read_text())
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar_fsm", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


# -- the log dir ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "mode", "words"),
    [
        (NOBODY, 0o755, "belongs to another user"),
        (NOBODY, 0o777, "belongs to another user"),
        (0, 0o777, "writable by group or others"),
        (0, 0o1777, "writable by group or others"),  # sticky: others may still plant a file
        # group-writable: test_trust_groups.py, with a group of other users made for it
    ],
)
def test_start_refuses_a_log_dir_another_user_can_write(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path, owner: int, mode: int, words: str
) -> None:
    log_dir = tmp_path / "shared"
    log_dir.mkdir()
    os.chown(log_dir, owner, owner)
    log_dir.chmod(mode)
    marker = tmp_path / "ran"
    config = gym_config(log_dir, fake_binary(tmp_path / "bin", marker, sidecar_binary), cache_dir)
    before = OmegaConf.to_container(config)

    with pytest.raises(UnusableStateError) as caught:
        start_h2_ping_sidecar(config)

    line = one_line(caught.value)
    owner_name = trust.owner_name(owner)
    assert f"'{log_dir}'" in line and f"owner {owner_name}, mode {mode:04o}" in line and words in line
    assert "chmod go-w" in line and "log_dir" in line  # the fix
    assert os.listdir(log_dir) == []
    assert not marker.exists()
    assert OmegaConf.to_container(config) == before


def test_start_refuses_a_state_folder_or_database_of_another_user(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path
) -> None:
    marker = tmp_path / "ran"
    binary = fake_binary(tmp_path / "bin", marker, sidecar_binary)
    log_dir = tmp_path / "logs"
    with Store.open(log_dir):
        pass
    database = database_path(log_dir)
    planted = [database, database.parent]
    for path in planted:  # the database first, then its folder too
        os.chown(path, NOBODY, NOBODY)
        entries = sorted(os.listdir(database.parent))
        with pytest.raises(UnusableStateError) as caught:
            start_h2_ping_sidecar(gym_config(log_dir, binary, cache_dir))
        line = one_line(caught.value)
        assert f"'{path}' (owner nobody" in line, line
        assert sorted(os.listdir(database.parent)) == entries
        assert sorted(os.listdir(log_dir)) == ["sidecar-fsm"]
        assert not marker.exists()


def test_cli_start_refuses_the_default_log_dir_planted_by_another_user(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path
) -> None:
    """The issue's scenario: ``<tmp>/nemo_gym_h2ping-<uid>`` made first by nobody, mode 0777."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    planted = temp / f"nemo_gym_h2ping-{os.getuid()}"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    planted.chmod(0o777)
    marker = tmp_path / "ran"
    config = gym_config(tmp_path / "unused", fake_binary(tmp_path / "bin", marker, sidecar_binary), cache_dir)
    config.sidecar.pop("log_dir")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(OmegaConf.to_container(config)))

    done = cli("start", str(path), env={**os.environ, "TMPDIR": str(temp)})

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"'{planted}'" in line and "owner nobody, mode 0777" in line
    assert os.listdir(planted) == [] and not marker.exists()


def test_read_commands_warn_and_reap_signals_nothing_in_an_untrusted_log_dir(
    tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    log_dir = tmp_path / "logs"
    orphan = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    process_registry.add(orphan)
    identity = procs.identity_of(orphan.pid)
    assert identity is not None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_identity = procs.identity_of(gone.pid)
    gone.wait()
    with Store.open(log_dir) as store:
        # A run whose owner is gone, with a sidecar that a reap in a trusted folder would end.
        store.create_run("r1", gone.pid, gone_identity.start_time if gone_identity else 1.0, {})
        record = store.create_instance(
            "r1", "nvcf", "127.0.0.1:1", "https://api.example.com", identity.exe, "r1.log", "r1.ready"
        )
        machine = InstanceMachine(store, record.id)
        machine.fire("build")
        machine.fire("spawn", pid=identity.pid, pid_start_time=identity.start_time)
    log_dir.chmod(0o777)
    database = database_path(log_dir)
    before = database.read_bytes()

    reaped = cli("reap", "--log-dir", str(log_dir))
    assert reaped.returncode == 2, reaped.stdout + reaped.stderr
    (line,) = reaped.stderr.splitlines()
    assert f"'{log_dir}'" in line and "mode 0777" in line
    assert orphan.poll() is None and procs.is_ours(identity)
    assert database.read_bytes() == before

    shown = cli("status", "--log-dir", str(log_dir), "--json")
    (warning,) = shown.stderr.splitlines()
    assert warning.startswith("sidecar-fsm status: warning: ") and "mode 0777" in warning
    assert '"r1"' in shown.stdout
    history = cli("history", "r1", "--log-dir", str(log_dir))
    assert history.returncode == 0 and "warning" in history.stderr
    assert orphan.poll() is None


def test_files_and_folders_are_made_writable_by_their_owner_only_whatever_the_umask(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path, tls_origin: TlsH2Origin
) -> None:
    log_dir = tmp_path / "deep" / "logs"
    config = gym_config(log_dir, None, cache_dir)
    config.sidecar.instances[0].upstream = tls_origin.url
    config.sidecar.ca_file = str(tls_origin.ca_file)
    config.sidecar.metrics = True
    previous = os.umask(0)
    try:
        manager = start_h2_ping_sidecar(config)
        assert manager is not None
        try:
            made = [tmp_path / "deep", *log_dir.rglob("*"), log_dir]
            assert any(path.name.endswith("-wal") for path in made)  # the database is open
            loose = {str(p): f"{p.stat().st_mode & 0o7777:04o}" for p in made if p.stat().st_mode & 0o022}
            assert loose == {}
        finally:
            manager.stop()
    finally:
        os.umask(previous)


# -- the ready file and the metrics address --------------------------------------------------------


@pytest.fixture
def held_port() -> Iterator[socket.socket]:
    """A port another process holds (this test's): where a forged ready file would send requests."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


def test_ready_file_naming_a_port_the_child_does_not_listen_on_is_refused(
    tmp_path: Path,
    sidecar_binary: Path,
    cache_dir: Path,
    held_port: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = f"127.0.0.1:{held_port.getsockname()[1]}"
    monkeypatch.setenv("NAMED", held)  # the stand-in names its own pid and our port
    marker = tmp_path / "ran"
    log_dir = tmp_path / "logs"
    config = gym_config(log_dir, fake_binary(tmp_path / "bin", marker, sidecar_binary), cache_dir)
    before = OmegaConf.to_container(config)

    with pytest.raises(SidecarError) as caught:
        start_h2_ping_sidecar(config)

    first = str(caught.value).splitlines()[0]
    assert f"listen address {held} is not a socket pid" in first and "refusing it" in first
    assert marker.exists() and not still_running(marker)  # it did run, and was ended
    assert OmegaConf.to_container(config) == before  # no base URL points at the held port
    with pytest.raises(BlockingIOError):
        held_port.accept()  # nothing was sent there
    with Store.open(log_dir) as store:
        ((run, inst),) = [(r, i) for r in store.list_runs("all") for i in store.instances_of(r.run_id)]
    assert (run.outcome, inst.state) == ("failed", "failed")
    assert not list(log_dir.glob("*.ready"))


def test_status_does_not_scrape_a_metrics_address_the_proxy_does_not_listen_on(
    tmp_path: Path, cache_dir: Path, tls_origin: TlsH2Origin, held_port: socket.socket
) -> None:
    log_dir = tmp_path / "logs"
    config = gym_config(log_dir, None, cache_dir, metrics=True, ca_file=str(tls_origin.ca_file))
    config.sidecar.instances[0].upstream = tls_origin.url
    manager = start_h2_ping_sidecar(config)
    assert manager is not None
    try:
        held = f"127.0.0.1:{held_port.getsockname()[1]}"
        # What a user who could write the database would do: point the record at their port.
        conn = sqlite3.connect(database_path(log_dir))
        with contextlib.closing(conn), conn:
            conn.execute("UPDATE instances SET metrics = ?", (held,))
        done = cli("status", "--json", "--log-dir", str(log_dir))
        assert done.returncode in (0, 3), done.stderr
        assert "not scraped: pid" in done.stdout and f"does not listen on {held}" in done.stdout
        with pytest.raises(BlockingIOError):
            held_port.accept()
    finally:
        manager.stop()


# -- the binary -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "mode", "owner"),
    [
        ("folder", 0o777, 0),  # world-writable, not sticky: anyone may rename the binary away
        # group-writable: test_trust_groups.py, with a group of other users made for it
        ("folder", 0o755, NOBODY),  # another user's folder
        ("binary", 0o757, 0),  # the file itself writable by others
        ("binary", 0o755, NOBODY),  # the file itself another user's
    ],
)
def test_a_binary_others_could_replace_is_not_run(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path, where: str, mode: int, owner: int
) -> None:
    marker = tmp_path / "ran"
    folder = tmp_path / "shared" / "bin"
    binary = fake_binary(folder, marker, sidecar_binary)
    target = folder.parent if where == "folder" else binary
    os.chown(target, owner, owner)
    target.chmod(mode)
    log_dir = tmp_path / "logs"

    with pytest.raises(ConfigError) as caught:
        start_h2_ping_sidecar(gym_config(log_dir, binary, cache_dir))

    line = one_line(caught.value)
    assert line.startswith(f"sidecar.binary: '{binary}': '{target}' (owner {trust.owner_name(owner)}")
    assert "chmod go-w" in line
    assert not marker.exists() and not log_dir.exists()


def test_a_binary_under_a_sticky_world_writable_folder_runs(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path
) -> None:
    """``/tmp`` above a binary is fine: no one else can rename or delete what is in it."""
    sticky = tmp_path / "sticky"
    marker = tmp_path / "ran"
    binary = fake_binary(sticky / "bin", marker, sidecar_binary)
    sticky.chmod(0o1777)
    manager = start_h2_ping_sidecar(gym_config(tmp_path / "logs", binary, cache_dir))
    assert manager is not None
    manager.stop()
    assert marker.exists()


def test_a_build_cache_folder_of_another_user_is_refused(
    tmp_path: Path, sidecar_binary: Path, cache_dir: Path
) -> None:
    """The cache is judged from its root down: a folder in it that another user owns is refused."""
    cache = tmp_path / "cache"
    copied = cache / sidecar_binary.relative_to(cache_dir)
    copied.parent.mkdir(parents=True)
    copied.write_bytes(sidecar_binary.read_bytes())
    copied.chmod(0o755)
    hash_dir = copied.parent.parent
    os.chown(hash_dir, NOBODY, NOBODY)
    log_dir = tmp_path / "logs"

    with pytest.raises(ConfigError) as caught:
        start_h2_ping_sidecar(gym_config(log_dir, None, cache, build_if_missing=False))

    line = one_line(caught.value)
    # Judged before the Go version is even asked (nothing is written into a cache refused), so
    # the line names this sources' folder, which holds every Go version's binary.
    assert line.startswith(f"cache_dir: '{hash_dir}': '{hash_dir}' (owner nobody, mode 0755)")
    assert not log_dir.exists()


def test_build_cache_folders_are_writable_by_their_owner_only_whatever_the_umask(
    tmp_path: Path, go_tool: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "go.mod").write_text("module example.com/tiny\n\ngo 1.22\n")
    (source / "main.go").write_text("package main\n\nfunc main() {}\n")
    cache = tmp_path / "cache"
    previous = os.umask(0)
    try:
        built = buildcache.ensure_binary(cache, source_dir=source)
    finally:
        os.umask(previous)
    made = [cache, *cache.rglob("*")]
    assert built in made
    loose = {str(p): f"{p.stat().st_mode & 0o7777:04o}" for p in made if p.stat().st_mode & 0o022}
    assert loose == {}
    assert trust.binary_problem(built, cache) is None


def test_a_port_the_child_listens_on_is_its_own_and_a_port_another_holds_is_not(
    process_registry: ProcessRegistry,
    held_port: socket.socket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``procs.listens_on`` reads the kernel's answer: the child's own sockets, nobody else's."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host: the wildcard [::] listener cannot be made")
    port_file = tmp_path / "port"
    script = (
        "import os, socket, sys, time\n"
        "sock = socket.socket(socket.AF_INET6); sock.bind(('::', 0)); sock.listen()\n"
        "open(sys.argv[1] + '.tmp', 'w').write(str(sock.getsockname()[1]))\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(port_file)])
    process_registry.add(child)
    wait_until(port_file.exists, 20, "the child's port")
    port = int(port_file.read_text())
    held = held_port.getsockname()[1]
    # A wildcard listener takes connections to every address of its port, IPv4 ones included.
    assert procs.listens_on(child.pid, f"127.0.0.1:{port}")
    assert procs.listens_on(child.pid, f"[::1]:{port}")
    assert procs.listens_on(child.pid, f"localhost:{port}")
    assert not procs.listens_on(child.pid, f"127.0.0.1:{held}")
    assert procs.listens_on(os.getpid(), f"127.0.0.1:{held}")
    assert not procs.listens_on(child.pid, "127.0.0.1:0")
    assert not procs.listens_on(child.pid, "not an address")
    # Where netlink's sock_diag cannot answer, /proc/<pid>/net/tcp* gives the same verdicts.
    monkeypatch.setattr(sockets, "_listeners_by_netlink", lambda: None)
    assert procs.listens_on(child.pid, f"127.0.0.1:{port}")
    assert not procs.listens_on(child.pid, f"127.0.0.1:{held}")
