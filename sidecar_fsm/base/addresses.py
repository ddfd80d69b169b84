"""Listen addresses: ``host:port`` as the proxy's ``-listen`` takes it, loopback, and clashes.

Owns splitting a listen address, deciding whether a host only accepts local connections, and
whether two listens would fight over one port. Errors are ``ValueError`` saying only "what is
wrong; what to do": the caller puts the field and the value in front. Must not do I/O (no DNS,
no binding to test a port) and imports nothing from this package but ``urls``.
"""

from __future__ import annotations

import ipaddress

from sidecar_fsm.base.urls import is_valid_host_name

LISTEN_HINT = "use 127.0.0.1:PORT (0 picks a free port; IPv6 as [::1]:PORT)"

# A wildcard address takes the port on every interface.
_WILDCARDS = frozenset({"0.0.0.0", "::"})


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or IP literal, brackets allowed) only accepts local connections.

    ``localhost`` counts (it resolves to loopback by convention and in Go's resolver); no other
    name does, since deciding that would need a DNS lookup.
    """
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def split_listen(listen: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` listen address; an IPv6 host comes without its brackets.
    Raises ``ValueError`` for a bad host, an unbracketed IPv6 address or a bad port."""
    text = listen.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"is not host:port; {LISTEN_HINT}")
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"has an invalid IPv6 address; {LISTEN_HINT}") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"is not host:port; {LISTEN_HINT}")
        if ":" in host:
            raise ValueError(f"has an IPv6 host without brackets; write it like [::1]:{port or 'PORT'}")
        if not host:
            raise ValueError("has no host; use 127.0.0.1:PORT, or 0.0.0.0:PORT with allow_non_loopback")
        if not is_valid_host_name(host):
            raise ValueError(f"has an invalid host; {LISTEN_HINT}")
    if not port.isdigit() or not port.isascii():
        raise ValueError(f"has a port that is not a number; {LISTEN_HINT}")
    if int(port) > 65535:
        raise ValueError(f"has port {int(port)} outside 0-65535; {LISTEN_HINT}")
    return host, int(port)


def listens_clash(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Whether two (host, port) listens cannot both bind: the second proxy would fail at start.

    Port 0 asks the kernel for a free port, so any number of them coexist; a wildcard address
    clashes with every host on its port.
    """
    if a[1] == 0 or a[1] != b[1]:
        return False
    host_a, host_b = _bind_key(a[0]), _bind_key(b[0])
    return host_a == host_b or host_a in _WILDCARDS or host_b in _WILDCARDS


def _bind_key(host: str) -> str:
    """The host as the kernel sees a bind: ``localhost`` and ``127.0.0.1`` are one address."""
    host = host.lower()
    if host == "localhost":
        return "127.0.0.1"  # Go binds localhost to its IPv4 loopback address
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).compressed
    except ValueError:
        return host
