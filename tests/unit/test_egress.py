"""``base.egress``: the launcher's answer to "which proxy does the Go proxy dial this upstream through".

The rules are Go's (net/http's ProxyFromEnvironment); tests/integration/test_egress.py holds the
same table against Go itself. Here: each rule, and that no answer ever carries the credentials.
"""

from __future__ import annotations

import pytest

from sidecar_fsm.base.egress import egress_proxy, egress_route
from sidecar_fsm.config import H2PingSidecarConfig
from sidecar_fsm.run.command import sidecar_env

PROXY = "http://alice:s3cret@proxy.corp:3128"
SHOWN = "http://proxy.corp:3128"

# (environment, upstream, expected proxy or None for direct); shared with the Go differential test.
CASES: list[tuple[dict[str, str], str, str | None]] = [
    ({}, "https://api.example.com", None),
    ({"HTTPS_PROXY": PROXY}, "https://api.example.com", SHOWN),
    ({"https_proxy": PROXY}, "https://api.example.com", SHOWN),
    # Go prefers the upper-case name (urllib the lower-case one).
    ({"HTTPS_PROXY": PROXY, "https_proxy": "http://other:1"}, "https://api.example.com", SHOWN),
    ({"HTTPS_PROXY": "", "https_proxy": PROXY}, "https://api.example.com", SHOWN),
    # HTTP_PROXY and ALL_PROXY are not for https upstreams in Go.
    ({"HTTP_PROXY": PROXY, "ALL_PROXY": PROXY, "all_proxy": PROXY}, "https://api.example.com", None),
    ({"HTTPS_PROXY": "proxy.corp:3128"}, "https://api.example.com", SHOWN),
    ({"HTTPS_PROXY": "https://proxy.corp"}, "https://api.example.com", "https://proxy.corp"),
    ({"HTTPS_PROXY": PROXY}, "https://localhost:8443", None),
    ({"HTTPS_PROXY": PROXY}, "https://127.0.0.1:8443", None),
    # Go compares with "localhost" before lower-casing (the launcher lower-cases upstreams anyway).
    ({"HTTPS_PROXY": PROXY}, "https://LOCALHOST:8443", SHOWN),
    ({"HTTPS_PROXY": PROXY}, "https://localhost", None),
    ({"HTTPS_PROXY": PROXY}, "https://127.0.0.2", None),
    ({"HTTPS_PROXY": PROXY}, "https://[::1]:8443", None),
    # 0.0.0.0 is not loopback to Go (the tests use this to reach a local origin through a proxy).
    ({"HTTPS_PROXY": PROXY}, "https://0.0.0.0:8443", SHOWN),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "example.com"}, "https://api.example.com", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "example.com"}, "https://example.com", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": ".example.com"}, "https://example.com", SHOWN),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": ".example.com"}, "https://api.example.com", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "*.example.com"}, "https://api.example.com", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "ample.com"}, "https://api.example.com", SHOWN),
    ({"HTTPS_PROXY": PROXY, "no_proxy": " Other.org , EXAMPLE.com "}, "https://api.example.com", None),
    (
        {"HTTPS_PROXY": PROXY, "NO_PROXY": "other.org", "no_proxy": "example.com"},
        "https://api.example.com",
        SHOWN,
    ),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "example.com:443"}, "https://api.example.com", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "example.com:8443"}, "https://api.example.com", SHOWN),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "other.org,*"}, "https://api.example.com", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "10.0.0.0/8"}, "https://10.1.2.3", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "10.0.0.0/8"}, "https://11.1.2.3", SHOWN),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "10.1.2.3:8443"}, "https://10.1.2.3:8443", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "10.1.2.3:8443"}, "https://10.1.2.3", SHOWN),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "0.0.0.0"}, "https://0.0.0.0:8443", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "[2001:db8::1]:443"}, "https://[2001:db8::1]", None),
    ({"HTTPS_PROXY": PROXY, "NO_PROXY": "example.com"}, "https://10.1.2.3", SHOWN),
]


@pytest.mark.parametrize(("environ", "upstream", "expected"), CASES)
def test_go_rules(environ: dict[str, str], upstream: str, expected: str | None) -> None:
    assert egress_proxy(upstream, environ) == expected


def test_route_names_the_proxy_without_credentials() -> None:
    assert egress_route("https://api.example.com", {"HTTPS_PROXY": PROXY}) == f"via egress proxy {SHOWN}"
    assert egress_route("https://api.example.com", {}) == "direct"
    for environ, upstream, _ in CASES:
        assert "s3cret" not in egress_route(upstream, environ)


def test_sidecar_env_passes_the_proxy_variables_through_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    variables = {"HTTPS_PROXY": PROXY, "https_proxy": PROXY, "NO_PROXY": ".corp", "no_proxy": "x"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    config = H2PingSidecarConfig.model_validate(
        {"enabled": True, "instances": [{"name": "a", "upstream": "https://api.example.com"}]}
    )
    env = sidecar_env(config)
    assert {name: env[name] for name in variables} == variables
