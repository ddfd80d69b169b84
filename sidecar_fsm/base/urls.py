"""URL handling: the upstream origin the proxy is given, and the redacted form of any URL we keep.

Owns parsing a URL into (scheme, host, port), normalizing an upstream to ``https://host[:port]``,
and stripping userinfo, query and fragment before a URL (alone, or inside free text or a tree of
values) is stored, logged or put in an error message. Must not do I/O (no DNS, no sockets) and
must not import other sidecar-fsm modules except ``errors``: config, rewrite and store all build
on it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from sidecar_fsm.errors import ConfigError

DEFAULT_PORTS = {"https": 443, "http": 80}

# A URL inside free text (an error, a log line): everything up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")

# A registered name as DNS and the Go proxy accept it; percent-encoding and IDN are not used by
# any model endpoint and would make "the same host" ambiguous, so they are refused rather than
# guessed at.
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?\.?")

_UPSTREAM_HINT = "use https://HOST[:PORT]"


@dataclass(frozen=True)
class Origin:
    """The part of a URL that decides which server a request reaches: ``host`` lower-cased (IPv6
    compressed, no brackets), ``port`` the effective one, so equal origins compare equal."""

    scheme: str
    host: str
    port: int

    @property
    def netloc(self) -> str:
        """``host[:port]`` with the port left out when it is the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if DEFAULT_PORTS.get(self.scheme) == self.port:
            return host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}"


def parse_origin(url: str) -> Origin:
    """The origin of ``url``; raises ``ValueError`` whose text says what is wrong (no field, no value).

    Userinfo, path, query and fragment are ignored. A scheme other than http/https needs an
    explicit port: there is no default to compare with.
    """
    parts = split_url(url.strip())
    scheme = parts.scheme.lower()
    if not scheme or not url.strip()[len(scheme) :].startswith("://"):
        raise ValueError("is not an absolute URL (scheme://host)")
    if not parts.netloc:
        raise ValueError("has no host")
    host = _normalize_host(parts)
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port (must be 1-65535)") from None
    if port == 0:
        raise ValueError("has an invalid port (must be 1-65535)")
    if port is None:
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"has no port and scheme '{scheme}' has no default")
        port = DEFAULT_PORTS[scheme]
    return Origin(scheme, host, port)


def split_url(url: str) -> SplitResult:
    """``urlsplit(url)``, raising ``ValueError`` with wording that does not change between Pythons
    (urllib's messages for bad brackets differ from one release to the next)."""
    what = "is not a valid URL (bad IPv6 address in brackets)" if "[" in url else "is not a valid URL"
    try:
        parts = urlsplit(url)
        if "[" in parts.netloc:
            # Older Pythons accept any text in brackets; check it here so every release agrees.
            ipaddress.IPv6Address((parts.hostname or "").split("%", 1)[0])
    except ValueError:
        raise ValueError(what) from None
    return parts


def _normalize_host(parts: SplitResult) -> str:
    raw = parts.hostname  # lower-cased, brackets and userinfo already removed
    if not raw:
        raise ValueError("has no host")
    if "[" in parts.netloc:
        try:
            return ipaddress.IPv6Address(raw.split("%", 1)[0]).compressed
        except ValueError:
            raise ValueError("is not a valid URL (bad IPv6 address in brackets)") from None
    if not is_valid_host_name(raw):
        raise ValueError("has an invalid host name")
    return raw


def upstream_origin(url: str, field: str = "upstream") -> str:
    """``url`` reduced to ``https://host[:port]``: host lower-cased, port 443 dropped, path dropped.

    NeMo Gym's ``config.upstream_origin(url)``, plus the field to name: the proxy uses only the
    origin (a path would be silently prepended to every request). Raises ``ConfigError`` (a
    ``ValueError``, as Gym's) naming ``field`` and the value, credentials masked.
    """
    try:
        return normalize_upstream(url)
    except ValueError as exc:
        raise ConfigError(f"{field}: '{without_userinfo(url)}' {exc}") from None


def normalize_upstream(url: str) -> str:
    """As ``upstream_origin``, but raises ``ValueError`` with only "what is wrong; what to do",
    for callers that put the field and the value in front themselves (the config schema)."""
    scheme, sep, _ = url.strip().partition("://")
    if sep and scheme.lower() != "https":
        raise ValueError(f"must be https:// (HTTP/2 is chosen by ALPN); {_UPSTREAM_HINT}")
    try:
        return str(parse_origin(url))
    except ValueError as exc:
        raise ValueError(f"{exc}; {_UPSTREAM_HINT}") from None


def is_valid_host_name(host: str) -> bool:
    """Whether ``host`` is a DNS-style name (letters, digits, ``-``, ``_``, dots); case-insensitive."""
    return _HOST_NAME.fullmatch(host.lower()) is not None


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``; for error messages. Never raises,
    even for text that is not a URL: it is used on the bad values being reported."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in map(rest.find, "/?#") if i != -1), default=len(rest))
    authority = rest[:end]
    at = authority.rfind("@")
    if at == -1:
        return url
    return f"{scheme}://***@{authority[at + 1 :]}{rest[end:]}"


def redact_url(url: str) -> str:
    """``url`` without userinfo, query or fragment: the form that may be stored or logged.

    Tokens travel in query strings (``?api-key=``) as often as in userinfo, so both go. Never
    raises: text that is not a URL is cut at its first ``?`` or ``#`` the same way.
    """
    for stop in "?#":
        url = url.split(stop, 1)[0]
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path}"


def redact_text(text: Any) -> Any:
    """Free text with every URL in it redacted (error messages quote the URL they failed on)."""
    if not isinstance(text, str):
        return text
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)


def redact_tree(value: Any) -> Any:
    """A JSON-like tree with every string that contains a URL redacted."""
    if isinstance(value, Mapping):
        return {str(key): redact_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(item) for item in value]
    return redact_text(value)
