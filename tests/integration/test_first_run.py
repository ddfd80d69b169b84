"""The first hour of a new user (issue 30), with the real proxy, the lab origin and real signals.

The launcher given what Gym users pass (a plain ``dict``), the warning for an instance nothing
is routed through, a listen off loopback in the rewritten URL, the restart said on ``start``'s
console, and the README's "First run" walkthrough run exactly as the README prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import http11_request

from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager, start_h2_ping_sidecar


def gym_dict(origin: TlsH2Origin, log_dir: Path, binary: Path, *instances: dict[str, str]) -> dict[str, Any]:
    """A Gym global config as a plain dict (as ``yaml.safe_load`` gives it), a model URL through
    an interpolation and one through a list PyYAML shares with a top-level key (an anchor)."""
    shared_urls = [f"{origin.url}/v1"]
    return {
        "nemo_gym_log_dir": str(log_dir),
        "policy_base_url": origin.url,
        "judge_urls": shared_urls,
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(origin.ca_file),
            "shutdown_grace": "5s",
            "upstream_check": "off",
            "instances": list(instances)
            or [{"name": "policy", "upstream": origin.url, "listen": "127.0.0.1:0"}],
        },
        "policy_model": {
            "responses_api_models": {
                "openai_model": {"base_url": "${policy_base_url}", "api_key": "sk-x"},
                "judge_model": {"base_url": shared_urls},
            }
        },
    }


@pytest.fixture
def started(managers: list[H2PingSidecarManager]) -> Callable[[Any], H2PingSidecarManager]:
    def start(config: Any) -> H2PingSidecarManager:
        manager = start_h2_ping_sidecar(config)
        assert manager is not None
        managers.append(manager)
        return manager

    return start


def test_a_plain_dict_is_started_and_rewritten_in_place_like_a_dictconfig(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    log_dir: Path,
    started: Callable[[Any], H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = gym_dict(tls_origin, log_dir, sidecar_binary)
    manager = started(config)
    (listen,) = [instance.listen for instance in manager.instances_actual]
    servers = config["policy_model"]["responses_api_models"]
    assert servers["openai_model"]["base_url"] == f"http://{listen}"
    assert servers["judge_model"]["base_url"] == [f"http://{listen}/v1"]
    # What the values came from keeps its meaning: the alias and the shared list are untouched.
    assert config["policy_base_url"] == tls_origin.url
    assert config["judge_urls"] == [f"{tls_origin.url}/v1"]
    host, _, port = listen.rpartition(":")
    assert http11_request(host, int(port), "/echo").status == 200
    out = capsys.readouterr().out
    assert (
        f"policy_model.responses_api_models.openai_model.base_url: {tls_origin.url} -> http://{listen}" in out
    )
    assert "WARNING" not in out


@pytest.mark.parametrize("given", [42, None, "sidecar: {enabled: true}", [("sidecar", {})]])
def test_anything_but_a_mapping_is_a_one_line_type_error_naming_its_type(given: object) -> None:
    with pytest.raises(TypeError) as raised:
        start_h2_ping_sidecar(given)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "start_h2_ping_sidecar: global_config_dict must be a DictConfig or a dict, "
        f"not {type(given).__name__}"
    )


def test_an_instance_nothing_is_routed_through_is_warned_by_name_beside_a_routed_one(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    log_dir: Path,
    started: Callable[[Any], H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    other = f"https://127.0.0.1:{tls_origin.port}"  # the same origin by another name: no URL names it
    config = gym_dict(
        tls_origin,
        log_dir,
        sidecar_binary,
        {"name": "policy", "upstream": tls_origin.url, "listen": "127.0.0.1:0"},
        {"name": "judge", "upstream": other, "listen": "127.0.0.1:0"},
    )
    started(config)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING")]
    assert warnings == [
        f"WARNING: h2-ping-sidecar 'judge' is running but no model base_url points at its upstream "
        f"({other}), so nothing is routed through it; only *base_url keys of servers under "
        "<top-level>.responses_api_models are rewritten"
    ]


def test_a_listen_off_loopback_keeps_the_host_written_in_the_rewritten_url(
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    log_dir: Path,
    started: Callable[[Any], H2PingSidecarManager],
) -> None:
    config = gym_dict(
        tls_origin,
        log_dir,
        sidecar_binary,
        {"name": "policy", "upstream": tls_origin.url, "listen": "0.0.0.0:0"},
    )
    config["sidecar"]["allow_non_loopback"] = True
    manager = started(config)
    (bound,) = [instance.listen_port for instance in manager.instances_actual]
    servers = config["policy_model"]["responses_api_models"]
    assert servers["openai_model"]["base_url"] == f"http://0.0.0.0:{bound}"
    assert http11_request("127.0.0.1", bound, "/echo").status == 200
