"""A TCP relay that drops idle connections: AWS Global Accelerator's 340 s idle drop, scaled down.

One background thread (``selectors``) pipes each client of ``127.0.0.1:0`` to a fresh connection
to the target and closes *both* sides of a pair silent both ways for ``idle`` seconds: what breaks
a non-streaming HTTP/2 request whose first byte takes longer. An HTTP/2 PING counts as bytes,
which is why the sidecar survives it; TCP keepalive carries no payload and does not, as with the
real accelerator. Must not listen on anything but loopback, buffer without bound (a side that
cannot keep up stops the other side's reads), or leave a socket or thread behind.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Collection

from .loopthread import Counted, StartStop

_CHUNK = 64 * 1024
# Per direction: once this much is waiting for a slow receiver, the sender is no longer read.
_MAX_PENDING = 256 * 1024
_CONNECT_TIMEOUT = 5.0


class _Side:
    """One socket of a pair and the bytes waiting to be written to it."""

    __slots__ = ("sock", "pending", "read_open", "write_shut")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()
        self.read_open = True
        self.write_shut = False


class _Pair:
    __slots__ = ("client", "upstream", "last_activity")

    def __init__(self, client: _Side, upstream: _Side, now: float) -> None:
        self.client = client
        self.upstream = upstream
        self.last_activity = now

    def other(self, side: _Side) -> _Side:
        return self.upstream if side is self.client else self.client


class RelayCounts(Counted):
    """What both relays count: accepted clients, pairs dropped for idleness, clients closed at
    once (no room, or the target refused); and the pairs open now."""

    _pairs: Collection[object]

    @property
    def connections(self) -> int:
        return self._read("connections")

    @property
    def drops(self) -> int:
        return self._read("drops")

    @property
    def refused(self) -> int:
        return self._read("refused")

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._pairs)


class IdleRelay(StartStop, RelayCounts):
    """Relay ``127.0.0.1:<port>`` → ``target_host:target_port``, dropping pairs idle for ``idle`` s.

    A client beyond ``max_connections`` open pairs, or whose target refuses, is closed at once
    (``refused``). With ``reset=True`` a drop aborts both sides with a TCP RST instead of a FIN.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        idle: float,
        *,
        max_connections: int = 256,
        reset: bool = False,
    ) -> None:
        if idle <= 0:
            raise ValueError(f"IdleRelay idle: '{idle}' must be above 0; use seconds, e.g. 2.0")
        if target_host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"IdleRelay target_host: '{target_host}' is not loopback; use 127.0.0.1")
        self.target = (target_host, target_port)
        self.idle = float(idle)
        self.max_connections = max_connections
        self.reset = reset
        self._lock = threading.Lock()
        self._counts = {"connections": 0, "drops": 0, "refused": 0}
        self._pairs: set[_Pair] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._selector: selectors.DefaultSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stopping = threading.Event()
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("IdleRelay: not started; call start() first")
        return self._port

    def start(self) -> IdleRelay:
        """Bind, then serve in a background thread; the port is known when this returns. Idempotent."""
        if self._thread is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="sidecar-fsm-idle-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and every pair, join the thread. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        thread.join(10)
        self._thread = None

    # --- the relay thread ------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._selector is not None and self._listener is not None
        selector = self._selector
        try:
            while not self._stopping.is_set():
                timeout = self._expire_idle()
                for key, mask in selector.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        pair, side = key.data
                        if pair in self._pairs:
                            self._service(pair, side, mask)
        finally:
            self._close_everything()

    def _expire_idle(self) -> float:
        """Drop pairs idle for ``idle`` seconds; return the wait until the next one could be."""
        now = time.monotonic()
        next_deadline = now + self.idle
        for pair in list(self._pairs):
            deadline = pair.last_activity + self.idle
            if deadline <= now:
                self.count("drops")
                self._close_pair(pair, abort=self.reset)
            else:
                next_deadline = min(next_deadline, deadline)
        return max(0.0, next_deadline - now)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # BlockingIOError included: nothing more to accept
                return
            with self._lock:
                self._counts["connections"] += 1
                full = len(self._pairs) >= self.max_connections
            if full:
                self._refuse(client)
                continue
            try:
                # Loopback connects succeed or fail at once, so a blocking connect here does not
                # stall the other pairs in practice; the timeout bounds the pathological case.
                upstream = socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT)
            except OSError:
                self._refuse(client)
                continue
            pair = _Pair(_Side(client), _Side(upstream), time.monotonic())
            for side in (pair.client, pair.upstream):
                side.sock.setblocking(False)
                side.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.add(pair)
            self._update_interest(pair)

    def _refuse(self, client: socket.socket) -> None:
        self.count("refused")
        client.close()

    def _service(self, pair: _Pair, side: _Side, mask: int) -> None:
        other = pair.other(side)
        if mask & selectors.EVENT_READ and side.read_open:
            try:
                data = side.sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                # A reset from one end is passed on as a reset to the other.
                self._close_pair(pair, abort=True)
                return
            if data is not None:
                if data:
                    pair.last_activity = time.monotonic()
                    other.pending += data
                else:
                    side.read_open = False
        if mask & selectors.EVENT_WRITE and side.pending:
            try:
                sent = side.sock.send(side.pending)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close_pair(pair, abort=True)
                return
            if sent:
                pair.last_activity = time.monotonic()
                del side.pending[:sent]
        # Half-close: once one end finished sending and its bytes were delivered, pass the FIN on.
        for src, dst in ((pair.client, pair.upstream), (pair.upstream, pair.client)):
            if not src.read_open and not dst.pending and not dst.write_shut:
                dst.write_shut = True
                with contextlib.suppress(OSError):
                    dst.sock.shutdown(socket.SHUT_WR)
        if pair.client.write_shut and pair.upstream.write_shut:
            self._close_pair(pair, abort=False)
            return
        self._update_interest(pair)

    def _update_interest(self, pair: _Pair) -> None:
        assert self._selector is not None
        for side in (pair.client, pair.upstream):
            other = pair.other(side)
            mask = 0
            if side.read_open and len(other.pending) < _MAX_PENDING:
                mask |= selectors.EVENT_READ
            if side.pending:
                mask |= selectors.EVENT_WRITE
            registered = self._is_registered(side)
            if mask and registered:
                self._selector.modify(side.sock, mask, (pair, side))
            elif mask:
                self._selector.register(side.sock, mask, (pair, side))
            elif registered:
                self._selector.unregister(side.sock)

    def _is_registered(self, side: _Side) -> bool:
        assert self._selector is not None
        try:
            self._selector.get_key(side.sock)
        except KeyError:
            return False
        return True

    def _close_pair(self, pair: _Pair, *, abort: bool) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for side in (pair.client, pair.upstream):
            if self._selector is not None and self._is_registered(side):
                self._selector.unregister(side.sock)
            if abort:
                # SO_LINGER with a zero timeout makes close() send RST: the "connection reset"
                # a load balancer's hard drop looks like to both ends.
                with contextlib.suppress(OSError):
                    side.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            side.sock.close()

    def _close_everything(self) -> None:
        for pair in list(self._pairs):
            self._close_pair(pair, abort=True)
        if self._selector is not None:
            self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._selector, self._listener, self._wake_r, self._wake_w = None, None, None, None
