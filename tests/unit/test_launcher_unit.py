"""The launcher's pure parts and its refusals: argv, environment, log dir, and checks before any start.

No child processes: what needs a running proxy is in tests/integration/test_launcher*.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from pydantic import ValidationError

from sidecar_fsm import launcher
from sidecar_fsm.base import buildcache
from sidecar_fsm.base.addresses import listens_clash, split_listen
from sidecar_fsm.config import H2PingSidecarConfig
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.launcher import (
    SIDECAR_BINARY_NAME,
    SIDECAR_SOURCE_DIR,
    h2_ping_sidecar_config_from_global_config,
    resolve_binary,
    resolve_log_dir,
    sidecar_command,
    sidecar_env,
    start_h2_ping_sidecar,
)
from sidecar_fsm.run import interrupts, messages, supervise
from sidecar_fsm.state import sharedstore

SPEC_NAMES = (
    "start_h2_ping_sidecar",
    "H2PingSidecarManager",
    "NodeSidecars",
    "RewrittenUrl",
    "SidecarError",
    "build_sidecar",
    "default_binary_path",
    "resolve_binary",
    "resolve_log_dir",
    "rewrite_base_urls",
    "sidecar_command",
    "sidecar_env",
    "h2_ping_sidecar_config_from_global_config",
    "SIDECAR_BINARY_NAME",
    "SIDECAR_SOURCE_DIR",
)


def _config(**block: Any) -> H2PingSidecarConfig:
    block.setdefault("enabled", True)
    block.setdefault("instances", [{"name": "nvcf", "upstream": "https://api.example.com"}])
    return h2_ping_sidecar_config_from_global_config(OmegaConf.create({"sidecar": block}))


def test_every_spec_name_is_exported() -> None:
    missing = [name for name in SPEC_NAMES if not hasattr(launcher, name)]
    assert missing == []
    assert SIDECAR_BINARY_NAME == "h2-ping-sidecar"
    assert (SIDECAR_SOURCE_DIR / "go.mod").is_file()
    assert issubclass(launcher.SidecarError, RuntimeError)
    assert supervise.NodeSidecars is launcher.NodeSidecars


def test_command_passes_every_tuning_flag_explicitly() -> None:
    config = _config(ping_interval=90, shutdown_grace="2m", retry_body_limit=0, max_conn_age=0)
    command = sidecar_command("/bin/h2", config, config.instances[0], "/logs/x.ready")
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert command[0] == "/bin/h2"
    assert flags["-listen"] == "127.0.0.1:1250"
    assert flags["-upstream"] == "https://api.example.com"
    assert flags["-ping-interval"] == "1m30s"
    assert flags["-shutdown-grace"] == "2m0s" or flags["-shutdown-grace"] == "2m"
    assert flags["-retry-body-limit"] == "0"
    assert flags["-max-conn-age"] == "0s"
    assert flags["-ready-file"] == "/logs/x.ready"
    assert flags["-exit-with-pid"] == str(os.getpid())
    assert "-insecure-skip-verify" not in command
    assert "-ca-file" not in command


def test_command_optional_flags() -> None:
    config = _config(exit_with_owner=False, insecure_skip_verify=True, ca_file="~/ca.pem")
    command = sidecar_command("/bin/h2", config, config.instances[0], "/r")
    assert "-exit-with-pid" not in command
    assert command[-1] == "-insecure-skip-verify"
    assert command[command.index("-ca-file") + 1] == str(Path("~/ca.pem").expanduser())


def test_command_nvcf_flags_are_the_instances() -> None:
    status = "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}"
    config = _config(
        nvcf={"budget": "31m40s", "poll_window": 3600},
        instances=[
            {"name": "policy", "upstream": "https://api.example.com", "listen": "127.0.0.1:0"},
            {
                "name": "judge",
                "upstream": "https://api.example.com",
                "listen": "127.0.0.1:0",
                "nvcf": {"follow": False, "status_url": status},
            },
        ],
    )
    policy, judge = (sidecar_command("/bin/h2", config, i, "/r") for i in config.instances)
    assert [flag for flag in policy if flag.startswith("-nvcf")] == ["-nvcf-budget", "-nvcf-poll-window"]
    assert policy[policy.index("-nvcf-budget") + 1] == "31m40s"
    assert policy[policy.index("-nvcf-poll-window") + 1] == "1h"
    assert "-nvcf-follow=false" in judge
    assert judge[judge.index("-nvcf-status-url") + 1] == status
    # The proxy's defaults are not repeated: a default config runs on a proxy without the flags.
    for block in ({}, {"nvcf": {"budget": "1h", "follow": True}}):
        default = _config(**block)
        command = sidecar_command("/bin/h2", default, default.instances[0], "/r")
        assert [flag for flag in command if flag.startswith("-nvcf")] == []


@pytest.mark.parametrize(
    ("godebug", "expected"),
    [
        (None, None),
        ("http2debug=2", None),
        ("http2debug=1,madvdontneed=1", "madvdontneed=1"),
        ("madvdontneed=1, http2debug=2 ,x=y", "madvdontneed=1,x=y"),
        ("http2client=0", "http2client=0"),
    ],
)
def test_env_drops_http2debug_only(
    monkeypatch: pytest.MonkeyPatch, godebug: str | None, expected: str | None
) -> None:
    if godebug is None:
        monkeypatch.delenv("GODEBUG", raising=False)
    else:
        monkeypatch.setenv("GODEBUG", godebug)
    monkeypatch.setenv("SIDECAR_FSM_TEST_MARKER", "kept")
    env = sidecar_env(_config())
    assert env.get("GODEBUG") == expected
    assert env["SIDECAR_FSM_TEST_MARKER"] == "kept"
    assert "GOMEMLIMIT" not in env or os.environ.get("GOMEMLIMIT") == env["GOMEMLIMIT"]


def test_env_passes_the_proxy_variables_through_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy decides the route from the job's own HTTPS_PROXY/NO_PROXY (go/egress.go)."""
    variables = {"HTTPS_PROXY": "http://alice:s3cret@proxy.corp:3128", "NO_PROXY": ".corp", "no_proxy": "x"}
    variables["https_proxy"] = variables["HTTPS_PROXY"]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    env = sidecar_env(_config())
    assert {name: env[name] for name in variables} == variables


def test_env_passes_go_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMAXPROCS", "8")
    env = sidecar_env(_config(gomemlimit="1GiB", gomaxprocs=2))
    assert env["GOMEMLIMIT"] == "1GiB"
    assert env["GOMAXPROCS"] == "2"


def test_env_gomaxprocs_is_the_configs_else_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC: the child's environment is ours plus the config's limits, nothing else; the proxy
    # applies its own default (one P) when the variable is absent.
    monkeypatch.setenv("GOMAXPROCS", "3")
    assert sidecar_env(_config())["GOMAXPROCS"] == "3"
    monkeypatch.delenv("GOMAXPROCS")
    assert "GOMAXPROCS" not in sidecar_env(_config())


def test_log_dir_order(tmp_path: Path) -> None:
    own = _config(log_dir=str(tmp_path / "own"))
    assert resolve_log_dir(own, {"nemo_gym_log_dir": "/elsewhere"}) == str(tmp_path / "own")
    plain = _config()
    assert resolve_log_dir(plain, OmegaConf.create({"nemo_gym_log_dir": str(tmp_path)})) == str(tmp_path)
    assert resolve_log_dir(plain, {}) == os.path.join(tempfile.gettempdir(), f"nemo_gym_h2ping-{os.getuid()}")
    assert resolve_log_dir(plain, None).endswith(f"nemo_gym_h2ping-{os.getuid()}")


def test_disabled_or_absent_block_starts_nothing() -> None:
    assert start_h2_ping_sidecar(OmegaConf.create({"x": 1})) is None
    assert start_h2_ping_sidecar(OmegaConf.create({"sidecar": {"enabled": False}})) is None


def _gym_config(tmp_path: Path, **block: Any) -> Any:
    block.setdefault("enabled", True)
    block.setdefault("instances", [{"name": "nvcf", "upstream": "https://api.example.com"}])
    block.setdefault("log_dir", str(tmp_path / "logs"))
    return OmegaConf.create(
        {
            "cache_dir": str(tmp_path / "cache"),
            "policy_base_url": "https://api.example.com/v1",
            "policy": {"responses_api_models": {"m": {"base_url": "${policy_base_url}"}}},
            "sidecar": block,
        }
    )


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"instances": []}, "sidecar.instances"),
        ({"ping_interval": "6m"}, "sidecar.ping_interval: '6m'"),
        ({"nodes": 2}, "nodes"),
        ({"ca_file": "/nonexistent/ca.pem"}, "sidecar.ca_file: '/nonexistent/ca.pem' is not a readable file"),
        ({"binary": "/nonexistent/h2", "build_if_missing": False}, "sidecar.binary: '/nonexistent/h2'"),
    ],
)
def test_bad_input_fails_before_any_side_effect(tmp_path: Path, block: dict[str, Any], message: str) -> None:
    config = _gym_config(tmp_path, **block)
    before = OmegaConf.to_container(config)
    # A bad block is pydantic's ValidationError, as in NeMo Gym; what the launcher checks on disk
    # is a ConfigError (a SidecarError).
    with pytest.raises(
        (SidecarError, ValidationError), match=message.replace(".", r"\.").replace("(", r"\(")
    ):
        start_h2_ping_sidecar(config)
    assert OmegaConf.to_container(config) == before
    # Nothing was created: no log dir (so no database, no run), no cache.
    assert not (tmp_path / "logs").exists()
    assert not (tmp_path / "cache").exists()


def test_unparseable_model_url_fails_before_any_side_effect(tmp_path: Path) -> None:
    config = _gym_config(tmp_path)
    config.policy.responses_api_models.m.base_url = "https://[broken"
    before = OmegaConf.to_container(config)
    with pytest.raises(SidecarError):
        start_h2_ping_sidecar(config)
    assert OmegaConf.to_container(config) == before
    assert not (tmp_path / "logs").exists()


def test_config_errors_are_validation_errors(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        start_h2_ping_sidecar(_gym_config(tmp_path, ping_timeout="-1s"))


def test_resolve_binary_says_does_not_exist_or_not_executable(tmp_path: Path) -> None:
    """NeMo Gym's words, one line each, for a binary that is missing and one that cannot run."""
    missing = tmp_path / "missing"
    with pytest.raises(SidecarError) as raised:
        resolve_binary(_config(binary=str(missing), build_if_missing=False), {})
    assert str(raised.value) == (
        f"sidecar.binary: '{missing}' does not exist; "
        "point it at a built h2-ping-sidecar or set build_if_missing: true"
    )
    plain = tmp_path / "h2"
    plain.write_text("not a program")
    for not_runnable in (plain, tmp_path):  # a plain file, a directory
        with pytest.raises(SidecarError) as raised:
            resolve_binary(_config(binary=str(not_runnable), build_if_missing=False), {})
        assert str(raised.value) == (
            f"sidecar.binary: '{not_runnable}' is not executable; "
            "make it executable (chmod +x) or point it at a built h2-ping-sidecar"
        )
    plain.chmod(0o755)
    assert resolve_binary(_config(binary=str(plain)), {}) == plain


def test_missing_go_and_no_prebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buildcache, "find_go", lambda: None)
    config = _gym_config(tmp_path)
    before = OmegaConf.to_container(config)
    with pytest.raises(SidecarError, match="no Go toolchain and no prebuilt h2-ping-sidecar"):
        start_h2_ping_sidecar(config)
    assert OmegaConf.to_container(config) == before
    assert not (tmp_path / "logs").exists()


def test_log_tail_reads_only_the_end(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(10000)))
    assert messages.log_tail(str(log), lines=3) == "line 9997\nline 9998\nline 9999"
    assert messages.log_tail(str(tmp_path / "missing.log")).startswith("(log ")
    (tmp_path / "empty.log").write_text("")
    assert messages.log_tail(str(tmp_path / "empty.log")) == "(empty log)"


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("127.0.0.1:1250", "127.0.0.1:1250", True),
        ("localhost:1250", "127.0.0.1:1250", True),
        ("0.0.0.0:1250", "127.0.0.1:1250", True),  # a wildcard holds every address's port
        ("[::1]:1250", "127.0.0.1:1250", False),  # two sockets: both bind
        ("127.0.0.1:1250", "127.0.0.1:1251", False),
        ("127.0.0.1:0", "localhost:0", False),
        ("10.0.0.1:1250", "127.0.0.1:1250", False),
    ],
)
def test_the_port_holder_is_on_an_address_that_clashes(a: str, b: str, same: bool) -> None:
    assert listens_clash(split_listen(a), split_listen(b)) is same


def test_interrupt_held_until_the_block_ends() -> None:
    reached_end = False
    with pytest.raises(KeyboardInterrupt), interrupts.interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        # Python runs handlers between bytecodes: a few statements give it the chance to raise.
        for _ in range(1000):
            pass
        reached_end = True
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_callers_own_handlers_are_held_then_run() -> None:
    seen: list[tuple[int, bool]] = []
    inside = [False]
    previous = {
        signum: signal.signal(signum, lambda signum, frame: seen.append((signum, inside[0])))
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with interrupts.interrupts_deferred():
            inside[0] = True
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            inside[0] = False
        # Both ran, after the block (inside was False), in arrival order.
        assert seen == [(signal.SIGTERM, False), (signal.SIGINT, False)]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_shared_store_is_reused_until_its_file_is_replaced(tmp_path: Path) -> None:
    first = sharedstore.shared_store(str(tmp_path / "logs"))
    assert sharedstore.shared_store(str(tmp_path / "logs")) is first
    # A log dir cleaned between two runs of one process: the next run must not write to the
    # unlinked file, where no reader would ever see it.
    shutil.rmtree(tmp_path / "logs")
    second = sharedstore.shared_store(str(tmp_path / "logs"))
    assert second is not first
    assert second.path.exists()
    second.create_run("r1", os.getpid(), None, {})
    assert second.get_run("r1") is not None
