"""Which TCP addresses a process itself listens on, from ``/proc``: proof that an address is its.

A ready file (or a recorded metrics address) is only words in a file; anyone who can write the
file, or who holds a port of their own, could name an address that is not the child's and have
requests, with their ``Authorization`` headers, sent there. The kernel's word is not: a socket
is the child's when one of ``/proc/<pid>/fd`` is that socket (``socket:[inode]``) and
``/proc/<pid>/net/tcp`` or ``tcp6`` lists that inode as LISTEN on the address.

Owns reading those files and matching an address against them. Used through ``procs`` (the one
place a process's identity is judged); must not signal, spawn or open a connection. Linux only;
anything unreadable (a process gone, another user's) answers "not listening".
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from sidecar_fsm.base.addresses import split_listen

_TCP_LISTEN = "0A"
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds open; empty when its fds cannot be read."""
    fd_dir = f"/proc/{pid}/fd"
    inodes: set[str] = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> _IPAddress:
    """An address as ``/proc/net/tcp*`` prints it: 32-bit words, each in the host's byte order."""
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    packed = b"".join(struct.pack("=I", word) for word in words)
    return ipaddress.ip_address(packed)


def listening(pid: int) -> set[tuple[_IPAddress, int]]:
    """(address, port) of every TCP socket ``pid`` itself holds in LISTEN state. Read-only.

    Read in the process's own network namespace (``/proc/<pid>/net``). Empty when the process
    is gone or its descriptors cannot be read (another user's).
    """
    inodes = _socket_inodes(pid)
    found: set[tuple[_IPAddress, int]] = set()
    if not inodes:
        return found
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != _TCP_LISTEN or fields[9] not in inodes:
                        continue
                    host, _, port = fields[1].partition(":")
                    found.add((_address(host), int(port, 16)))
        except (OSError, ValueError):
            continue
    return found


def _candidates(host: str) -> set[_IPAddress]:
    """The addresses a connection to ``host`` may reach: the literal, or what the name resolves to."""
    try:
        return {ipaddress.ip_address(host.split("%", 1)[0])}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}


def _plain(address: _IPAddress) -> _IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def listens_on(pid: int, address: str) -> bool:
    """True if ``pid`` itself listens on ``address`` (``host:port``). Read-only.

    A listener on the wildcard address of the family (``0.0.0.0``, ``::``, which also takes IPv4
    unless v6-only) on that port counts: connections to the address reach it, and no other
    user can bind a more specific address on a port a wildcard holds. Port 0 is never listened
    on. A malformed address is False.
    """
    try:
        host, port = split_listen(address)
    except ValueError:
        return False
    wanted = {_plain(candidate) for candidate in _candidates(host)}
    if port == 0 or not wanted:
        return False
    for bound, bound_port in listening(pid):
        if bound_port != port:
            continue
        bound = _plain(bound)
        if bound in wanted or str(bound) == "::":
            return True
        if str(bound) == "0.0.0.0" and any(isinstance(item, ipaddress.IPv4Address) for item in wanted):
            return True
    return False
