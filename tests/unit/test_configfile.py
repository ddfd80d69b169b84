"""Merging a config as ``start`` does: OmegaConf's dotlist overrides in full, and a malformed one
refused in one line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sidecar_fsm.cli import main
from sidecar_fsm.configfile import load_config
from sidecar_fsm.errors import ConfigError


@pytest.fixture
def gym_yaml(tmp_path: Path) -> str:
    path = tmp_path / "gym.yaml"
    path.write_text(
        "sidecar:\n  enabled: true\n  instances:\n    - name: p\n      upstream: https://a\n"
        "policy_model:\n  x: 1\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("sidecar.instances.0.upstream=https://x", "sidecar.instances.0.upstream", "https://x"),
        ("sidecar.instances[0].upstream=https://y", "sidecar.instances.0.upstream", "https://y"),
        ("policy_model=[1,2]", "policy_model", [1, 2]),
        ("sidecar={ping_interval: 30s}", "sidecar.ping_interval", "30s"),
        ("new.key=3", "new.key", 3),
    ],
)
def test_overrides_are_the_dotlist_in_full(gym_yaml: str, override: str, key: str, value: object) -> None:
    config = load_config([gym_yaml, override], "sidecar-fsm start")
    got = OmegaConf.select(config, key)
    assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == value
    assert config.sidecar.enabled is True  # a mapping merges into a mapping


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("=x", "no key before '='"),
        ("a..b=1", "'a..b' is not a dotted key"),
        ("a[0]b=1", "'a[0]b' is not a dotted key"),
        ("sidecar.instances.5.upstream=z", "list index out of range"),
    ],
)
def test_a_malformed_override_is_one_line(gym_yaml: str, override: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config([gym_yaml, override], "sidecar-fsm start")
    message = str(refused.value)
    assert message.startswith(f"sidecar-fsm start: override '{override}': {reason}; use key=value, e.g. ")
    assert "\n" not in message


def test_a_malformed_override_exits_2_in_one_line(gym_yaml: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", gym_yaml, "=x"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
