"""Which TCP addresses a process itself listens on, from ``/proc``: proof that an address is its.

A ready file is only words (anyone who can write it could send requests, with their
``Authorization`` headers, to a port of their own); the kernel's word is not. A socket is the
child's when one of ``/proc/<pid>/fd`` is ``socket:[inode]`` and the kernel lists that inode as
LISTEN on the address. The LISTEN table is asked over netlink (``sock_diag``: well under a
millisecond), falling back to ``/proc/<pid>/net/tcp*``, which walks every connection of the host
(tens of milliseconds on a busy one: too slow to sit between a ready file and the start).

Used through ``procs``; must not signal, spawn or open a connection. Linux only; anything
unreadable (a process gone, another user's) answers "not listening".
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


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one dump request per address family.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_DIAG_REQUEST = struct.Struct("=BBBBI48x")  # family, protocol, ext, pad, states, a zero socket id
_DIAG_MESSAGE = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # family, state, timer, retrans, sport,
# dport, src, dst, interface, cookie, expires, rqueue, wqueue, uid, inode
_TCP_LISTEN_BIT = 1 << 10  # TCP_LISTEN
# A dump of listening sockets is a few datagrams; a kernel that keeps talking is not believed.
_MAX_DATAGRAMS = 1000


def _listeners_by_netlink() -> dict[int, tuple[_IPAddress, int]] | None:
    """inode -> (address, port) of every TCP LISTEN socket in this network namespace; None
    when netlink cannot answer (no sock_diag), so the caller reads ``/proc`` instead."""
    found: dict[int, tuple[_IPAddress, int]] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
            link.settimeout(2.0)
            for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
                body = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _TCP_LISTEN_BIT)
                size, flags = _NLMSG_HEADER.size + len(body), _NLM_F_REQUEST | _NLM_F_DUMP
                link.send(_NLMSG_HEADER.pack(size, _SOCK_DIAG_BY_FAMILY, flags, sequence, 0) + body)
                if not _read_dump(link, found):
                    return None
    except OSError:
        return None
    return found


def _read_dump(link: socket.socket, found: dict[int, tuple[_IPAddress, int]]) -> bool:
    """Read one dump's answers into ``found``; False on an error answer or a runaway dump."""
    for _ in range(_MAX_DATAGRAMS):
        data = link.recv(65536)
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
            if kind == _NLMSG_DONE:
                return True
            if kind == _NLMSG_ERROR or length < _NLMSG_HEADER.size:
                return False
            fields = _DIAG_MESSAGE.unpack_from(data, offset + _NLMSG_HEADER.size)
            family, sport, src, inode = fields[0], fields[4], fields[6], fields[-1]
            raw = src[:4] if family == socket.AF_INET else src
            found[inode] = (ipaddress.ip_address(raw), int.from_bytes(sport, "big"))
            offset += (length + 3) & ~3
    return False


def listening(pid: int) -> set[tuple[_IPAddress, int]]:
    """(address, port) of every TCP socket ``pid`` itself holds in LISTEN state; empty when
    unreadable. Netlink reads our network namespace (the child was spawned in it)."""
    inodes = _socket_inodes(pid)
    found: set[tuple[_IPAddress, int]] = set()
    if not inodes:
        return found
    listeners = _listeners_by_netlink()
    if listeners is not None:
        return {address for inode, address in listeners.items() if str(inode) in inodes}
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
    """True if ``pid`` itself listens on ``address`` (``host:port``); False if malformed or port 0.

    A wildcard listener (``0.0.0.0``, or ``::``, which also takes IPv4) on the port counts:
    connections reach it, and no other user can bind a more specific address on that port.
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
