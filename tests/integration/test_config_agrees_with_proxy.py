"""The launcher's duration rules (``config.py``) against the proxy's own (``go/config.go``).

Python validates before any process exists, so both sides hold the rules; this test is what
keeps them one rule. It reads the defaults from the built proxy's ``-describe`` and asks the proxy
itself whether each boundary value is accepted: with ``-exit-with-pid -1`` (validated after
every duration; a missing ``-ca-file`` for the nvcf flags, checked after them) a value the proxy
accepts ends in that later flag's error, one it refuses in its own flag's, and the proxy exits 2
without binding anything either way.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from sidecar_fsm.config import H2PingSidecarConfig, parse_duration_seconds

# config.py field -> the proxy's flag.
FLAGS = {
    "ping_interval": "ping-interval",
    "ping_timeout": "ping-timeout",
    "shutdown_grace": "shutdown-grace",
    "max_conn_age": "max-conn-age",
    "retry_body_limit": "retry-body-limit",
}
# Defaults that differ on purpose (SPEC): the launcher always passes shutdown_grace, and 60 s is
# the launcher's drain; 15 m is the proxy's when run by hand, as NeMo Gym's proxy has it.
DIFFERENT_DEFAULTS = {"shutdown_grace": ("60s", "15m")}
# Boundary values of each duration rule; (field, value) pairs the launcher alone refuses.
BOUNDARIES = {
    "ping_interval": ["-1s", "0s", "1ms", "339s", "339.999s", "340s", "5m40s", "1h"],
    "ping_timeout": ["-1s", "0s", "1ms", "15s"],
    "shutdown_grace": ["-1s", "0s", "1ms", "15m"],
    "max_conn_age": ["-1s", "0s", "1ms", "59m59s", "3600s"],
}
# The load balancer's GOAWAY at 3600 s (config.py's LOAD_BALANCER_KEEP_ALIVE_SECONDS) is a
# launcher-side guard on a Gym config; the proxy takes any age, as SPEC has it.
LAUNCHER_ONLY_REFUSALS = {("max_conn_age", "3600s")}


def _proxy_defaults(binary: Path) -> dict[str, str]:
    """Each flag's default as ``-describe`` lists it."""
    done = subprocess.run([str(binary), "-describe"], capture_output=True, text=True, timeout=30, check=True)
    return {flag["name"]: flag["default"] for flag in json.loads(done.stdout)["flags"]}


def _proxy_accepts(
    binary: Path, flag: str, value: str, last: tuple[str, str] = ("exit-with-pid", "-1")
) -> bool:
    """Whether the proxy takes ``-flag value``: it then fails at ``last``, a bad flag it checks later."""
    argv = [str(binary), "-upstream", "https://127.0.0.1:9", f"-{flag}", value, f"-{last[0]}", last[1]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, (argv, done.stderr)
    assert done.stderr.startswith((f"-{flag} ", f"-{last[0]} ")), (argv, done.stderr)
    return done.stderr.startswith(f"-{last[0]} ")


def _launcher_accepts(field: str, value: object) -> bool:
    block = {"enabled": True, "instances": [{"name": "a", "upstream": "https://api.example.com"}]}
    try:
        H2PingSidecarConfig.model_validate({**block, field: value})
    except ValidationError:
        return False
    return True


def test_defaults_agree_with_the_proxys_description(sidecar_binary: Path) -> None:
    proxy = _proxy_defaults(sidecar_binary)
    launcher = H2PingSidecarConfig()
    differ = {}
    for field, flag in FLAGS.items():
        ours = getattr(launcher, field)
        if field == "retry_body_limit":
            same = int(proxy[flag]) == ours
        else:
            same = parse_duration_seconds(proxy[flag]) == parse_duration_seconds(ours)
        if not same:
            differ[field] = (str(ours), proxy[flag])
    assert differ == DIFFERENT_DEFAULTS


@pytest.mark.parametrize("field", sorted(BOUNDARIES))
def test_duration_limits_agree_with_the_proxy(sidecar_binary: Path, field: str) -> None:
    disagreements = []
    for value in BOUNDARIES[field]:
        proxy = _proxy_accepts(sidecar_binary, FLAGS[field], value)
        launcher = _launcher_accepts(field, value)
        expected = proxy and (field, value) not in LAUNCHER_ONLY_REFUSALS
        if launcher != expected:
            disagreements.append(f"{field}={value}: launcher accepts {launcher}, proxy {proxy}")
    assert disagreements == []


# nvcf's keys (a nested block) -> the proxy's flags, with boundary values of each rule.
NVCF_BOUNDARIES = {
    ("poll_window", "nvcf-poll-window"): ["-1s", "0s", "500ms", "1s", "1.5s", "1m", "3600s", "3601s", "2h"],
    ("budget", "nvcf-budget"): ["-1s", "0s", "1ms", "60m", "31m40s"],
    ("status_url", "nvcf-status-url"): [
        "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}",
        "https://h.example.com:8443/status?id={reqid}",
        "http://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}",
        "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/",
        "https://user:pw@h.example.com/{reqid}",
    ],
}


def test_nvcf_defaults_agree_with_the_proxys_help(sidecar_binary: Path) -> None:
    proxy = _proxy_defaults(sidecar_binary)
    nvcf = H2PingSidecarConfig().nvcf
    assert parse_duration_seconds(proxy["nvcf-budget"]) == nvcf.budget_seconds
    assert (proxy["nvcf-follow"], nvcf.follow) == ("true", True)
    assert (nvcf.poll_window, nvcf.status_url) == (None, None)


@pytest.mark.parametrize(("key", "flag"), sorted(NVCF_BOUNDARIES))
def test_nvcf_limits_agree_with_the_proxy(sidecar_binary: Path, key: str, flag: str) -> None:
    disagreements = []
    for value in NVCF_BOUNDARIES[(key, flag)]:
        # The -nvcf-* flags are checked after -exit-with-pid, before -ca-file.
        proxy = _proxy_accepts(sidecar_binary, flag, value, ("ca-file", "/nonexistent/ca.pem"))
        launcher = _launcher_accepts("nvcf", {key: value})
        if launcher != proxy:
            disagreements.append(f"nvcf.{key}={value}: launcher accepts {launcher}, proxy {proxy}")
    assert disagreements == []
