"""config: every default, every validation rule (bad value -> exact message), durations, reading the block."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf
from pydantic import BaseModel, ValidationError

from sidecar_fsm.config import (
    SIDECAR_KEY,
    H2PingSidecarConfig,
    NvcfConfig,
    RestartPolicy,
    SidecarInstanceConfig,
    describe_error,
    format_go_duration,
    h2_ping_sidecar_config_from_global_config,
    is_loopback_host,
    parse_duration_seconds,
    split_listen,
    upstream_origin,
)
from sidecar_fsm.errors import ConfigError, ConfigWarning

UP = "https://api.example.com"
STATUS = "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}"
DURATION_HINT = "use Go syntax like '60s', '1m30s', '250ms' or a number of seconds"
LISTEN_HINT = "use 127.0.0.1:PORT (0 picks a free port; IPv6 as [::1]:PORT)"
PING = "must be above 0 and below 340s (the idle limit it exists to beat); try '60s'"
AGE = "must be below 3600s (the load balancer's connection age limit); try '50m', or '0s' to disable"
BODY = "try 16777216, or 0 to disable buffering"
PROCS = "try 2, or null to leave it to the go runtime"
NAME = "is not a valid name; use letters, digits, '_' and '-', starting with a letter or digit"
HTTPS = "must be https:// (HTTP/2 is chosen by ALPN); use https://HOST[:PORT]"
CLASH = "instances must listen on different addresses: a unique port each, or 0 for any free port"
LIST_HINT = "write a list of {name, upstream, listen} entries"
MEM_HINT = "use bytes or a KiB, MiB, GiB or TiB count like '1GiB', or 'off'"


MLOOP = "use 127.0.0.1:PORT (port 0 for any free one)"
MCLASH = "every listen and metrics_listen needs its own address: a unique port each, or 0 for any free port"


def inst(
    name: str = "nvcf", listen: str = "127.0.0.1:1250", upstream: str = UP, **extra: Any
) -> dict[str, Any]:
    return {"name": name, "upstream": upstream, "listen": listen, **extra}


def load(block: Any) -> H2PingSidecarConfig:
    return h2_ping_sidecar_config_from_global_config({SIDECAR_KEY: block})


def refusal(block: Any) -> str:
    """The text the CLI prints for ``block``, which must be refused with a ``ValidationError``."""
    with pytest.raises(ValidationError) as caught:
        load(block)
    assert caught.value.__cause__ is None  # no pydantic traceback chained behind ours
    return describe_error(caught.value)


# --- defaults --------------------------------------------------------------------------------

DEFAULTS = {
    "enabled": False,
    "binary": None,
    "build_if_missing": True,
    "instances": [],
    "ping_interval": "60s",
    "ping_timeout": "15s",
    "shutdown_grace": "60s",
    "retry_body_limit": 16777216,
    "max_conn_age": "50m",
    "insecure_skip_verify": False,
    "gomemlimit": None,
    "gomaxprocs": None,
    "startup_timeout_seconds": 30.0,
    "log_dir": None,
    "rewrite_base_urls": True,
    "ca_file": None,
    "allow_non_loopback": False,
    "exit_with_owner": True,
    "restart": {"max_restarts": 0, "backoff": "1s"},
    "metrics": True,
    "upstream_check": "warn",
    "upstream_check_seconds": 10.0,
    "access_log": False,
    "log_max_bytes": 104857600,
    "log_backups": 5,
    "nvcf": {"follow": True, "poll_window": None, "budget": "60m", "status_url": None},
}


@pytest.mark.parametrize(
    "global_config",
    [None, {}, {"other": 1}, {SIDECAR_KEY: None}, OmegaConf.create({}), OmegaConf.create({SIDECAR_KEY: {}})],
    ids=["none", "empty-dict", "no-block", "null-block", "empty-dictconfig", "empty-block"],
)
def test_absent_block_is_disabled_with_every_default(global_config: Any) -> None:
    config = h2_ping_sidecar_config_from_global_config(global_config)
    assert config.model_dump() == DEFAULTS
    assert sorted(H2PingSidecarConfig.model_fields) == sorted(DEFAULTS)


def test_default_seconds_and_instance_defaults() -> None:
    config = H2PingSidecarConfig()
    assert (config.ping_interval_seconds, config.ping_timeout_seconds) == (60.0, 15.0)
    assert (config.shutdown_grace_seconds, config.max_conn_age_seconds) == (60.0, 3000.0)
    assert config.restart.backoff_seconds == 1.0
    instance = SidecarInstanceConfig(upstream=UP)
    assert (instance.name, instance.listen, instance.listen_host, instance.listen_port) == (
        "nvcf",
        "127.0.0.1:1250",
        "127.0.0.1",
        1250,
    )


def test_struct_mode_dictconfig_without_block_is_disabled() -> None:
    global_config = OmegaConf.create({"policy_base_url": UP})
    OmegaConf.set_struct(global_config, True)
    assert h2_ping_sidecar_config_from_global_config(global_config) == H2PingSidecarConfig()


# --- accepted values ---------------------------------------------------------------------------

GOOD = [
    # (block, attribute, expected)
    ({"ping_interval": 90}, "ping_interval", "1m30s"),
    ({"ping_interval": 90}, "ping_interval_seconds", 90.0),
    ({"ping_interval": 0.25}, "ping_interval", "250ms"),
    ({"ping_interval": "1m30s"}, "ping_interval", "1m30s"),
    ({"ping_interval": " 45s "}, "ping_interval", "45s"),
    ({"ping_interval": "339.9s"}, "ping_interval_seconds", 339.9),
    ({"ping_interval": "5m39s"}, "ping_interval_seconds", 339.0),
    ({"ping_timeout": "250ms"}, "ping_timeout_seconds", 0.25),
    ({"ping_timeout": "1h"}, "ping_timeout_seconds", 3600.0),
    ({"shutdown_grace": 0}, "shutdown_grace", "0s"),
    ({"shutdown_grace": "15m"}, "shutdown_grace_seconds", 900.0),
    ({"shutdown_grace": "1h2m3.5s"}, "shutdown_grace_seconds", 3723.5),
    ({"max_conn_age": 0}, "max_conn_age", "0s"),
    ({"max_conn_age": "0"}, "max_conn_age", "0"),  # Go reads a bare 0 as a duration
    ({"max_conn_age": "0s"}, "max_conn_age_seconds", 0.0),
    ({"max_conn_age": "59m59s"}, "max_conn_age_seconds", 3599.0),
    ({"retry_body_limit": 0}, "retry_body_limit", 0),
    ({"retry_body_limit": "1024"}, "retry_body_limit", 1024),
    ({"gomemlimit": "1GiB"}, "gomemlimit", "1GiB"),
    ({"gomemlimit": "512MiB"}, "gomemlimit", "512MiB"),
    ({"gomemlimit": "100B"}, "gomemlimit", "100B"),
    ({"gomemlimit": 1073741824}, "gomemlimit", "1073741824"),
    ({"gomemlimit": "off"}, "gomemlimit", "off"),
    ({"gomemlimit": "8388607TiB"}, "gomemlimit", "8388607TiB"),
    ({"gomaxprocs": 2}, "gomaxprocs", 2),
    ({"startup_timeout_seconds": 0.5}, "startup_timeout_seconds", 0.5),
    ({"enabled": "false"}, "enabled", False),  # booleans as YAML and dotlist overrides write them
    ({"insecure_skip_verify": "yes"}, "insecure_skip_verify", True),
    ({"exit_with_owner": 0}, "exit_with_owner", False),
    ({"metrics": False}, "metrics", False),
    ({"metrics": "off"}, "metrics", False),
    ({"upstream_check": "fail"}, "upstream_check", "fail"),
    ({"access_log": "true"}, "access_log", True),
    ({"log_max_bytes": "1MiB"}, "log_max_bytes", 1048576),
    ({"log_max_bytes": "512KiB"}, "log_max_bytes", 524288),
    ({"log_max_bytes": 1000}, "log_max_bytes", 1000),
    ({"log_max_bytes": "0"}, "log_max_bytes", 0),
    ({"log_backups": 0}, "log_backups", 0),
    ({"upstream_check": "off", "metrics": False}, "upstream_check", "off"),
    ({"upstream_check_seconds": 2.5}, "upstream_check_seconds", 2.5),
    ({"upstream_check_seconds": "3"}, "upstream_check_seconds", 3.0),
    ({"instances": [inst(metrics_listen="127.0.0.1:9464")]}, "instances.0.metrics_listen", "127.0.0.1:9464"),
    ({"instances": [inst(metrics_listen=" localhost:0 ")]}, "instances.0.metrics_listen", "localhost:0"),
    (
        {
            "instances": [
                inst("a", metrics_listen="127.0.0.1:0"),
                inst("b", "127.0.0.1:1251", metrics_listen="127.0.0.1:0"),
            ]
        },
        "instances.1.metrics_listen",
        "127.0.0.1:0",
    ),
    ({"instances": [inst()]}, "instances.0.metrics_listen", None),
    ({"binary": ""}, "binary", None),
    ({"log_dir": "  "}, "log_dir", None),
    ({"ca_file": "/etc/ca.pem"}, "ca_file", "/etc/ca.pem"),
    ({"restart": None}, "restart", RestartPolicy()),
    ({"restart": {"max_restarts": 2, "backoff": 2}}, "restart", RestartPolicy(max_restarts=2, backoff="2s")),
    ({"restart": {"backoff": "500ms"}}, "restart.backoff_seconds", 0.5),
    # nvcf
    ({"nvcf": None}, "nvcf", NvcfConfig()),
    ({"nvcf": {"poll_window": "1s"}}, "nvcf.poll_window_seconds", 1),
    ({"nvcf": {"poll_window": 3600}}, "nvcf.poll_window", "1h"),
    ({"nvcf": {"poll_window": "1m"}}, "nvcf.poll_window_seconds", 60),
    ({"nvcf": {"budget": "31m40s"}}, "nvcf.budget_seconds", 1900.0),
    ({"nvcf": {"budget": 90}}, "nvcf.budget", "1m30s"),
    ({"nvcf": {"follow": False}}, "nvcf.follow", False),
    ({"nvcf": {"status_url": f" {STATUS} "}}, "nvcf.status_url", STATUS),
    ({"nvcf": {"status_url": None}}, "nvcf.status_url", None),
    ({"instances": [inst(nvcf={"follow": False})]}, "instances.0.nvcf.follow", False),
    ({"instances": [inst(upstream="https://API.Example.com:443/v1?x=1")]}, "instances.0.upstream", UP),
    (
        {"instances": [inst(upstream="https://h.example.com:8443/")]},
        "instances.0.upstream",
        "https://h.example.com:8443",
    ),
    ({"instances": [inst(listen="[::1]:1250")]}, "instances.0.listen_host", "::1"),
    ({"instances": [inst(listen="localhost:0")]}, "instances.0.listen_port", 0),
    ({"instances": [inst(listen="127.0.0.2:65535")]}, "instances.0.listen_port", 65535),
    ({"instances": [inst(name="A_b-9")]}, "instances.0.name", "A_b-9"),
    # two port-0 listens on one host are not a clash: the kernel picks two free ports
    (
        {"instances": [inst("a", "127.0.0.1:0"), inst("b", "127.0.0.1:0")]},
        "instances.1.listen",
        "127.0.0.1:0",
    ),
    # same port on two loopback addresses is fine
    (
        {"instances": [inst("a", "127.0.0.1:1250"), inst("b", "127.0.0.2:1250")]},
        "instances.1.listen_port",
        1250,
    ),
    (
        {"instances": [inst(listen="0.0.0.0:1250")], "allow_non_loopback": True},
        "instances.0.listen_host",
        "0.0.0.0",
    ),
    (
        {"instances": [inst(listen="node7:1250")], "allow_non_loopback": True},
        "instances.0.listen_host",
        "node7",
    ),
]


def _attr(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[int(part)] if part.isdigit() else getattr(config, part)
    return config


@pytest.mark.filterwarnings("ignore::sidecar_fsm.errors.ConfigWarning")  # dropped paths: tested below
@pytest.mark.parametrize(("block", "attribute", "expected"), GOOD)
def test_accepted(block: dict[str, Any], attribute: str, expected: Any) -> None:
    assert _attr(load(block), attribute) == expected


def test_enabled_with_instances() -> None:
    config = load(
        {"enabled": True, "instances": [inst("policy", "127.0.0.1:0"), inst("judge", "127.0.0.1:0")]}
    )
    assert config.enabled
    assert [i.name for i in config.instances] == ["policy", "judge"]


# --- refused values: the exact one-line message -----------------------------------------------

SIZE = "is not a size; use bytes or a KiB, MiB, GiB or TiB count like '100MiB', or 0 to never rotate"
BACKUPS = "try 5, or 0 to cut the log in place when it is full"

NVCF_WINDOW = "must be whole seconds from 1s to 3600s (NVCF-POLL-SECONDS); try '60s', " + (
    "or null to leave it to each client"
)
NVCF_URL = f"must be an https:// URL template; try '{STATUS}'"

BAD = [
    # nvcf
    ({"nvcf": {"poll_window": "0s"}}, f"sidecar.nvcf.poll_window: '0s' {NVCF_WINDOW}"),
    ({"nvcf": {"poll_window": "3601s"}}, f"sidecar.nvcf.poll_window: '3601s' {NVCF_WINDOW}"),
    ({"nvcf": {"poll_window": "1.5s"}}, f"sidecar.nvcf.poll_window: '1.5s' {NVCF_WINDOW}"),
    ({"nvcf": {"poll_window": 1.5}}, f"sidecar.nvcf.poll_window: '1.5' {NVCF_WINDOW}"),
    ({"nvcf": {"poll_window": "2h"}}, f"sidecar.nvcf.poll_window: '2h' {NVCF_WINDOW}"),
    (
        {"nvcf": {"poll_window": "60"}},
        "sidecar.nvcf.poll_window: '60' has no unit; write '60s', or the number 60 unquoted for seconds",
    ),
    (
        {"nvcf": {"budget": "-5m"}},
        "sidecar.nvcf.budget: '-5m' must not be negative; use a duration like '60m'",
    ),
    (
        {"nvcf": {"budget": "0s"}},
        "sidecar.nvcf.budget: '0s' must be above 0; try '60m', below the client's own timeout",
    ),
    ({"nvcf": {"budget": None}}, f"sidecar.nvcf.budget: 'null' is not a duration; {DURATION_HINT}"),
    ({"nvcf": {"follow": "maybe"}}, "sidecar.nvcf.follow: 'maybe' is not a boolean; use true or false"),
    (
        {"nvcf": {"status_url": "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/"}},
        "sidecar.nvcf.status_url: 'https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/' has no {reqid} "
        f"for the request id; try '{STATUS}'",
    ),
    (
        {"nvcf": {"status_url": "http://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}"}},
        f"sidecar.nvcf.status_url: 'http://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{{reqid}}' {NVCF_URL}",
    ),
    (
        {"nvcf": {"status_url": "/v2/status/{reqid}"}},
        f"sidecar.nvcf.status_url: '/v2/status/{{reqid}}' {NVCF_URL}",
    ),
    (
        {"nvcf": {"status_url": "https://u:pw@h.example.com/{reqid}"}},
        "sidecar.nvcf.status_url: 'https://***@h.example.com/{reqid}' must not carry credentials "
        "(the client's Authorization is sent); drop them",
    ),
    ({"nvcf": {"status_url": 5}}, "sidecar.nvcf.status_url: '5' is not a string; quote it"),
    ({"nvcf": {"window": "5s"}}, "sidecar.nvcf.window: unknown key; did you mean 'poll_window'?"),
    (
        {"instances": [inst(nvcf={"poll_window": "0s"})]},
        f"sidecar.instances[0].nvcf.poll_window: '0s' {NVCF_WINDOW}",
    ),
    # log rotation
    ({"log_max_bytes": "100MB"}, f"sidecar.log_max_bytes: '100MB' {SIZE}"),
    ({"log_max_bytes": -1}, f"sidecar.log_max_bytes: '-1' {SIZE}"),
    ({"log_max_bytes": "1.5GiB"}, f"sidecar.log_max_bytes: '1.5GiB' {SIZE}"),
    ({"log_max_bytes": True}, f"sidecar.log_max_bytes: 'true' {SIZE}"),
    ({"log_backups": -1}, f"sidecar.log_backups: '-1' must be 0 or more; {BACKUPS}"),
    ({"log_backups": True}, f"sidecar.log_backups: 'true' is not a whole number; {BACKUPS}"),
    # durations
    ({"ping_interval": "6m"}, f"sidecar.ping_interval: '6m' {PING}"),
    ({"ping_interval": "340s"}, f"sidecar.ping_interval: '340s' {PING}"),
    ({"ping_interval": 0}, f"sidecar.ping_interval: '0' {PING}"),
    ({"ping_interval": "soon"}, f"sidecar.ping_interval: 'soon' is not a duration; {DURATION_HINT}"),
    ({"ping_interval": "60S"}, f"sidecar.ping_interval: '60S' is not a duration; {DURATION_HINT}"),
    ({"ping_interval": "1m 30s"}, f"sidecar.ping_interval: '1m 30s' is not a duration; {DURATION_HINT}"),
    ({"ping_interval": ""}, f"sidecar.ping_interval: '' is not a duration; {DURATION_HINT}"),
    # a string needs its unit, as Go (and NeMo Gym) read it; the number 90 is seconds
    (
        {"ping_interval": "90"},
        "sidecar.ping_interval: '90' has no unit; write '90s', or the number 90 unquoted for seconds",
    ),
    (
        {"shutdown_grace": "1e3"},
        "sidecar.shutdown_grace: '1e3' has no unit; write '16m40s', or the number 1e3 unquoted for seconds",
    ),
    ({"ping_timeout": "-5"}, "sidecar.ping_timeout: '-5' must not be negative; use a duration like '15s'"),
    ({"ping_interval": None}, f"sidecar.ping_interval: 'null' is not a duration; {DURATION_HINT}"),
    (
        {"ping_interval": "-5s"},
        "sidecar.ping_interval: '-5s' must not be negative; use a duration like '60s'",
    ),
    ({"ping_interval": -5}, "sidecar.ping_interval: '-5' must not be negative; use a duration like '60s'"),
    ({"ping_interval": float("nan")}, f"sidecar.ping_interval: 'nan' is not a duration; {DURATION_HINT}"),
    ({"ping_timeout": "0s"}, "sidecar.ping_timeout: '0s' must be above 0; try '15s'"),
    ({"ping_timeout": 1e-10}, "sidecar.ping_timeout: '1e-10' must be above 0; try '15s'"),
    (
        {"shutdown_grace": "2562048h"},
        "sidecar.shutdown_grace: '2562048h' is longer than go allows (about 292 years); "
        "use a duration like '60s'",
    ),
    ({"ping_timeout": "-1s"}, "sidecar.ping_timeout: '-1s' must not be negative; use a duration like '15s'"),
    ({"shutdown_grace": True}, f"sidecar.shutdown_grace: 'true' is not a duration; {DURATION_HINT}"),
    (
        {"shutdown_grace": "-1m"},
        "sidecar.shutdown_grace: '-1m' must not be negative; use a duration like '60s'",
    ),
    ({"max_conn_age": "1h"}, f"sidecar.max_conn_age: '1h' {AGE}"),
    ({"max_conn_age": 3600}, f"sidecar.max_conn_age: '3600' {AGE}"),
    ({"max_conn_age": "-1s"}, "sidecar.max_conn_age: '-1s' must not be negative; use a duration like '50m'"),
    ({"restart": {"backoff": "x"}}, f"sidecar.restart.backoff: 'x' is not a duration; {DURATION_HINT}"),
    (
        {"restart": {"backoff": "-1s"}},
        "sidecar.restart.backoff: '-1s' must not be negative; use a duration like '1s'",
    ),
    # numbers
    ({"retry_body_limit": -1}, f"sidecar.retry_body_limit: '-1' must be 0 or more; {BODY}"),
    ({"retry_body_limit": "16MiB"}, "sidecar.retry_body_limit: '16MiB' is not a whole number"),
    ({"retry_body_limit": True}, f"sidecar.retry_body_limit: 'true' is not a whole number of bytes; {BODY}"),
    ({"gomaxprocs": 0}, f"sidecar.gomaxprocs: '0' must be a positive whole number; {PROCS}"),
    ({"gomaxprocs": -2}, f"sidecar.gomaxprocs: '-2' must be a positive whole number; {PROCS}"),
    ({"gomaxprocs": 1.5}, "sidecar.gomaxprocs: '1.5' is not a whole number"),
    ({"gomaxprocs": True}, f"sidecar.gomaxprocs: 'true' is not a whole number; {PROCS}"),
    (
        {"startup_timeout_seconds": 0},
        "sidecar.startup_timeout_seconds: '0' must be a number of seconds above 0; try 30",
    ),
    (
        {"startup_timeout_seconds": -3},
        "sidecar.startup_timeout_seconds: '-3' must be a number of seconds above 0; try 30",
    ),
    (
        {"startup_timeout_seconds": "inf"},
        "sidecar.startup_timeout_seconds: 'inf' must be a number of seconds above 0; try 30",
    ),
    ({"startup_timeout_seconds": "30s"}, "sidecar.startup_timeout_seconds: '30s' is not a number"),
    (
        {"restart": {"max_restarts": -1}},
        "sidecar.restart.max_restarts: '-1' must be 0 or more; try 2, or 0 to fail fast",
    ),
    ({"restart": {"max_restarts": "two"}}, "sidecar.restart.max_restarts: 'two' is not a whole number"),
    # gomemlimit in Go's GOMEMLIMIT syntax
    ({"gomemlimit": "1GB"}, f"sidecar.gomemlimit: '1GB' is not a go memory limit; {MEM_HINT}"),
    ({"gomemlimit": "1 GiB"}, f"sidecar.gomemlimit: '1 GiB' is not a go memory limit; {MEM_HINT}"),
    ({"gomemlimit": "1.5GiB"}, f"sidecar.gomemlimit: '1.5GiB' is not a go memory limit; {MEM_HINT}"),
    ({"gomemlimit": "1gib"}, f"sidecar.gomemlimit: '1gib' is not a go memory limit; {MEM_HINT}"),
    ({"gomemlimit": "-1"}, f"sidecar.gomemlimit: '-1' is not a go memory limit; {MEM_HINT}"),
    ({"gomemlimit": 1.5}, f"sidecar.gomemlimit: '1.5' is not a go memory limit; {MEM_HINT}"),
    (
        {"gomemlimit": "8388608TiB"},
        f"sidecar.gomemlimit: '8388608TiB' is larger than go allows (2^63-1 bytes); {MEM_HINT}",
    ),
    # booleans and types
    ({"enabled": "maybe"}, "sidecar.enabled: 'maybe' is not a boolean; use true or false"),
    ({"allow_non_loopback": 2}, "sidecar.allow_non_loopback: '2' is not a boolean; use true or false"),
    ({"metrics": "sometimes"}, "sidecar.metrics: 'sometimes' is not a boolean; use true or false"),
    ({"binary": 5}, "sidecar.binary: '5' is not a string; quote it"),
    ({"restart": 3}, "sidecar.restart: '3' is not a mapping of keys; write {max_restarts: N, backoff: 1s}"),
    ({"instances": "x"}, f"sidecar.instances: 'x' is not a list; {LIST_HINT}"),
    ({"instances": ["x"]}, f"sidecar.instances[0]: 'x' is not a mapping of keys; {LIST_HINT}"),
    # unknown keys, Gym's old `nodes` included
    (
        {"nodes": [{"host": "n1"}]},
        "sidecar.nodes: NeMo Gym's old 'nodes' key is not supported: the sidecar always runs next to the "
        "servers that call it (one per node, started by gym env start there); remove it",
    ),
    ({"ping_intervall": "5s"}, "sidecar.ping_intervall: unknown key; did you mean 'ping_interval'?"),
    (
        {"zzz": 1},
        "sidecar.zzz: unknown key; known keys are access_log, allow_non_loopback, binary, build_if_missing, "
        "ca_file, enabled, exit_with_owner, gomaxprocs, gomemlimit, insecure_skip_verify, instances, "
        "log_backups, log_dir, log_max_bytes, max_conn_age, metrics, nvcf, ping_interval, ping_timeout, "
        "restart, retry_body_limit, rewrite_base_urls, shutdown_grace, startup_timeout_seconds, "
        "upstream_check, upstream_check_seconds",
    ),
    (
        {"restart": {"max_restart": 1}},
        "sidecar.restart.max_restart: unknown key; did you mean 'max_restarts'?",
    ),
    (
        {"instances": [inst(port=1250)]},
        "sidecar.instances[0].port: unknown key; known keys are listen, metrics_listen, name, nvcf, upstream",
    ),
    # names
    (
        {"instances": [inst("a", "127.0.0.1:1"), inst("b", "127.0.0.1:2"), inst("a", "127.0.0.1:3")]},
        "sidecar.instances[2].name: 'a' is also the name of instances[0]; names must be unique, "
        "so give each instance its own",
    ),
    # upstreams
    (
        {"instances": [{"name": "x"}]},
        "sidecar.instances[0].upstream is required; set it to the https:// url to forward to, like https://api.example.com",
    ),
    # listens
    (
        {"instances": [inst("a"), inst("b")]},
        "sidecar.instances[1].listen: '127.0.0.1:1250' clashes with "
        f"instances[0].listen '127.0.0.1:1250'; {CLASH}",
    ),
    (
        {"instances": [inst("a", "localhost:1250"), inst("b", "127.0.0.1:1250")]},
        "sidecar.instances[1].listen: '127.0.0.1:1250' clashes with "
        f"instances[0].listen 'localhost:1250'; {CLASH}",
    ),
    (
        {"instances": [inst("a", "0.0.0.0:9"), inst("b", "127.0.0.1:9")], "allow_non_loopback": True},
        f"sidecar.instances[1].listen: '127.0.0.1:9' clashes with instances[0].listen '0.0.0.0:9'; {CLASH}",
    ),
    # the upstream check and fixed metrics addresses
    ({"upstream_check": "loud"}, "sidecar.upstream_check: 'loud' must be warn, fail or off; try warn"),
    ({"upstream_check": "WARN"}, "sidecar.upstream_check: 'WARN' must be warn, fail or off; try warn"),
    ({"upstream_check": True}, "sidecar.upstream_check: 'true' must be warn, fail or off; try warn"),
    (
        {"upstream_check": "fail", "metrics": False},
        "sidecar.upstream_check: 'fail' needs metrics: true (the verdict is read from each proxy's "
        "metrics listener); set metrics: true or upstream_check: warn",
    ),
    (
        {"upstream_check_seconds": 0},
        "sidecar.upstream_check_seconds: '0' must be a number of seconds above 0; "
        "try 10, or upstream_check: off",
    ),
    ({"upstream_check_seconds": "10s"}, "sidecar.upstream_check_seconds: '10s' is not a number"),
    (
        {"upstream_check_seconds": True},
        "sidecar.upstream_check_seconds: 'true' is not a number of seconds; try 10, or upstream_check: off",
    ),
    (
        {"instances": [inst(metrics_listen="10.0.0.1:9464")]},
        f"sidecar.instances[0].metrics_listen: '10.0.0.1:9464' is not loopback; {MLOOP}",
    ),
    (
        {"instances": [inst(metrics_listen="10.0.0.1:9464")], "allow_non_loopback": True},
        f"sidecar.instances[0].metrics_listen: '10.0.0.1:9464' is not loopback; {MLOOP}",
    ),
    (
        {"instances": [inst(metrics_listen="9464")]},
        "sidecar.instances[0].metrics_listen: '9464' is not host:port; "
        "use 127.0.0.1:PORT (0 picks a free port; IPv6 as [::1]:PORT)",
    ),
    (
        {"instances": [inst(metrics_listen="127.0.0.1:9464")], "metrics": False},
        "sidecar.instances[0].metrics_listen: '127.0.0.1:9464' needs metrics: true "
        "(with metrics off no proxy serves /metrics); set metrics: true or drop metrics_listen",
    ),
    (
        {"instances": [inst(metrics_listen="127.0.0.1:1250")]},
        f"sidecar.instances[0].metrics_listen: '127.0.0.1:1250' clashes with instances[0].listen; {MCLASH}",
    ),
    (
        {"instances": [inst("a", metrics_listen="127.0.0.1:1251"), inst("b", "127.0.0.1:1251")]},
        f"sidecar.instances[0].metrics_listen: '127.0.0.1:1251' clashes with instances[1].listen; {MCLASH}",
    ),
    (
        {
            "instances": [
                inst("a", metrics_listen="127.0.0.1:9464"),
                inst("b", "127.0.0.1:1251", metrics_listen="localhost:9464"),
            ]
        },
        "sidecar.instances[1].metrics_listen: 'localhost:9464' clashes with "
        f"instances[0].metrics_listen; {MCLASH}",
    ),
]


@pytest.mark.parametrize(("block", "message"), BAD)
def test_refused_with_exact_message(block: dict[str, Any], message: str) -> None:
    assert refusal(block) == message


# One field of the only instance refused: (field, value, what the refusal says after
# "sidecar.instances[0].FIELD: "), which always opens with the value as shown (credentials masked).
BAD_INSTANCE_FIELD = [
    # names
    ("name", "-x", f"'-x' {NAME}"),
    ("name", "a b", f"'a b' {NAME}"),
    ("name", "", f"'' {NAME}"),
    # upstreams
    ("upstream", "http://api.example.com", f"'http://api.example.com' {HTTPS}"),
    ("upstream", "http://user:pw@api.example.com", f"'http://***@api.example.com' {HTTPS}"),
    (
        "upstream",
        "https://h:99999",
        "'https://h:99999' has an invalid port (must be 1-65535); use https://HOST[:PORT]",
    ),
    (
        "upstream",
        "api.example.com",
        "'api.example.com' is not an absolute URL (scheme://host); use https://HOST[:PORT]",
    ),
    (
        "upstream",
        "https://[::1/v1",
        "'https://[::1/v1' is not a valid URL (bad IPv6 address in brackets); use https://HOST[:PORT]",
    ),
    # listens
    ("listen", "1250", f"'1250' is not host:port; {LISTEN_HINT}"),
    ("listen", 1250, "'1250' is not a string; use a string like '127.0.0.1:1250'"),
    ("listen", ":1250", "':1250' has no host; use 127.0.0.1:PORT, or 0.0.0.0:PORT with allow_non_loopback"),
    ("listen", "::1:1250", "'::1:1250' has an IPv6 host without brackets; write it like [::1]:1250"),
    ("listen", "[::1]1250", f"'[::1]1250' is not host:port; {LISTEN_HINT}"),
    ("listen", "[nope]:1250", f"'[nope]:1250' has an invalid IPv6 address; {LISTEN_HINT}"),
    ("listen", "127.0.0.1:70000", f"'127.0.0.1:70000' has port 70000 outside 0-65535; {LISTEN_HINT}"),
    ("listen", "127.0.0.1:-1", f"'127.0.0.1:-1' has a port that is not a number; {LISTEN_HINT}"),
    ("listen", "127.0.0.1:", f"'127.0.0.1:' has a port that is not a number; {LISTEN_HINT}"),
    ("listen", "bad host:1", f"'bad host:1' has an invalid host; {LISTEN_HINT}"),
]


@pytest.mark.parametrize(("field", "value", "said"), BAD_INSTANCE_FIELD)
def test_a_bad_field_of_an_instance_is_refused_naming_it(field: str, value: Any, said: str) -> None:
    assert refusal({"instances": [inst(**{field: value})]}) == f"sidecar.instances[0].{field}: {said}"


def test_an_instance_nvcf_block_overrides_only_the_keys_it_sets() -> None:
    config = load(
        {
            "nvcf": {"poll_window": "30s", "budget": "20m", "status_url": STATUS},
            "instances": [
                inst("plain"),
                inst("judge", "127.0.0.1:1251", nvcf={"budget": "31m40s", "status_url": None}),
            ],
        }
    )
    plain, judge = (config.nvcf_of(i) for i in config.instances)
    assert plain == config.nvcf
    assert (judge.follow, judge.poll_window, judge.budget, judge.status_url) == (True, "30s", "31m40s", None)


def test_instances_required_when_enabled_shows_a_yaml_example_in_one_line() -> None:
    (line,) = refusal({"enabled": True}).splitlines()
    head = (
        "sidecar.instances is required when sidecar.enabled is true; "
        "add one instance per upstream, for example "
    )
    assert line.startswith(head), line
    # what follows is a working block, in YAML
    shown = yaml.safe_load(line.removeprefix(head))
    assert load({"enabled": True, **shown}).instances == [SidecarInstanceConfig(upstream=UP)]


def test_several_problems_are_all_reported_first_on_line_one() -> None:
    assert refusal({"ping_timeout": "0s", "gomaxprocs": 0}).splitlines() == [
        "sidecar.ping_timeout: '0s' must be above 0; try '15s'",
        f"  also sidecar.gomaxprocs: '0' must be a positive whole number; {PROCS}",
    ]


@pytest.mark.parametrize(
    "build",
    [
        lambda: H2PingSidecarConfig(ping_interval="6m"),
        lambda: H2PingSidecarConfig.model_validate({"ping_interval": "6m"}),
        lambda: H2PingSidecarConfig.model_validate_json('{"ping_interval": "6m"}'),
        lambda: SidecarInstanceConfig(upstream="http://x"),
        lambda: RestartPolicy(max_restarts=-1),
    ],
    ids=["init", "model_validate", "model_validate_json", "instance", "restart"],
)
def test_every_constructor_raises_a_worded_validation_error(build: Any) -> None:
    # pydantic's own type, as NeMo Gym's schema raises: Gym's `except ValidationError` catches it
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.__cause__ is None
    (error,) = caught.value.errors()
    assert error["msg"].startswith("sidecar.") and error["msg"] in str(caught.value)


def test_direct_construction_messages_name_the_model() -> None:
    with pytest.raises(ValidationError) as caught:
        SidecarInstanceConfig(upstream="http://x")
    assert describe_error(caught.value).startswith("sidecar.instance.upstream: 'http://x' must be https://")
    with pytest.raises(ValidationError) as caught:
        RestartPolicy(max_restarts=-1)
    assert describe_error(caught.value).startswith("sidecar.restart.max_restarts: '-1' must be 0 or more")


def test_errors_keep_pydantic_type_and_location() -> None:
    with pytest.raises(ValidationError) as caught:
        load({"instances": [inst(), inst("b", listen="x")], "zzz": 1})
    assert [(e["type"], e["loc"]) for e in caught.value.errors()] == [
        ("value_error", ("instances", 1, "listen")),
        ("extra_forbidden", ("zzz",)),
    ]
    assert caught.value.title == "H2PingSidecarConfig"


def test_credentials_in_a_bad_value_never_reach_the_error() -> None:
    # pydantic would print the input (input_value=...) with the token in it; ours masks it
    with pytest.raises(ValidationError) as caught:
        load({"instances": [inst(upstream="http://user:TOKEN@api.example.com/v1")]})
    assert "TOKEN" not in str(caught.value)
    assert "TOKEN" not in repr(caught.value.errors())
    assert "'http://***@api.example.com/v1' must be https://" in str(caught.value)


def test_describe_error_of_a_config_error_is_its_text() -> None:
    assert describe_error(ConfigError("sidecar.ca_file: '/x' is not a readable file")) == (
        "sidecar.ca_file: '/x' is not a readable file"
    )


def test_describe_error_of_another_models_error_names_its_location() -> None:
    class Other(BaseModel):
        port: int

    with pytest.raises(ValidationError) as caught:
        Other.model_validate({"port": "x"})
    assert describe_error(caught.value).startswith("port: input should be a valid integer")


# --- NeMo Gym's own expectations (tests/unit_tests/h2_ping_sidecar/test_launcher.py) -----------

GYM_INSTANCE = {"name": "nvcf", "upstream": "https://abc123.invocation.api.nvcf.nvidia.com"}

GYM_REFUSALS = [
    # (extra keys of an enabled block with one instance, a fragment Gym's tests match)
    ({"ping_interval": "340s"}, "ping_interval"),
    ({"ping_interval": "6m"}, "ping_interval"),
    ({"ping_interval": "1h"}, "ping_interval"),
    ({"ping_interval": "0s"}, "ping_interval"),
    ({"memory": "1GiB"}, "memory"),
    ({"nodes": "all"}, "nodes"),
    ({"instances": [{"upstream": "http://example.com"}]}, "https"),
    *(
        ({"instances": [{"upstream": GYM_INSTANCE["upstream"], "listen": listen}]}, "listen")
        for listen in ("1250", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:x")
    ),
    *(({"gomemlimit": value}, "gomemlimit") for value in ("1GB", "lots", "-1", "1 GiB")),
    ({"retry_body_limit": -1}, "retry_body_limit"),
    *(({"max_conn_age": value}, "max_conn_age") for value in ("60m", "1h", "2h", 3600, "soon")),
    ({"gomaxprocs": 0}, "gomaxprocs"),
    (
        {
            "instances": [
                {**GYM_INSTANCE, "name": "a"},
                {**GYM_INSTANCE, "name": "a", "listen": "127.0.0.1:1251"},
            ]
        },
        "unique",
    ),
    ({"instances": [{**GYM_INSTANCE, "name": "a"}, {**GYM_INSTANCE, "name": "b"}]}, "different addresses"),
]


@pytest.mark.parametrize(("extra", "fragment"), GYM_REFUSALS)
def test_gym_refusals_raise_validation_error_with_gyms_words(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        H2PingSidecarConfig.model_validate({"enabled": True, "instances": [GYM_INSTANCE], **extra})


def test_gym_instances_required_wording() -> None:
    with pytest.raises(ValidationError, match="instances is required"):
        H2PingSidecarConfig.model_validate({"enabled": True})
    assert H2PingSidecarConfig.model_validate({"enabled": False}).instances == []


def test_gym_upstream_origin_takes_just_the_url() -> None:
    assert upstream_origin("https://API.example.com/v1") == "https://api.example.com"
    with pytest.raises(ValueError, match="https"):
        upstream_origin("http://api.example.com")


# --- an upstream's dropped path: one warning naming the field and the value --------------------


def _warnings_of(block: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(block)
    assert all(w.category is ConfigWarning for w in caught)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("listen", ["0.0.0.0:1250", "node7:1250", "[::]:1250"])
def test_a_listen_off_loopback_is_accepted_as_gym_accepts_it(listen: str) -> None:
    """The launcher prints Gym's warning for it (tests/integration/test_launcher.py)."""
    block = {"enabled": True, "instances": [inst("a", "127.0.0.1:1"), inst("b", listen)]}
    assert H2PingSidecarConfig.model_validate(block).instances[1].listen == listen


def test_an_upstream_path_is_dropped_with_a_warning() -> None:
    block = {
        "instances": [inst("a", upstream=UP), inst("b", "127.0.0.1:0", "https://u:pw@API.example.com/v1")]
    }
    assert _warnings_of(block) == [
        "sidecar.instances[1].upstream: 'https://API.example.com/v1' has a path ('/v1'), which is "
        "dropped: each client's own path is forwarded; write 'https://api.example.com'"
    ]
    with pytest.warns(ConfigWarning):
        assert load(block).instances[1].upstream == UP


def test_a_query_is_dropped_with_a_warning_that_does_not_show_it() -> None:
    (message,) = _warnings_of({"instances": [inst(upstream=f"{UP}/v1?api-key=SECRET")]})
    assert message == (
        f"sidecar.instances[0].upstream: '{UP}/v1' has a path ('/v1') and a query, which are dropped: "
        f"each client's own path is forwarded; write '{UP}'"
    )


@pytest.mark.parametrize("upstream", [UP, f"{UP}/", "https://api.example.com:443", "https://API.example.com"])
def test_nothing_dropped_no_warning(upstream: str) -> None:
    assert _warnings_of({"instances": [inst(upstream=upstream)]}) == []


def test_a_refused_block_warns_about_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValidationError):
            load({"instances": [inst("a", upstream=f"{UP}/v1"), inst("a", "127.0.0.1:1")]})
    assert caught == []


# --- reading from a NeMo Gym global config ----------------------------------------------------


def test_gym_block_unchanged_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVCF_URL", "https://NVCF.example.com/v1")
    global_config = OmegaConf.create(
        {
            "nemo_gym_log_dir": "/tmp/logs",
            "policy_base_url": "https://judge.example.com/v1",
            "sidecar": {
                "enabled": True,
                "binary": None,
                "build_if_missing": True,
                "instances": [
                    {"name": "nvcf", "upstream": "${oc.env:NVCF_URL}", "listen": "127.0.0.1:1250"},
                    {"name": "judge", "upstream": "${policy_base_url}", "listen": "127.0.0.1:1251"},
                ],
                "ping_interval": "60s",
                "ping_timeout": "15s",
                "shutdown_grace": "60s",
                "retry_body_limit": 16777216,
                "max_conn_age": "50m",
                "insecure_skip_verify": False,
                "gomemlimit": "1GiB",
                "gomaxprocs": 2,
                "startup_timeout_seconds": 30,
                "log_dir": None,
                "rewrite_base_urls": True,
            },
        }
    )
    with pytest.warns(ConfigWarning, match=r"has a path \('/v1'\), which is dropped"):
        config = h2_ping_sidecar_config_from_global_config(global_config)
    assert [(i.name, i.upstream, i.listen) for i in config.instances] == [
        ("nvcf", "https://nvcf.example.com", "127.0.0.1:1250"),
        ("judge", "https://judge.example.com", "127.0.0.1:1251"),
    ]
    assert (config.gomemlimit, config.gomaxprocs) == ("1GiB", 2)
    # read-only: the config still holds its interpolations
    assert OmegaConf.to_container(global_config, resolve=False)["sidecar"]["instances"][0]["upstream"] == (  # type: ignore[index]
        "${oc.env:NVCF_URL}"
    )


def test_plain_dict_interpolations_are_resolved_like_omegaconf() -> None:
    with pytest.warns(
        ConfigWarning, match=r"^sidecar\.instances\[0\]\.upstream: 'https://judge\.example\.com/v1'"
    ):
        config = h2_ping_sidecar_config_from_global_config(
            {
                "judge_url": "https://judge.example.com/v1",
                "sidecar": {"instances": [{"upstream": "${judge_url}"}]},
            }
        )
    assert config.instances[0].upstream == "https://judge.example.com"


def test_dotlist_overrides_validate() -> None:
    # `sidecar-fsm start cfg.yaml sidecar.ping_interval=90`: OmegaConf reads 90 as a number (seconds)
    base = OmegaConf.create({"sidecar": {"enabled": True, "instances": [inst()]}})
    merged = OmegaConf.merge(
        base, OmegaConf.from_dotlist(["sidecar.ping_interval=90", "sidecar.enabled=false"])
    )
    config = h2_ping_sidecar_config_from_global_config(merged)
    assert (config.ping_interval, config.enabled) == ("1m30s", False)


def test_unresolvable_interpolation_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIDECAR_FSM_TEST_UNSET", raising=False)
    global_config = OmegaConf.create(
        {"sidecar": {"enabled": True, "instances": [{"upstream": "${oc.env:SIDECAR_FSM_TEST_UNSET}"}]}}
    )
    with pytest.raises(ValidationError) as caught:
        h2_ping_sidecar_config_from_global_config(global_config)
    assert describe_error(caught.value) == (
        "sidecar.instances[0].upstream: '${oc.env:SIDECAR_FSM_TEST_UNSET}' cannot be resolved "
        "(environment variable 'SIDECAR_FSM_TEST_UNSET' not found); set what it refers to, or write the value"
    )


def test_missing_mandatory_value_names_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        h2_ping_sidecar_config_from_global_config(OmegaConf.create({"sidecar": {"enabled": "???"}}))
    assert describe_error(caught.value) == (
        "sidecar.enabled: '???' is a mandatory value that was never set; "
        "set it in the config or on the command line"
    )


@pytest.mark.parametrize("block", [True, "on", [1, 2]])
def test_block_that_is_not_a_mapping(block: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        h2_ping_sidecar_config_from_global_config(OmegaConf.create({"sidecar": block}))
    assert describe_error(caught.value).startswith("sidecar: '")
    assert "' is not a mapping of settings; " in describe_error(caught.value)


# --- durations and addresses on their own ------------------------------------------------------

DURATIONS = [
    ("60s", 60.0),
    ("1m30s", 90.0),
    ("250ms", 0.25),
    ("1h", 3600.0),
    ("1h2m3s", 3723.0),
    ("1.5h", 5400.0),
    (".5s", 0.5),
    ("100us", 1e-4),
    ("100µs", 1e-4),
    ("10ns", 1e-8),
    ("0", 0.0),
    ("-0s", 0.0),
    ("+5s", 5.0),
    (90, 90.0),
    (2.5, 2.5),
]


@pytest.mark.parametrize(("value", "seconds"), DURATIONS)
def test_parse_duration_seconds(value: str | int | float, seconds: float) -> None:
    assert parse_duration_seconds(value, "f") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1d", f"f: '1d' is not a duration; {DURATION_HINT}"),
        ("s", f"f: 's' is not a duration; {DURATION_HINT}"),
        ("1m-30s", f"f: '1m-30s' is not a duration; {DURATION_HINT}"),
        ("90", "f: '90' has no unit; write '90s', or the number 90 unquoted for seconds"),
        ("", f"f: '' is not a duration; {DURATION_HINT}"),
        ("1m 30s", f"f: '1m 30s' is not a duration; {DURATION_HINT}"),
        (True, f"f: 'true' is not a duration; {DURATION_HINT}"),
        ("-1m", "f: '-1m' must not be negative; use a duration like '60s'"),
        (-0.5, "f: '-0.5' must not be negative; use a duration like '60s'"),
    ],
)
def test_parse_duration_seconds_refuses(value: str | float, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration_seconds(value, "f")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (90, "1m30s"),
        (0.25, "250ms"),
        (3600, "1h"),
        (3000, "50m"),
        (60, "1m"),
        (90.5, "1m30.5s"),
        (7261, "2h1m1s"),
        (0.0015, "1.5ms"),
        (1e-6, "1us"),
        (1e-9, "1ns"),
        (-90, "-1m30s"),
    ],
)
def test_format_go_duration(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text
    assert parse_duration_seconds(text.lstrip("-"), "f") == pytest.approx(abs(seconds))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("node7", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_split_listen() -> None:
    assert split_listen("127.0.0.1:1250") == ("127.0.0.1", 1250)
    assert split_listen("[::1]:0") == ("::1", 0)
    assert split_listen("localhost:65535") == ("localhost", 65535)


def test_config_survives_pickle_and_json() -> None:
    # Ray ships the config to every node's launcher
    config = load(
        {"enabled": True, "instances": [inst()], "ping_interval": 90, "restart": {"max_restarts": 1}}
    )
    assert pickle.loads(pickle.dumps(config)) == config
    assert H2PingSidecarConfig.model_validate_json(config.model_dump_json()) == config
