"""urls: upstream origins (normalization, refusals with exact messages) and redaction."""

from __future__ import annotations

import pytest

from sidecar_fsm.base.urls import Origin, parse_origin, redact_url, upstream_origin, without_userinfo
from sidecar_fsm.errors import ConfigError

F = "sidecar.instances[0].upstream"
HINT = "use https://HOST[:PORT]"
HTTPS = f"must be https:// (HTTP/2 is chosen by ALPN); {HINT}"

GOOD_UPSTREAMS = [
    ("https://api.example.com", "https://api.example.com"),
    ("https://API.Example.COM", "https://api.example.com"),
    ("https://api.example.com/v1/chat?x=1#f", "https://api.example.com"),
    ("https://api.example.com:443/v1", "https://api.example.com"),
    ("https://api.example.com:8443", "https://api.example.com:8443"),
    ("HTTPS://api.example.com", "https://api.example.com"),
    ("https://user:secret@api.example.com/v1", "https://api.example.com"),
    ("https://[::1]:8443/x", "https://[::1]:8443"),
    ("https://[0:0::1]", "https://[::1]"),
    ("https://127.0.0.1:9443", "https://127.0.0.1:9443"),
    ("https://localhost:", "https://localhost"),
    ("  https://api.example.com  ", "https://api.example.com"),
]


@pytest.mark.parametrize(("url", "origin"), GOOD_UPSTREAMS)
def test_upstream_origin_normalizes(url: str, origin: str) -> None:
    assert upstream_origin(url, F) == origin


BAD_UPSTREAMS = [
    ("http://api.example.com", f"'http://api.example.com' {HTTPS}"),
    ("ftp://h", f"'ftp://h' {HTTPS}"),
    # credentials in a bad value are masked in the message
    ("http://u:pw@h/v1", f"'http://***@h/v1' {HTTPS}"),
    ("api.example.com:443", f"'api.example.com:443' is not an absolute URL (scheme://host); {HINT}"),
    ("https:/h", f"'https:/h' is not an absolute URL (scheme://host); {HINT}"),
    ("https:///v1", f"'https:///v1' has no host; {HINT}"),
    ("https://h:0", f"'https://h:0' has an invalid port (must be 1-65535); {HINT}"),
    ("https://h:99999", f"'https://h:99999' has an invalid port (must be 1-65535); {HINT}"),
    ("https://h:abc", f"'https://h:abc' has an invalid port (must be 1-65535); {HINT}"),
    ("https://exa mple.com", f"'https://exa mple.com' has an invalid host name; {HINT}"),
    ("https://[::1", f"'https://[::1' is not a valid URL (bad IPv6 address in brackets); {HINT}"),
    ("https://[nope]:1", f"'https://[nope]:1' is not a valid URL (bad IPv6 address in brackets); {HINT}"),
]


@pytest.mark.parametrize(("url", "message"), BAD_UPSTREAMS)
def test_upstream_origin_refuses(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        upstream_origin(url, F)
    assert str(caught.value) == f"{F}: {message}"


def test_upstream_origin_takes_gyms_one_argument() -> None:
    # NeMo Gym's config.upstream_origin(url): a ValueError for anything but https
    assert upstream_origin("https://API.example.com/v1") == "https://api.example.com"
    with pytest.raises(ValueError) as caught:
        upstream_origin("https://[invalid/v1")
    assert (
        str(caught.value)
        == f"upstream: 'https://[invalid/v1' is not a valid URL (bad IPv6 address in brackets); {HINT}"
    )


def test_parse_origin_compares_default_ports_and_case() -> None:
    assert parse_origin("https://API.example.com/v1") == parse_origin("https://api.example.com:443")
    assert parse_origin("http://h") == Origin("http", "h", 80)
    assert parse_origin("https://h:8443") != parse_origin("https://h")
    assert str(Origin("https", "::1", 443)) == "https://[::1]"
    assert str(Origin("https", "h", 8443)) == "https://h:8443"
    with pytest.raises(ValueError, match="has no port and scheme 'ws' has no default"):
        parse_origin("ws://h")


REDACTIONS = [
    ("https://api.example.com/v1", "https://api.example.com/v1"),
    ("https://user:secret@api.example.com/v1?api-key=k#frag", "https://api.example.com/v1"),
    ("https://api.example.com?token=t", "https://api.example.com"),
    ("https://u@h:8443", "https://h:8443"),
    ("http://127.0.0.1:1250/v1#x", "http://127.0.0.1:1250/v1"),
    ("https://[::1]:8443/p?q", "https://[::1]:8443/p"),
    # not a URL at all: still cut at ? and #, never raises
    ("not a url?secret=1", "not a url"),
    ("https://[::1", "https://[::1"),
    ("", ""),
]


@pytest.mark.parametrize(("url", "redacted"), REDACTIONS)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:p@h/x?y=1", "https://***@h/x?y=1"),
        ("https://h/p@q", "https://h/p@q"),  # an @ in the path is not userinfo
        ("plain text", "plain text"),
    ],
)
def test_without_userinfo(url: str, shown: str) -> None:
    assert without_userinfo(url) == shown
