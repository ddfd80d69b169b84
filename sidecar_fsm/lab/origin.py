"""A local TLS HTTP/2 origin server for the demo and the tests: the stand-in for an NVCF endpoint.

One asyncio loop in a background thread serves HTTP/2 over TLS (ALPN ``h2`` only) on
``127.0.0.1:0``; its connections (``h2server``) use ``h2`` directly, so the frames the sidecar
sends are visible and counted. Endpoints:

- ``/echo`` (any method): JSON with the method, path, query, ``host``/``:authority``, the body's
  length and sha256, the request header *names* (never values) and ``authorization_present``.
- ``/slow?first_byte=S[&size=N]``: response headers and the first body byte only after ``S``
  seconds, then the rest of an ``N``-byte body (default small), honouring flow control.
- ``/sse?n=N&interval=S``: ``text/event-stream``, ``N`` events ``S`` seconds apart.
- with ``nvcf=NvcfLab(...)``, NVCF's invocation protocol (``nvcf``).

``refuse_next(n)``: the next ``n`` requests meet a graceful GOAWAY refusing them (a load balancer
retiring a connection). ``pings="ignore"`` answers no PING (as AWS ALB) and ``pings="goaway"``
answers each with GOAWAY ``ENHANCE_YOUR_CALM`` and a close (a gRPC-style server): the two paths a
sidecar cannot keep open. ``h1_only=True`` offers only ``http/1.1`` and answers a minimal 200 with
``Connection: close``: the upstream the sidecar must refuse (no fallback).

Must not bind anything but loopback, log or store header values, or leave a task or thread behind.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .h2server import CLOSE_FLUSH_SECONDS, Connection, H1Protocol, H2ServerProtocol
from .loopthread import Counted, LoopThread
from .nvcf import NvcfLab
from .tlsca import CertPaths, make_ca_and_cert

# How the origin meets PINGs (see the module docstring).
PINGS_POLICIES = ("answer", "ignore", "goaway")


class TlsH2Origin(LoopThread, Counted):
    """A TLS HTTP/2 server on ``127.0.0.1:0`` in its own thread; see the module docstring.

    ``certs`` are used when given (share one CA between origins); otherwise its own CA lives in a
    private temporary directory that ``stop()`` removes. The counters are totals, ``active_*``
    current; any thread may read them.
    """

    thread_name = "sidecar-fsm-origin"

    def __init__(
        self,
        certs: CertPaths | None = None,
        *,
        h1_only: bool = False,
        max_concurrent_streams: int = 1000,
        pings: str = "answer",
        nvcf: NvcfLab | None = None,
    ) -> None:
        if pings not in PINGS_POLICIES:
            raise ValueError(f"TlsH2Origin pings: '{pings}' must be one of {', '.join(PINGS_POLICIES)}")
        super().__init__()
        self.h1_only = h1_only
        self.pings_policy = pings
        self.nvcf = nvcf
        self.max_concurrent_streams = max_concurrent_streams
        self._certs = certs
        self._own_cert_dir: Path | None = None
        self._lock = threading.Lock()
        self._counts = {
            "pings": 0,
            "connections": 0,
            "requests": 0,
            "resets": 0,
            "alpn_rejected": 0,
            "refused": 0,
            "received": 0,
            "goaways": 0,
        }
        self._refusals = 0
        self._protocols: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._context: ssl.SSLContext | None = None
        self._port: int | None = None

    # --- counters (any thread) -------------------------------------------------------------

    @property
    def pings(self) -> int:
        """PING frames received (not counting ACKs), over all connections."""
        return self._read("pings")

    @property
    def connections(self) -> int:
        """TCP connections accepted (TLS handshake done), including ones refused for ALPN."""
        return self._read("connections")

    @property
    def requests(self) -> int:
        """Requests answered to the end (any status); a reset or dropped request is not counted."""
        return self._read("requests")

    @property
    def resets(self) -> int:
        """RST_STREAM frames received from clients."""
        return self._read("resets")

    @property
    def alpn_rejected(self) -> int:
        """Connections closed because the client did not negotiate h2."""
        return self._read("alpn_rejected")

    @property
    def received(self) -> int:
        """Requests whose headers arrived (a request re-sent by a client counts again)."""
        return self._read("received")

    @property
    def goaways(self) -> int:
        """GOAWAYs sent by ``goaway()`` (graceful) and for PINGs (``pings="goaway"``)."""
        return self._read("goaways")

    @property
    def refused(self) -> int:
        """Requests refused with a graceful GOAWAY (``refuse_next``)."""
        return self._read("refused")

    def refuse_next(self, count: int = 1) -> None:
        """Refuse the next ``count`` requests (once fully received) with a graceful GOAWAY that the
        client may re-send after (``H2ServerProtocol._refuse``); later ones are answered."""
        with self._lock:
            self._refusals += count

    def take_refusal(self) -> bool:
        """Whether the request just received is to be refused (``refuse_next``); counts it."""
        with self._lock:
            if self._refusals <= 0:
                return False
            self._refusals -= 1
            self._counts["refused"] += 1
            return True

    @property
    def active_connections(self) -> int:
        with self._lock:
            return len(self._protocols)

    @property
    def active_streams(self) -> int:
        """Requests received and not yet fully answered, reset or dropped."""
        with self._lock:
            protocols = list(self._protocols)
        return sum(p.stream_count for p in protocols if isinstance(p, H2ServerProtocol))

    def opened(self, protocol: Connection) -> None:
        with self._lock:
            self._counts["connections"] += 1
            self._protocols.add(protocol)

    def closed(self, protocol: Connection) -> None:
        with self._lock:
            self._protocols.discard(protocol)

    # --- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("TlsH2Origin: not started; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """``https://localhost:<port>``: the name the certificate is for, as the sidecar dials it."""
        return f"https://localhost:{self.port}"

    @property
    def certs(self) -> CertPaths:
        if self._certs is None:
            raise RuntimeError("TlsH2Origin: not started; call start() first")
        return self._certs

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) that verifies this origin: the sidecar's ``-ca-file``."""
        return self.certs.ca_pem

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> TlsH2Origin:
        """Bind and start serving; returns when the port is known. Idempotent."""
        if self.running:
            return self
        if self._certs is None:
            self._own_cert_dir = Path(tempfile.mkdtemp(prefix="sidecar-fsm-origin-"))
            self._certs = make_ca_and_cert(self._own_cert_dir)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._certs.cert_pem, self._certs.key_pem)
        context.set_alpn_protocols(["http/1.1"] if self.h1_only else ["h2"])
        self._context = context
        return super().start()

    async def _begin(self) -> None:
        assert self._context is not None
        await self._serve(self._context)

    async def _serve(self, context: ssl.SSLContext, port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = functools.partial(
            H1Protocol if self.h1_only else H2ServerProtocol, self
        )
        # reuse_address: after a restart the old connections may sit in TIME_WAIT on the port.
        self._server = await loop.create_server(
            factory,
            host="127.0.0.1",
            port=port,
            ssl=context,
            ssl_handshake_timeout=10.0,
            backlog=512,
            reuse_address=True,
        )
        self._port = self._server.sockets[0].getsockname()[1]

    def goaway(self) -> None:
        """Send a graceful GOAWAY on every open connection; each closes once its streams end."""
        if self.running:
            self.call(self._goaway_all())

    async def _goaway_all(self) -> None:
        with self._lock:
            protocols = list(self._protocols)
        for protocol in protocols:
            if isinstance(protocol, H2ServerProtocol):
                protocol.goaway()

    def go_down(self) -> None:
        """Crash: stop listening and drop every connection, no GOAWAY, as a redeploy looks from
        outside: requests in flight get no answer and no promise that they were not processed."""
        if self.running:
            self.call(self._crash(), CLOSE_FLUSH_SECONDS * 4 + 5)

    def come_back(self) -> None:
        """Listen again on the port ``go_down()`` closed; idempotent while listening."""
        if self._context is None or not self.running:
            raise RuntimeError("TlsH2Origin: not started; call start() first")
        if self._server is None:
            self.call(self._serve(self._context, self.port))

    def restart(self, down: float) -> None:
        """``go_down()``, ``down`` seconds refusing connections, ``come_back()``; blocks meanwhile."""
        self.go_down()
        time.sleep(down)
        self.come_back()

    async def _crash(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            protocols = list(self._protocols)
        for protocol in protocols:
            protocol.abort()
        await asyncio.gather(*(protocol.lost for protocol in protocols), return_exceptions=True)

    def drop_connections(self) -> None:
        """Close every open connection (GOAWAY first) but keep listening: an upstream restart."""
        if self.running:
            self.call(self._close_all(), CLOSE_FLUSH_SECONDS * 4 + 5)

    async def _close_all(self) -> None:
        with self._lock:
            protocols = list(self._protocols)
        await asyncio.gather(*(protocol.close() for protocol in protocols), return_exceptions=True)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all()
        # Handlers were cancelled by connection_lost; wait for them so none is destroyed pending.
        await self._cancel_other_tasks()
        if self._server is not None:
            await self._server.wait_closed()

    def stop(self) -> None:
        """Close every connection, cancel every handler, stop and join the thread. Idempotent."""
        super().stop()
        self._server = None
        if self._own_cert_dir is not None:
            shutil.rmtree(self._own_cert_dir, ignore_errors=True)
            self._own_cert_dir, self._certs = None, None
