"""A ``sidecar.binary`` built from NeMo Gym's sources: flags learned once, filtered, refused.

Gym's proxy is stood in for by tests/gymproxy (Go, built here once per session): Gym's flags
only (``-describe`` unknown: exit 2), a bare PID written in place into ``-ready-file``. Our own proxy is
the real one from the build cache. Everything ``binaryflags`` learns it learns by running them.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ProcessRegistry, http11_request, wait_until
from omegaconf import OmegaConf

from sidecar_fsm.base import procs
from sidecar_fsm.config import H2PingSidecarConfig
from sidecar_fsm.errors import ConfigError, SidecarError
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import start_h2_ping_sidecar
from sidecar_fsm.run import binaryflags
from sidecar_fsm.run.binaryflags import BinaryFlags, binary_flags, filter_command, refusals, warnings
from sidecar_fsm.run.supervise import sidecar_command
from sidecar_fsm.state.store import Store

GYMPROXY_SOURCES = Path(__file__).resolve().parents[1] / "gymproxy"
GYM_FLAGS = frozenset(
    {
        "listen",
        "upstream",
        "ping-interval",
        "ping-timeout",
        "shutdown-grace",
        "insecure-skip-verify",
        "retry-body-limit",
        "max-conn-age",
        "ready-file",
    }
)
ORPHAN_WARNING = "only `sidecar-fsm reap` ends an orphan"
NVCF_WARNING = "has no -nvcf-follow (a NeMo Gym build): NVCF 202s pass through to the client"


@pytest.fixture(scope="session")
def gym_binary(go_tool: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gymproxy built once per session, as Gym builds its proxy (CGO off, -trimpath)."""
    out = tmp_path_factory.mktemp("gymproxy") / "h2-ping-sidecar"
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"}
    done = subprocess.run(
        [str(go_tool), "build", "-trimpath", "-o", str(out), "."],
        cwd=GYMPROXY_SOURCES,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    binaryflags.forget()
    yield
    binaryflags.forget()


def _config(**sidecar: Any) -> H2PingSidecarConfig:
    block = {
        "enabled": True,
        "instances": [{"name": "nvcf", "upstream": "https://localhost:8443"}],
        **sidecar,
    }
    return H2PingSidecarConfig.model_validate(block)


def _asked(binary: Path) -> BinaryFlags:
    """``binary_flags`` of a foreign binary, which is asked (ours would give None)."""
    flags = binary_flags(binary)
    assert flags is not None, f"{binary}: taken for our own proxy"
    return flags


# --- learning the flags -----------------------------------------------------------------------


def test_a_binary_without_describe_is_given_gyms_flags(gym_binary: Path) -> None:
    flags = _asked(gym_binary)
    assert flags.accepted == GYM_FLAGS
    assert flags.takes_value == GYM_FLAGS - {"insecure-skip-verify"}
    assert flags.reports_listen is False


def _our_flags(sidecar_binary: Path) -> BinaryFlags:
    """What our proxy's -describe says (ours is never asked: see below)."""
    done = subprocess.run([str(sidecar_binary), "-describe"], capture_output=True, text=True, timeout=30)
    flags = binaryflags.from_description(str(sidecar_binary), done.stdout)
    assert flags is not None, done
    return flags


def test_our_binary_is_known_by_its_stamp_and_never_asked(
    sidecar_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build cache's binary, or a copy of it anywhere: every flag, nothing refused or warned."""
    copy = tmp_path / "elsewhere" / "h2-ping-sidecar"
    copy.parent.mkdir()
    shutil.copy2(sidecar_binary, copy)

    def no_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"ran {args}: our own binary is not asked")

    monkeypatch.setattr(subprocess, "run", no_run)
    for binary in (sidecar_binary, copy):
        assert binary_flags(binary) is None
        assert binaryflags.check(binary, _config(ca_file="/ca.pem"), _config().instances) == (None, [])


def test_our_description_names_every_flag(sidecar_binary: Path) -> None:
    """A sidecar-fsm binary of other sources (another stamp) is asked: -describe is its answer."""
    flags = _our_flags(sidecar_binary)
    assert flags.accepted >= GYM_FLAGS | {"exit-with-pid", "ca-file"}
    assert "insecure-skip-verify" not in flags.takes_value
    assert flags.reports_listen is True


def test_the_answer_is_remembered_until_the_file_changes(gym_binary: Path, tmp_path: Path) -> None:
    binary = tmp_path / "h2-ping-sidecar"
    shutil.copy2(gym_binary, binary)
    first = _asked(binary)
    assert binary_flags(binary) is first  # asked once
    stat = binary.stat()
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    touched = _asked(binary)
    assert touched is not first and touched == first  # asked again, same answer
    # Replaced in place by a rename (a rebuild): a new inode, asked again, the new answer.
    replacement = tmp_path / "new"
    shutil.copy2(gym_binary, replacement)
    os.replace(replacement, binary)
    assert binary_flags(binary) is not touched


def test_a_binary_that_cannot_be_asked_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SidecarError, match=rf"^'{missing}': cannot read it \(No such file or directory\)"):
        binary_flags(missing)

    not_executable = tmp_path / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(SidecarError, match=r"cannot be run \(Permission denied\)"):
        binary_flags(not_executable)

    # A binary that runs but does not describe itself (a wrapper script, Gym's test doubles)
    # gets Gym's flags only, with a warning, and no port 0: what Gym's launcher always gave it.
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\necho 'not a flag parser'\nexit 1\n")
    silent.chmod(0o755)
    assumed = _asked(silent)
    assert assumed.accepted == binaryflags.GYM_FLAGS
    assert not assumed.reports_listen
    config = H2PingSidecarConfig.model_validate({"exit_with_owner": True})
    assert any(NVCF_WARNING in line for line in binaryflags.warnings(config, assumed))

    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    monkeypatch.setattr(binaryflags, "DESCRIBE_TIMEOUT_SECONDS", 0.5)
    with pytest.raises(SidecarError, match=r"no answer to -describe within 0.5s"):
        binary_flags(hung)
    for error_text in (str(_raised(binary_flags, path)) for path in (missing, not_executable, hung)):
        assert "\n" not in error_text and error_text.endswith(
            "point sidecar.binary at a built h2-ping-sidecar"
        )


def _raised(function: Callable[..., Any], *args: Any) -> BaseException:
    try:
        function(*args)
    except BaseException as error:  # noqa: BLE001 - the point is to return it
        return error
    raise AssertionError(f"{function.__name__}{args} did not raise")


# --- what follows for the argv and the config -------------------------------------------------


def test_filter_drops_what_the_binary_lacks_and_keeps_the_rest_in_order(gym_binary: Path) -> None:
    flags = _asked(gym_binary)
    config = _config(ca_file="/ca.pem", insecure_skip_verify=True)
    command = sidecar_command(str(gym_binary), config, config.instances[0], "/tmp/x.ready")
    filtered = filter_command(command, flags)
    assert filtered[0] == str(gym_binary)
    names = [token.lstrip("-") for token in filtered[1:] if token.startswith("-")]
    assert set(names) <= GYM_FLAGS and "ready-file" in names and "insecure-skip-verify" in names
    # The kept tokens are the command's own, in its order, each value still after its flag.
    kept = iter(command)
    assert all(any(token == other for other in kept) for token in filtered)
    assert filtered[filtered.index("-ready-file") + 1] == "/tmp/x.ready"
    # Both spellings of a dropped flag go with their value; a dropped boolean takes nothing.
    no_bool = BinaryFlags("b", GYM_FLAGS - {"insecure-skip-verify"}, GYM_FLAGS, False)
    assert filter_command(["b", "-exit-with-pid=7", "-insecure-skip-verify", "-listen", "x"], no_bool) == [
        "b",
        "-listen",
        "x",
    ]


def test_refusals_name_the_field_and_the_value(gym_binary: Path, sidecar_binary: Path) -> None:
    gym, ours = _asked(gym_binary), _our_flags(sidecar_binary)
    config = _config(
        instances=[
            {"name": "a", "upstream": "https://a.example.com", "listen": "127.0.0.1:1250"},
            {"name": "b", "upstream": "https://b.example.com", "listen": "127.0.0.1:0"},
        ],
        ca_file="/etc/ca.pem",
        access_log=True,
    )
    lines = refusals(config, config.instances, gym)
    assert len(lines) == 3
    assert lines[0].startswith("sidecar.instances[1].listen: '127.0.0.1:0' picks a free port, but ")
    assert lines[1].startswith(f"sidecar.ca_file: '/etc/ca.pem' cannot be passed to '{gym_binary}'")
    assert lines[2].startswith(f"sidecar.access_log: 'true' cannot be passed to '{gym_binary}'")
    assert all("\n" not in line and not line.endswith(".") for line in lines)
    assert refusals(config, config.instances, ours) == []
    assert refusals(_config(), _config().instances, gym) == []
    # Something that is no sidecar at all.
    other = BinaryFlags("/bin/other", frozenset({"v"}), frozenset(), False)
    assert [line.split(" flag")[0] for line in refusals(_config(), [], other)] == [
        "sidecar.binary: '/bin/other' has no -listen",
        "sidecar.binary: '/bin/other' has no -upstream",
        "sidecar.binary: '/bin/other' has no -ready-file",
    ]


def test_warnings_say_what_is_lost(gym_binary: Path, sidecar_binary: Path) -> None:
    gym, ours = _asked(gym_binary), _our_flags(sidecar_binary)
    nvcf, orphan = warnings(_config(), gym)
    assert nvcf == f"WARNING: sidecar.binary '{gym_binary}' {NVCF_WARNING}"
    assert orphan.startswith("WARNING: ") and orphan.endswith(ORPHAN_WARNING)
    assert warnings(_config(exit_with_owner=False), gym) == [nvcf]
    # Ours says nothing but, until its -nvcf-* flags exist, that NVCF 202s pass through.
    assert warnings(_config(), ours) == (
        [] if "nvcf-follow" in ours.accepted else [nvcf.replace(str(gym_binary), str(sidecar_binary))]
    )
    old_gym = BinaryFlags("/old", GYM_FLAGS - {"max-conn-age"}, GYM_FLAGS, False)
    (_, line) = warnings(_config(exit_with_owner=False), old_gym)
    assert line.startswith("WARNING: sidecar.max_conn_age '50m' is ignored: ")
    assert len(warnings(_config(exit_with_owner=False, max_conn_age="0s"), old_gym)) == 1


def test_check_refuses_with_every_line_or_returns_the_warnings(gym_binary: Path) -> None:
    flags, notes = binaryflags.check(gym_binary, _config(), _config().instances)
    assert flags is not None and flags.accepted == GYM_FLAGS
    assert len(notes) == 2 and notes[0].endswith(NVCF_WARNING) and notes[1].endswith(ORPHAN_WARNING)
    config = _config(
        instances=[{"upstream": "https://a.example.com", "listen": "127.0.0.1:0"}], ca_file="/ca.pem"
    )
    with pytest.raises(ConfigError) as refused:
        binaryflags.check(gym_binary, config, config.instances)
    first, second = str(refused.value).split("\n")
    assert first.startswith("sidecar.instances[0].listen: '127.0.0.1:0' ")
    assert second.startswith("sidecar.ca_file: '/ca.pem' ")


def test_what_needs_metrics_is_refused_for_a_binary_without_them(
    gym_binary: Path, sidecar_binary: Path
) -> None:
    """A fixed metrics_listen has nothing to bind, and upstream_check: fail no verdict to wait
    for, on a binary without -metrics-listen: refused before anything starts, one line each."""
    config = _config(
        instances=[{"upstream": "https://a.example.com", "metrics_listen": "127.0.0.1:9464"}],
        upstream_check="fail",
    )
    lines = refusals(config, config.instances, _asked(gym_binary))
    assert lines == [
        f"sidecar.instances[0].metrics_listen: '127.0.0.1:9464' cannot be passed to '{gym_binary}', which "
        "has no -metrics-listen flag; drop it or leave sidecar.binary unset to use sidecar-fsm's proxy",
        f"sidecar.upstream_check: 'fail' needs the upstream check's verdict, which '{gym_binary}' cannot "
        "give (no -metrics-listen flag); set upstream_check: warn or leave sidecar.binary unset to use "
        "sidecar-fsm's proxy",
    ]
    assert refusals(config, config.instances, _our_flags(sidecar_binary)) == []


# --- Gym's binary running ---------------------------------------------------------------------


def _run_until_ready(argv_for: Callable[[str], list[str]], ready: Path, log: Path) -> tuple[Any, str]:
    """Start Gym's proxy on a fixed port (it cannot report a ``:0`` one); another port if taken.

    The child is whatever ``procs.spawn`` returns (it has ``poll``, ``wait``, ``send_signal``).
    """
    for port in random.sample(range(20000, 60000), 5):
        listen = f"127.0.0.1:{port}"
        child = procs.spawn(argv_for(listen), dict(os.environ), str(log))

        def settled(child: Any = child) -> bool:
            return child.poll() is not None or (
                ready.exists() and ready.read_text().strip() == str(child.pid)
            )

        wait_until(settled, 20, "Gym's proxy to write its pid or exit")
        if child.poll() is None:
            return child, listen
        assert "address already in use" in log.read_text(), log.read_text()
    raise AssertionError("no free port in 5 tries")


def test_gyms_binary_runs_the_filtered_command(
    gym_binary: Path, tls_origin: TlsH2Origin, tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    ready, log = tmp_path / "gym.ready", tmp_path / "gym.log"
    config = _config(instances=[{"name": "lab", "upstream": tls_origin.url}], insecure_skip_verify=True)

    # Unfiltered, our flags stop it before it binds: the reason filter_command exists.
    unfiltered = sidecar_command(str(gym_binary), config, config.instances[0], str(ready))
    done = subprocess.run(unfiltered, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "flag provided but not defined: -exit-with-pid" in done.stderr
    assert not ready.exists()

    flags = _asked(gym_binary)

    def argv_for(listen: str) -> list[str]:
        instance = config.instances[0].model_copy(update={"listen": listen})
        return filter_command(sidecar_command(str(gym_binary), config, instance, str(ready)), flags)

    child, listen = _run_until_ready(argv_for, ready, log)
    process_registry.add(child)
    assert ready.read_text() == f"{child.pid}\n"  # Gym's ready file: a bare pid, no address
    host, port = listen.rsplit(":", 1)
    response = http11_request(host, int(port), "/echo", timeout=20)
    assert response.status == 200
    child.send_signal(signal.SIGTERM)
    assert child.wait(20) == 0
    assert not ready.exists()


def test_the_launcher_starts_gyms_binary(
    gym_binary: Path, tls_origin: TlsH2Origin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gym's binary through ``start_h2_ping_sidecar``: only its flags passed (it exits 2 on any
    other, -metrics-listen included), the orphan warning printed once, its bare-pid ready file
    accepted, and no metrics address recorded: the figures are simply absent."""
    log_dir = tmp_path / "logs"
    for port in random.sample(range(20000, 60000), 5):
        gcd = OmegaConf.create(
            {
                "policy_model": {"responses_api_models": {"m": {"base_url": f"{tls_origin.url}/v1"}}},
                "sidecar": {
                    "enabled": True,
                    "binary": str(gym_binary),
                    "instances": [{"name": "lab", "upstream": tls_origin.url, "listen": f"127.0.0.1:{port}"}],
                    "insecure_skip_verify": True,
                    "log_dir": str(log_dir),
                    "shutdown_grace": "5s",
                },
            }
        )
        try:
            manager = start_h2_ping_sidecar(gcd)
        except SidecarError as error:
            # Gym's binary cannot bind :0 and report it, so a fixed port may be taken: another,
            # with what this attempt printed dropped (the warning is said once per start).
            assert "already in use" in str(error), error
            capsys.readouterr()
            continue
        break
    else:
        raise AssertionError("no free port in 5 tries")
    assert manager is not None and manager.run_id is not None
    try:
        out = capsys.readouterr().out
        assert out.count(ORPHAN_WARNING) == 1 and out.count(NVCF_WARNING) == 1, out
        assert "lab upstream not checked (its binary serves no metrics)" in out, out
        assert gcd.policy_model.responses_api_models.m.base_url == f"http://127.0.0.1:{port}/v1"
        assert http11_request("127.0.0.1", port, "/echo", timeout=20).status == 200
        manager.check()
        with Store.open(log_dir) as store:
            (record,) = store.instances_of(manager.run_id)
        assert (record.state, record.listen, record.metrics) == ("ready", f"127.0.0.1:{port}", None)
        # Its ready file says no route, so `start` prints none (ours say "direct" or "via ...").
        assert manager.routes == {"lab": None}
    finally:
        manager.stop()
    assert list(log_dir.glob("*.ready")) == []
    # No -traffic-file: such a run simply has no traffic figures (and no warning about them).
    assert list(log_dir.glob("*.traffic.json")) == []
    with Store.open(log_dir) as store:
        assert store.traffic_summary(manager.run_id) == []


def test_the_launcher_refuses_port_0_for_gyms_binary_before_starting(
    gym_binary: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gcd = OmegaConf.create(
        {
            "policy_model": {"responses_api_models": {"m": {"base_url": "https://localhost:8443/v1"}}},
            "sidecar": {
                "enabled": True,
                "binary": str(gym_binary),
                "instances": [{"upstream": "https://localhost:8443", "listen": "127.0.0.1:0"}],
                "ca_file": str(gym_binary),  # readable, so only the binary's lack of -ca-file refuses it
                "log_dir": str(tmp_path / "logs"),
            },
        }
    )
    before = OmegaConf.to_yaml(gcd)
    with pytest.raises(ValueError, match=r"^sidecar.instances\[0\].listen: '127.0.0.1:0'") as refused:
        start_h2_ping_sidecar(gcd)
    assert str(refused.value).split("\n")[1].startswith(f"sidecar.ca_file: '{gym_binary}' cannot be passed")
    assert not (tmp_path / "logs").exists()
    assert OmegaConf.to_yaml(gcd) == before
    # Refused before any warning: nothing is printed about a run that never starts.
    assert capsys.readouterr().out == ""


def test_a_taken_port_is_named_for_gyms_binary_too(gym_binary: Path, tmp_path: Path) -> None:
    """Gym's binary exits 1 on any failure (no exit code says "in use"): the kernel, refusing a
    bind of the same address, tells the launcher the port is taken, never the log's words."""
    from launchrun import port_in_use

    with port_in_use() as port:
        gcd = OmegaConf.create(
            {
                "policy_model": {"responses_api_models": {"m": {"base_url": "https://localhost:8443/v1"}}},
                "sidecar": {
                    "enabled": True,
                    "binary": str(gym_binary),
                    "instances": [{"upstream": "https://localhost:8443", "listen": f"127.0.0.1:{port}"}],
                    "log_dir": str(tmp_path / "logs"),
                },
            }
        )
        with pytest.raises(SidecarError) as caught:
            start_h2_ping_sidecar(gcd)
    assert str(caught.value).splitlines()[0] == (
        f"sidecar.instances[0].listen: '127.0.0.1:{port}' is already in use by another process; "
        "stop it or choose another port (or port 0)"
    )
