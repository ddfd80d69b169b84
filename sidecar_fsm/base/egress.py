"""Which egress proxy the Go proxy dials an upstream through: Go's rules, answered in Python.

The Go proxy decides with net/http's ``ProxyFromEnvironment`` (HTTPS_PROXY, NO_PROXY). The
launcher passes those variables through unchanged and only needs to *say* what the proxy will do
(``sidecar-fsm start`` prints it per instance), so this module mirrors Go's rules on the same
environment. Owns that decision and the proxy's credential-free form. Must not read anything but
the mapping it is given (no ``os.environ`` default, no DNS, no sockets), and never returns or
raises with the proxy's userinfo.

urllib's ``getproxies_environment`` / ``proxy_bypass_environment`` are not used: they differ from
Go's rules where it matters here. urllib prefers ``https_proxy`` over ``HTTPS_PROXY`` (Go the
reverse); reads ``ALL_PROXY`` (Go does not); lets ``.example.com`` match ``example.com`` itself
(Go: subdomains only); knows no CIDR (``10.0.0.0/8``) nor IP entries with a port; honours ``*``
only as the whole value (Go: as any entry); and proxies ``localhost`` and loopback addresses,
which Go never does.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _first_set(environ: Mapping[str, str], *names: str) -> str:
    """The first of ``names`` with a non-empty value, as Go's ``getEnvAny``; else ``""``."""
    for name in names:
        value = environ.get(name, "")
        if value:
            return value
    return ""


def egress_proxy(upstream: str, environ: Mapping[str, str]) -> str | None:
    """The proxy ``upstream`` (an ``https://`` origin) is dialled through under ``environ``, or None.

    The proxy is returned as ``scheme://host[:port]`` without userinfo: the form that may be
    printed. None means direct: no ``HTTPS_PROXY``/``https_proxy``, a value Go cannot parse as a
    URL (Go then goes direct too), ``NO_PROXY``/``no_proxy`` matching, or an upstream that is
    ``localhost`` or a loopback address. Pure: reads only ``environ``.
    """
    value = _first_set(environ, "HTTPS_PROXY", "https_proxy")
    if not value:
        return None
    shown = _shown_proxy(value)
    if shown is None:
        return None
    parts = urlsplit(upstream)
    # Go compares the host with "localhost" before lower-casing it (LOCALHOST is proxied), so
    # the host keeps its case here; urlsplit's ``hostname`` would lower it.
    host = parts.netloc.rpartition("@")[2]
    host = host[1 : host.find("]")] if host.startswith("[") else host.rpartition(":")[0] or host
    try:
        port = parts.port or _DEFAULT_PORTS["https"]
    except ValueError:
        return None
    if not _use_proxy(host, str(port), _first_set(environ, "NO_PROXY", "no_proxy")):
        return None
    return shown


def egress_route(upstream: str, environ: Mapping[str, str]) -> str:
    """``"direct"`` or ``"via egress proxy http://proxy:3128"``: one instance's route, for output."""
    proxy = egress_proxy(upstream, environ)
    return "direct" if proxy is None else f"via egress proxy {proxy}"


def _shown_proxy(value: str) -> str | None:
    """``value`` as Go's ``parseProxy`` reads it, reduced to ``scheme://host[:port]``; None if unusable.

    Like Go, a value without a scheme (``proxy:3128``) is taken as ``http://`` + value.
    """
    for candidate in (value, f"http://{value}"):
        try:
            parts = urlsplit(candidate)
            parts.port  # noqa: B018 - raises ValueError for a bad port, as Go's parse fails
        except ValueError:
            continue
        netloc = parts.netloc.rpartition("@")[2]
        if parts.scheme and netloc:
            return f"{parts.scheme}://{netloc}"
    return None


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _use_proxy(host: str, port: str, no_proxy: str) -> bool:
    """Go's ``useProxy``: False for localhost, loopback addresses and NO_PROXY matches."""
    if host == "localhost":
        return False
    ip = _parse_ip(host)
    if ip is not None and ip.is_loopback:
        return False
    host = host.strip().lower()
    for entry in no_proxy.split(","):
        entry = entry.strip().lower()
        if entry == "*":
            return False
        if entry and _matches(entry, host, port, ip):
            return False
    return True


def _matches(entry: str, host: str, port: str, ip: IPAddress | None) -> bool:
    """Whether one NO_PROXY entry exempts ``host:port`` (``ip`` when the host is an address)."""
    if "/" in entry:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            pass
        else:
            return ip is not None and ip.version == network.version and ip in network
    entry_host, entry_port = _split_host_port(entry)
    if not entry_host:
        return False
    entry_ip = _parse_ip(entry_host)
    if entry_ip is not None:
        return ip is not None and ip == entry_ip and entry_port in ("", port)
    if ip is not None:
        return False
    if entry_host.startswith("*."):
        entry_host = entry_host[1:]
    # "example.com" matches itself and its subdomains; ".example.com" only its subdomains.
    match_itself = not entry_host.startswith(".")
    suffix = entry_host if not match_itself else f".{entry_host}"
    if host.endswith(suffix) or (match_itself and host == suffix[1:]):
        return entry_port in ("", port)
    return False


def _split_host_port(entry: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort`` where it succeeds, else ``(entry, "")``; brackets removed."""
    if entry.startswith("["):
        end = entry.find("]")
        if end != -1 and entry[end + 1 : end + 2] == ":":
            return entry[1:end], entry[end + 2 :]
        return entry, ""
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""
