"""rewrite: base URLs of model servers pointed at the sidecars, exactly as SPEC "Base-URL rewriting"."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.config import SidecarInstanceConfig
from sidecar_fsm.errors import ConfigError, SidecarError
from sidecar_fsm.rewrite import RewrittenUrl, plan_base_urls, rewrite_base_urls

POLICY = SidecarInstanceConfig(name="policy", upstream="https://api.example.com", listen="127.0.0.1:41250")
JUDGE = SidecarInstanceConfig(name="judge", upstream="https://judge.example.com", listen="127.0.0.1:41251")
MODELS = "responses_api_models"

# The shape `gym env start` sees: top-level server instances, model servers under
# responses_api_models, URLs from the environment, from top-level keys and in lists.
GYM_YAML = """
policy_base_url: https://api.example.com/v1
judge_pool: [https://judge.example.com/v1?pool=a, https://elsewhere.example.com/v1]
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      base_url: ${policy_base_url}
      api_key: sk-not-a-url
judge_model:
  responses_api_models:
    judge:
      entrypoint: app.py
      base_url: ${oc.env:JUDGE_URL}
      fallback_base_url:
        - https://API.example.com:443/v2#frag
        - ${policy_base_url}
        - https://elsewhere.example.com/v1
      pool_base_url: ${judge_pool}
      unrelated_base_url: https://elsewhere.example.com/v1
math_env:
  resources_servers:
    math:
      base_url: https://api.example.com/v1
"""


@pytest.fixture
def gym_dictconfig(monkeypatch: pytest.MonkeyPatch) -> DictConfig:
    monkeypatch.setenv("JUDGE_URL", "https://Judge.Example.com/v1/chat?api-version=2")
    config = OmegaConf.create(GYM_YAML)
    assert isinstance(config, DictConfig)
    return config


def test_gym_shaped_config_is_rewritten_exactly(gym_dictconfig: DictConfig) -> None:
    changes = rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE])

    judge = "judge_model.responses_api_models.judge"
    assert changes == [
        RewrittenUrl(
            "policy_model.responses_api_models.openai_model.base_url",
            "https://api.example.com/v1",
            "http://127.0.0.1:41250/v1",
        ),
        RewrittenUrl(
            f"{judge}.base_url",
            "https://Judge.Example.com/v1/chat?api-version=2",
            "http://127.0.0.1:41251/v1/chat?api-version=2",
        ),
        RewrittenUrl(
            f"{judge}.fallback_base_url[0]",
            "https://API.example.com:443/v2#frag",
            "http://127.0.0.1:41250/v2#frag",
        ),
        RewrittenUrl(
            f"{judge}.fallback_base_url[1]", "https://api.example.com/v1", "http://127.0.0.1:41250/v1"
        ),
        RewrittenUrl(
            f"{judge}.pool_base_url[0]",
            "https://judge.example.com/v1?pool=a",
            "http://127.0.0.1:41251/v1?pool=a",
        ),
    ]
    assert OmegaConf.to_container(gym_dictconfig, resolve=False) == {
        # top-level keys the fields aliased are left as they are, the aliased list included
        "policy_base_url": "https://api.example.com/v1",
        "judge_pool": ["https://judge.example.com/v1?pool=a", "https://elsewhere.example.com/v1"],
        "policy_model": {
            MODELS: {
                "openai_model": {
                    "entrypoint": "app.py",
                    "base_url": "http://127.0.0.1:41250/v1",  # the alias became a literal
                    "api_key": "sk-not-a-url",
                }
            }
        },
        "judge_model": {
            MODELS: {
                "judge": {
                    "entrypoint": "app.py",
                    "base_url": "http://127.0.0.1:41251/v1/chat?api-version=2",  # resolver materialized
                    "fallback_base_url": [
                        "http://127.0.0.1:41250/v2#frag",
                        "http://127.0.0.1:41250/v1",
                        "https://elsewhere.example.com/v1",
                    ],
                    # a resolved copy of the list it aliased, with only the matching item changed
                    "pool_base_url": ["http://127.0.0.1:41251/v1?pool=a", "https://elsewhere.example.com/v1"],
                    "unrelated_base_url": "https://elsewhere.example.com/v1",
                }
            }
        },
        # not a model server: untouched even though it points at an upstream
        "math_env": {"resources_servers": {"math": {"base_url": "https://api.example.com/v1"}}},
    }


def test_rewritten_config_serializes_and_reloads(gym_dictconfig: DictConfig) -> None:
    rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE])
    # Gym serializes the config for the servers after start: it must round-trip as is.
    text = OmegaConf.to_yaml(gym_dictconfig)
    reloaded = OmegaConf.create(text)
    assert OmegaConf.to_container(reloaded, resolve=True) == OmegaConf.to_container(
        gym_dictconfig, resolve=True
    )
    assert reloaded.judge_model.responses_api_models.judge.base_url == (
        "http://127.0.0.1:41251/v1/chat?api-version=2"
    )
    assert OmegaConf.to_yaml(gym_dictconfig, resolve=True)


def test_no_matching_instance_changes_nothing(gym_dictconfig: DictConfig) -> None:
    before = OmegaConf.to_container(gym_dictconfig, resolve=False)
    other = SidecarInstanceConfig(name="x", upstream="https://nowhere.example.com", listen="127.0.0.1:1")
    assert rewrite_base_urls(gym_dictconfig, [other]) == []
    assert rewrite_base_urls(gym_dictconfig, []) == []
    assert OmegaConf.to_container(gym_dictconfig, resolve=False) == before


def test_second_rewrite_finds_nothing(gym_dictconfig: DictConfig) -> None:
    assert rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE])
    assert rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE]) == []


def _one_server(base_url: Any, **top: Any) -> DictConfig:
    config = OmegaConf.create({**top, "policy_model": {MODELS: {"m": {"base_url": base_url}}}})
    assert isinstance(config, DictConfig)
    return config


MATCHING = [
    # (value, new)
    ("https://api.example.com", "http://127.0.0.1:41250"),
    ("https://api.example.com/", "http://127.0.0.1:41250/"),
    ("https://API.EXAMPLE.COM/v1", "http://127.0.0.1:41250/v1"),
    ("https://api.example.com:443/v1", "http://127.0.0.1:41250/v1"),
    ("HTTPS://api.example.com/v1", "http://127.0.0.1:41250/v1"),
    ("https://api.example.com/v1/a%20b?x=1&y=2#top", "http://127.0.0.1:41250/v1/a%20b?x=1&y=2#top"),
    # userinfo is kept: a client that authenticates with it keeps doing so through the proxy
    ("https://user:secret@api.example.com/v1", "http://user:secret@127.0.0.1:41250/v1"),
]


@pytest.mark.parametrize(("value", "new"), MATCHING)
def test_matching_values(value: str, new: str) -> None:
    config = _one_server(value)
    changes = rewrite_base_urls(config, [POLICY])
    assert changes == [RewrittenUrl("policy_model.responses_api_models.m.base_url", value, new)]
    assert config.policy_model[MODELS].m.base_url == new


NOT_MATCHING = [
    "http://api.example.com/v1",  # only https upstreams exist
    "https://api.example.com:8443/v1",  # another port is another origin
    "https://api.example.com.evil.example/v1",
    "https://judge.example.com/v1",  # no judge instance in this test
    "api.example.com/v1",  # no scheme: nothing to compare, the server reports it
    "",
    "http://127.0.0.1:41250/v1",  # already rewritten
]


@pytest.mark.parametrize("value", NOT_MATCHING)
def test_non_matching_values_untouched(value: str) -> None:
    config = _one_server(value)
    assert rewrite_base_urls(config, [POLICY]) == []
    assert config.policy_model[MODELS].m.base_url == value


@pytest.mark.parametrize("value", [None, 8080, True, 1.5, {"url": "https://api.example.com"}])
def test_non_string_values_untouched(value: Any) -> None:
    config = _one_server(value)
    before = OmegaConf.to_container(config)
    assert rewrite_base_urls(config, [POLICY]) == []
    assert OmegaConf.to_container(config) == before


def test_ipv6_listen_and_upstream() -> None:
    v6 = SidecarInstanceConfig(name="v6", upstream="https://[::1]:9443", listen="[::1]:41252")
    config = _one_server("https://[0:0::1]:9443/v1")
    assert rewrite_base_urls(config, [v6])[0].new == "http://[::1]:41252/v1"


def test_first_instance_wins_for_a_shared_upstream() -> None:
    second = SidecarInstanceConfig(name="b", upstream="https://api.example.com", listen="127.0.0.1:41299")
    config = _one_server("https://api.example.com/v1")
    assert rewrite_base_urls(config, [POLICY, second])[0].new == "http://127.0.0.1:41250/v1"


def test_only_keys_ending_in_base_url() -> None:
    config = OmegaConf.create(
        {
            "p": {
                MODELS: {
                    "m": {
                        "base_url": "https://api.example.com/a",
                        "judge_base_url": "https://api.example.com/b",
                        "base_url_extra": "https://api.example.com/c",
                        "url": "https://api.example.com/d",
                    }
                }
            }
        }
    )
    assert isinstance(config, DictConfig)
    changes = rewrite_base_urls(config, [POLICY])
    assert [c.location for c in changes] == [
        "p.responses_api_models.m.base_url",
        "p.responses_api_models.m.judge_base_url",
    ]
    assert config.p[MODELS].m.base_url_extra == "https://api.example.com/c"
    assert config.p[MODELS].m.url == "https://api.example.com/d"


def test_unresolvable_value_is_left_for_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIDECAR_FSM_TEST_UNSET", raising=False)
    config = _one_server("${oc.env:SIDECAR_FSM_TEST_UNSET}")
    config.policy_model[MODELS].m.list_base_url = [
        "${oc.env:SIDECAR_FSM_TEST_UNSET}",
        "https://api.example.com",
    ]
    config.policy_model[MODELS].m.missing_base_url = "???"
    changes = rewrite_base_urls(config, [POLICY])
    assert [c.location for c in changes] == ["policy_model.responses_api_models.m.list_base_url[1]"]
    raw: Any = OmegaConf.to_container(config, resolve=False)
    assert raw["policy_model"][MODELS]["m"] == {
        "base_url": "${oc.env:SIDECAR_FSM_TEST_UNSET}",
        "list_base_url": ["${oc.env:SIDECAR_FSM_TEST_UNSET}", "http://127.0.0.1:41250"],
        "missing_base_url": "???",
    }


def test_list_alias_with_an_unresolvable_item_keeps_it_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIDECAR_FSM_TEST_UNSET", raising=False)
    config = _one_server("${pool}", pool=["https://api.example.com/v1", "${oc.env:SIDECAR_FSM_TEST_UNSET}"])
    rewrite_base_urls(config, [POLICY])
    raw: Any = OmegaConf.to_container(config, resolve=False)
    assert raw["pool"] == ["https://api.example.com/v1", "${oc.env:SIDECAR_FSM_TEST_UNSET}"]
    assert raw["policy_model"][MODELS]["m"]["base_url"] == [
        "http://127.0.0.1:41250/v1",
        "${oc.env:SIDECAR_FSM_TEST_UNSET}",
    ]


def test_aliased_server_block_gets_its_own_copy() -> None:
    config = OmegaConf.create(
        {
            "shared": {"base_url": "https://api.example.com/v1", "model": "m1"},
            "policy_model": {MODELS: {"m": "${shared}"}},
        }
    )
    assert isinstance(config, DictConfig)
    changes = rewrite_base_urls(config, [POLICY])
    assert [c.location for c in changes] == ["policy_model.responses_api_models.m.base_url"]
    assert OmegaConf.to_container(config, resolve=False) == {
        "shared": {"base_url": "https://api.example.com/v1", "model": "m1"},
        "policy_model": {MODELS: {"m": {"base_url": "http://127.0.0.1:41250/v1", "model": "m1"}}},
    }


@pytest.mark.parametrize(
    "aliased",
    [
        pytest.param({"policy_model": "${defaults.top}"}, id="top-level block"),
        pytest.param({"policy_model": {MODELS: "${defaults.models}"}}, id="model servers block"),
        pytest.param({"policy_model": {MODELS: {"m": {"base_url": "${defaults.urls}"}}}}, id="url list"),
    ],
)
def test_a_field_under_any_alias_is_written_to_a_copy_not_the_aliased_block(aliased: dict[str, Any]) -> None:
    # Not itself a <top-level>.responses_api_models block: only the alias is a model server.
    shared = {
        "defaults": {
            "top": {MODELS: {"m": {"base_url": ["https://api.example.com/v1"]}}},
            "models": {"m": {"base_url": ["https://api.example.com/v1"]}},
            "urls": ["https://api.example.com/v1"],
        }
    }
    config = OmegaConf.create({**copy.deepcopy(shared), **aliased})
    assert isinstance(config, DictConfig)
    plan = plan_base_urls(config, [POLICY])
    changes = rewrite_base_urls(config, [POLICY])
    assert (
        changes
        == plan
        == [
            RewrittenUrl(
                "policy_model.responses_api_models.m.base_url[0]",
                "https://api.example.com/v1",
                "http://127.0.0.1:41250/v1",
            )
        ]
    )
    raw: Any = OmegaConf.to_container(config, resolve=False)
    assert {key: raw[key] for key in shared} == shared
    assert raw["policy_model"][MODELS]["m"]["base_url"] == ["http://127.0.0.1:41250/v1"]


def test_alias_of_another_model_field_is_materialized_too() -> None:
    # one server's URL aliases another's: both are rewritten, each as its own literal
    config = OmegaConf.create(
        {
            "a": {MODELS: {"m": {"base_url": "https://api.example.com/v1"}}},
            "b": {MODELS: {"m": {"base_url": "${a.responses_api_models.m.base_url}"}}},
        }
    )
    assert isinstance(config, DictConfig)
    assert len(rewrite_base_urls(config, [POLICY])) == 2
    raw: Any = OmegaConf.to_container(config, resolve=False)
    assert raw["b"][MODELS]["m"]["base_url"] == "http://127.0.0.1:41250/v1"


def test_struct_and_readonly_configs_are_rewritten_and_keep_their_flags(gym_dictconfig: DictConfig) -> None:
    OmegaConf.set_struct(gym_dictconfig, True)
    OmegaConf.set_readonly(gym_dictconfig, True)
    assert len(rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE])) == 5
    assert gym_dictconfig.policy_model[MODELS].openai_model.base_url == "http://127.0.0.1:41250/v1"
    assert OmegaConf.is_readonly(gym_dictconfig) and OmegaConf.is_struct(gym_dictconfig)


def test_inner_blocks_with_their_own_flags_are_rewritten_and_keep_them(gym_dictconfig: DictConfig) -> None:
    # A flag set on an inner node overrides the root's, so the one context on the root is not
    # enough there: the write must still go through, and every flag must be as it was after.
    server = gym_dictconfig.policy_model[MODELS].openai_model
    OmegaConf.set_struct(server, True)
    OmegaConf.set_readonly(server, True)
    fallback = gym_dictconfig.judge_model[MODELS].judge.fallback_base_url
    OmegaConf.set_readonly(fallback, True)
    assert len(rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE])) == 5
    assert server.base_url == "http://127.0.0.1:41250/v1"
    assert list(fallback)[:2] == ["http://127.0.0.1:41250/v2#frag", "http://127.0.0.1:41250/v1"]
    assert OmegaConf.is_readonly(server) and OmegaConf.is_struct(server)
    assert OmegaConf.is_readonly(fallback)
    assert not OmegaConf.is_readonly(gym_dictconfig) and not OmegaConf.is_struct(gym_dictconfig)
    with pytest.raises(Exception, match="read-only"):
        server.base_url = "x"


def test_dry_run_on_a_deepcopy_leaves_the_live_config_untouched(gym_dictconfig: DictConfig) -> None:
    # the launcher checks every value on a copy before any process starts
    before = OmegaConf.to_container(gym_dictconfig, resolve=False)
    assert len(rewrite_base_urls(copy.deepcopy(gym_dictconfig), [POLICY, JUDGE])) == 5
    assert OmegaConf.to_container(gym_dictconfig, resolve=False) == before


UNPARSEABLE = [
    (
        "https://[::1",
        "'https://[::1' is not a valid URL (bad IPv6 address in brackets)",
    ),
    # not a URL at all, whatever its scheme
    (
        "ws://[::1",
        "'ws://[::1' is not a valid URL (bad IPv6 address in brackets)",
    ),
    (
        "http://[not-v6]/v1",
        "'http://[not-v6]/v1' is not a valid URL (bad IPv6 address in brackets)",
    ),
    (
        "https://api.example.com:99999/v1",
        "'https://api.example.com:99999/v1' has an invalid port (must be 1-65535)",
    ),
    (
        "https://api.example.com:port/v1",
        "'https://api.example.com:port/v1' has an invalid port (must be 1-65535)",
    ),
    # credentials in a reported value are masked
    (
        "https://user:secret@api.example.com:99999/v1",
        "'https://***@api.example.com:99999/v1' has an invalid port (must be 1-65535)",
    ),
]


@pytest.mark.parametrize(("value", "message"), UNPARSEABLE)
def test_unparseable_url_raises_naming_location_and_value(value: str, message: str) -> None:
    config = _one_server(["https://api.example.com/ok", value])
    before = OmegaConf.to_container(config, resolve=False)
    with pytest.raises(SidecarError) as caught:
        rewrite_base_urls(config, [POLICY])
    assert isinstance(caught.value, ConfigError)
    assert str(caught.value) == (
        f"policy_model.responses_api_models.m.base_url[1]: {message}; "
        "fix the url, or set sidecar.rewrite_base_urls: false"
    )
    assert "secret" not in str(caught.value)
    # planned before applied: the valid item before it was not rewritten either
    assert OmegaConf.to_container(config, resolve=False) == before


def test_non_model_top_level_values_are_skipped() -> None:
    config = OmegaConf.create(
        {
            "policy_base_url": "https://api.example.com/v1",
            "scalars": 3,
            "a_list": [{"responses_api_models": {"m": {"base_url": "https://api.example.com"}}}],
            "no_models": {"other": {"m": {"base_url": "https://api.example.com"}}},
            "models_not_a_dict": {MODELS: "nope"},
            "server_not_a_dict": {MODELS: {"m": "https://api.example.com"}},
        }
    )
    assert isinstance(config, DictConfig)
    before = OmegaConf.to_container(config, resolve=False)
    assert rewrite_base_urls(config, [POLICY]) == []
    assert OmegaConf.to_container(config, resolve=False) == before


def test_plan_lists_the_changes_and_changes_nothing(gym_dictconfig: DictConfig) -> None:
    before = OmegaConf.to_container(gym_dictconfig)
    planned = plan_base_urls(gym_dictconfig, [POLICY, JUDGE])
    assert OmegaConf.to_container(gym_dictconfig) == before
    assert planned and planned == rewrite_base_urls(gym_dictconfig, [POLICY, JUDGE])
