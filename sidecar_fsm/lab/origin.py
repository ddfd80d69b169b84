"""A local TLS HTTP/2 origin server for the demo and the tests: the stand-in for an NVCF endpoint.

Owns one asyncio event loop in a background thread that serves HTTP/2 over TLS (ALPN ``h2`` only)
on ``127.0.0.1:0`` with the ``h2`` package used directly, so the frames the sidecar sends are
visible: PINGs received, connections accepted, requests served and streams reset are counted.
Endpoints:

- ``/echo`` (any method): JSON with the method, path, query, ``host``/``:authority``, the body's
  length and sha256, the request header *names* (never values) and ``authorization_present``.
- ``/slow?first_byte=S[&size=N]``: response headers and the first body byte only after ``S``
  seconds, then the rest of an ``N``-byte body (default small), honouring flow control.
- ``/sse?n=N&interval=S``: ``text/event-stream``, ``N`` events, the first at once and each next
  one ``S`` seconds after the previous.

With ``h1_only=True`` the server offers only ``http/1.1`` in ALPN and answers every request with a
minimal HTTP/1.1 200 and ``Connection: close``: the upstream the sidecar must refuse (no fallback).

Must not bind anything but loopback, log or store header values, or leave a task or thread behind:
``stop()`` closes every connection, cancels every handler and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import shutil
import ssl
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from .tlsca import CertPaths, make_ca_and_cert

# A stream's and the connection's receive windows. The protocol default (64 KiB) makes a large
# /echo upload crawl at one round trip per window; 1 MiB per stream and 16 MiB per connection let
# a retry-body-limit sized body through quickly while still exercising flow control.
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_MAX_HEADER_LIST = 1 << 16
# How long stop() lets a connection flush its GOAWAY and TLS close_notify before aborting it.
_CLOSE_FLUSH_SECONDS = 0.5
_STARTUP_SECONDS = 10.0
_SLOW_DEFAULT_SIZE = 64
_MAX_SLOW_SIZE = 64 << 20
_MAX_SSE_EVENTS = 100_000


class _Stream:
    """One request on one connection: what arrived so far, and the task answering it."""

    __slots__ = ("headers", "body_length", "body_hash", "task", "window_open")

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers
        self.body_length = 0
        self.body_hash = hashlib.sha256()
        self.task: asyncio.Task[None] | None = None
        # Set whenever the peer may have opened send window for this stream (a WINDOW_UPDATE on
        # it or on the connection, a SETTINGS change) or the stream/connection ended; a sender
        # that finds no window clears it and waits, then re-checks.
        self.window_open = asyncio.Event()


class _StreamGone(Exception):
    """The stream was reset or the connection closed while a handler was still answering."""


class _H2ServerProtocol(asyncio.Protocol):
    """One accepted TLS connection speaking HTTP/2, all of it on the origin's loop thread."""

    def __init__(self, origin: TlsH2Origin) -> None:
        self._origin = origin
        self._transport: asyncio.Transport | None = None
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self._conn = h2.connection.H2Connection(config=config)
        self._streams: dict[int, _Stream] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = asyncio.Event()
        # Set by goaway(): the last stream this connection still answers.
        self._goaway_last: int | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._origin._on_connection(self)
        ssl_object = transport.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if alpn != "h2":
            # A client that did not offer h2 still completes the handshake (OpenSSL just selects
            # no protocol); closing here is what makes this origin h2-only for real.
            self._origin._count("alpn_rejected")
            transport.close()
            return
        # Replacing local_settings before initiate_connection is the only way to raise
        # MAX_CONCURRENT_STREAMS above h2's 100 without waiting for a SETTINGS ACK, during
        # which h2 would refuse the client's 101st stream.
        self._conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self._origin.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _MAX_HEADER_LIST,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
            },
        )
        self._conn.initiate_connection()
        self._conn.increment_flow_control_window(_CONNECTION_WINDOW - 65535)
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            # h2 has queued a GOAWAY naming the error; send it and end the connection.
            self._flush()
            self._close_transport()
            return
        for event in events:
            self._handle(event)
        self._flush()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed.set()
        self._writable.set()
        for stream in self._streams.values():
            stream.window_open.set()
            if stream.task is not None:
                stream.task.cancel()
        self._origin._on_connection_lost(self)
        if not self.lost.done():
            self.lost.set_result(None)

    # --- events ----------------------------------------------------------------------------

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            if self._goaway_last is not None and (event.stream_id or 0) > self._goaway_last:
                # Sent before the client saw our GOAWAY: refused, so never processed and safe
                # for the client to send again elsewhere.
                # The client may have reset it already, later in the same read (h2 applies
                # every frame before handing out events): then there is nothing to refuse.
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self._conn.reset_stream(event.stream_id or 0, h2.errors.ErrorCodes.REFUSED_STREAM)
            elif event.stream_id is not None:
                self._origin._count("received")
                headers = [(str(name), str(value)) for name, value in event.headers or []]
                self._streams[event.stream_id] = _Stream(headers)
        elif isinstance(event, h2.events.DataReceived):
            stream_id, data = event.stream_id, event.data or b""
            stream = self._streams.get(stream_id or 0)
            if stream is not None:
                stream.body_length += len(data)
                stream.body_hash.update(data)
            if stream_id is not None and event.flow_controlled_length:
                # The body is hashed, not kept, so it is consumed the moment it arrives: give the
                # window back at once. A stream reset meanwhile makes h2 refuse the stream-level
                # update, but the connection window must still be returned.
                try:
                    self._conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                except h2.exceptions.StreamClosedError:
                    self._conn.increment_flow_control_window(event.flow_controlled_length)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None and stream.task is None and event.stream_id is not None:
                stream.task = asyncio.get_running_loop().create_task(self._answer(event.stream_id, stream))
        elif isinstance(event, h2.events.StreamReset):
            self._origin._count("resets")
            self._forget(event.stream_id or 0, cancel=True)
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id:
                stream = self._streams.get(event.stream_id)
                if stream is not None:
                    stream.window_open.set()
            else:
                self._wake_all()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._wake_all()
        elif isinstance(event, h2.events.PingReceived):
            # h2 queues the PING ACK itself; the count is the whole point of this origin.
            self._origin._count("pings")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._flush()
            self._close_transport()

    def _wake_all(self) -> None:
        for stream in self._streams.values():
            stream.window_open.set()

    def _forget(self, stream_id: int, *, cancel: bool) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        stream.window_open.set()
        if cancel and stream.task is not None:
            stream.task.cancel()
        self._close_if_drained()

    def goaway(self) -> None:
        """Graceful GOAWAY (NO_ERROR, last stream: the highest received): the streams in flight
        are answered, later ones refused, and the connection closes once none is left, as a
        load balancer retiring a connection does."""
        if self._transport is None or self._transport.is_closing() or self._goaway_last is not None:
            return
        self._goaway_last = self._conn.highest_inbound_stream_id
        # h2 cannot send a GOAWAY and keep answering streams (its connection state machine
        # closes), so the frame is written by hand, after h2's pending bytes: frames stay whole.
        # GOAWAY: length 8, type 0x7, no flags, stream 0; last stream id, error code NO_ERROR.
        frame = struct.pack(">I", 8)[1:] + bytes([0x7, 0]) + struct.pack(">III", 0, self._goaway_last, 0)
        self._flush()
        self._transport.write(frame)
        self._origin._count("goaways")
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self._goaway_last is not None and not self._streams:
            self._flush()
            self._close_transport()

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _close_transport(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self) -> None:
        """End the connection at once, no GOAWAY: what a crashed server's peer sees."""
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        """Send GOAWAY, let it flush for a moment, then abort: stop() must not hang on a peer."""
        if self._transport is None:
            return
        if not self._transport.is_closing():
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._conn.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR)
            self._flush()
            self._transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), _CLOSE_FLUSH_SECONDS)
        except asyncio.TimeoutError:
            self._transport.abort()
            await self.lost

    # --- answering -------------------------------------------------------------------------

    async def _answer(self, stream_id: int, stream: _Stream) -> None:
        pseudo = {name: value for name, value in stream.headers if name.startswith(":")}
        split = urlsplit(pseudo.get(":path", "/"))
        query = {key: values[-1] for key, values in parse_qs(split.query).items()}
        try:
            if split.path == "/echo":
                await self._echo(stream_id, stream, pseudo, split.path, split.query)
            elif split.path == "/slow":
                await self._slow(stream_id, query)
            elif split.path == "/sse":
                await self._sse(stream_id, query)
            else:
                await self._send_json(stream_id, 404, {"error": f"no endpoint {split.path!r}"})
        except _BadQuery as error:
            await self._send_json(stream_id, 400, {"error": str(error)})
        except (_StreamGone, h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass
        except asyncio.CancelledError:
            # Cancelled by a reset of this stream or by the connection going away: nothing to
            # send to anyone, and swallowing it lets the task end quietly.
            pass
        finally:
            self._streams.pop(stream_id, None)
            self._close_if_drained()

    async def _echo(
        self, stream_id: int, stream: _Stream, pseudo: dict[str, str], path: str, query: str
    ) -> None:
        names = sorted({name.lower() for name, _ in stream.headers if not name.startswith(":")})
        regular = {name.lower(): value for name, value in stream.headers if not name.startswith(":")}
        payload = {
            "method": pseudo.get(":method", ""),
            "path": path,
            "query": query,
            "scheme": pseudo.get(":scheme", ""),
            "authority": pseudo.get(":authority", ""),
            "host": regular.get("host", pseudo.get(":authority", "")),
            "body_length": stream.body_length,
            "body_sha256": stream.body_hash.hexdigest(),
            "header_names": names,
            "authorization_present": "authorization" in regular,
        }
        await self._send_json(stream_id, 200, payload)

    async def _slow(self, stream_id: int, query: dict[str, str]) -> None:
        delay = _float_arg(query, "first_byte", 0.0, upper=3600.0)
        size = int(_float_arg(query, "size", _SLOW_DEFAULT_SIZE, upper=_MAX_SLOW_SIZE))
        await asyncio.sleep(delay)
        first_line = f"slow: first byte after {delay:g}s\n".encode()
        body = (first_line + b"." * max(0, size - len(first_line)))[: max(size, 1)]
        self._send_headers(
            stream_id,
            200,
            [("content-type", "text/plain; charset=utf-8"), ("content-length", str(len(body)))],
        )
        await self._send_data(stream_id, body, end_stream=True)

    async def _sse(self, stream_id: int, query: dict[str, str]) -> None:
        count = int(_float_arg(query, "n", 3, upper=_MAX_SSE_EVENTS))
        interval = _float_arg(query, "interval", 0.1, upper=3600.0)
        self._send_headers(
            stream_id, 200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        )
        for index in range(count):
            if index:
                await asyncio.sleep(interval)
            event = f"id: {index}\ndata: {json.dumps({'i': index, 'n': count})}\n\n".encode()
            await self._send_data(stream_id, event, end_stream=False)
        await self._send_data(stream_id, b"", end_stream=True)

    async def _send_json(self, stream_id: int, status: int, payload: dict[str, Any]) -> None:
        body = (json.dumps(payload, sort_keys=True) + "\n").encode()
        self._send_headers(
            stream_id, status, [("content-type", "application/json"), ("content-length", str(len(body)))]
        )
        await self._send_data(stream_id, body, end_stream=True)

    def _send_headers(self, stream_id: int, status: int, headers: list[tuple[str, str]]) -> None:
        if self._closed.is_set():
            raise _StreamGone
        self._conn.send_headers(stream_id, [(":status", str(status)), *headers])
        self._flush()

    async def _send_data(self, stream_id: int, data: bytes, *, end_stream: bool) -> None:
        """Send ``data`` within the peer's stream and connection windows, waiting for more."""
        view = memoryview(data)
        while True:
            stream = self._streams.get(stream_id)
            if stream is None or self._closed.is_set():
                raise _StreamGone
            await self._writable.wait()
            if not view:
                if end_stream:
                    self._conn.end_stream(stream_id)
                    self._finish_request()
                return
            window = min(self._conn.local_flow_control_window(stream_id), self._conn.max_outbound_frame_size)
            if window <= 0:
                # Clear before waiting: an update that arrived before this point was already
                # seen by the window check above, so only a later one can wake the wait.
                stream.window_open.clear()
                await stream.window_open.wait()
                continue
            chunk, view = view[:window], view[window:]
            self._conn.send_data(stream_id, bytes(chunk), end_stream=end_stream and not view)
            if not view and end_stream:
                self._finish_request()
                return
            self._flush()

    def _finish_request(self) -> None:
        # Counted before the last frame is written, not after: a client that reads the end of
        # the response and then looks at ``requests`` must find this request counted.
        self._origin._count("requests")
        self._flush()


class _H1Protocol(asyncio.Protocol):
    """The ``h1_only`` origin: one minimal HTTP/1.1 answer per connection, then close."""

    def __init__(self, origin: TlsH2Origin) -> None:
        self._origin = origin
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._origin._on_connection(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if b"\r\n\r\n" not in self._buffer or self._transport is None:
            if len(self._buffer) > _MAX_HEADER_LIST and self._transport is not None:
                self._transport.close()
            return
        body = b"http/1.1 only: this origin does not speak HTTP/2\n"
        self._origin._count("requests")
        self._transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._origin._on_connection_lost(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        if self._transport is None:
            return
        self._transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), _CLOSE_FLUSH_SECONDS)
        except asyncio.TimeoutError:
            self._transport.abort()
            await self.lost


class _BadQuery(ValueError):
    """A query argument is not a number in range; answered with a 400."""


def _float_arg(query: dict[str, str], name: str, default: float, *, upper: float) -> float:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise _BadQuery(f"{name}: {raw!r} is not a number") from None
    if not 0 <= value <= upper:
        raise _BadQuery(f"{name}: {raw!r} must be between 0 and {upper:g}")
    return value


class TlsH2Origin:
    """A TLS HTTP/2 server on ``127.0.0.1:0`` in its own thread; see the module docstring.

    ``certs`` are used when given (share one CA between several origins); otherwise the origin
    makes its own CA in a private temporary directory that ``stop()`` removes. Counters (``pings``,
    ``connections``, ``received``, ``requests``, ``resets``, ``alpn_rejected``) are totals since ``start()``;
    ``active_connections`` and ``active_streams`` are current. Reading them from another thread
    is safe (they are updated under a lock). ``start()`` and ``stop()`` are each idempotent.
    """

    def __init__(
        self,
        certs: CertPaths | None = None,
        *,
        h1_only: bool = False,
        max_concurrent_streams: int = 1000,
    ) -> None:
        self.h1_only = h1_only
        self.max_concurrent_streams = max_concurrent_streams
        self._certs = certs
        self._own_cert_dir: Path | None = None
        self._lock = threading.Lock()
        self._counts = {
            "pings": 0,
            "connections": 0,
            "received": 0,
            "requests": 0,
            "resets": 0,
            "goaways": 0,
            "alpn_rejected": 0,
        }
        self._protocols: set[_H2ServerProtocol | _H1Protocol] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._context: ssl.SSLContext | None = None
        self._port: int | None = None

    # --- counters (any thread) -------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _read(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

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
    def received(self) -> int:
        """Requests whose headers arrived (a request re-sent by a client counts again)."""
        return self._read("received")

    @property
    def resets(self) -> int:
        """RST_STREAM frames received from clients."""
        return self._read("resets")

    @property
    def alpn_rejected(self) -> int:
        """Connections closed because the client did not negotiate h2."""
        return self._read("alpn_rejected")

    @property
    def active_connections(self) -> int:
        with self._lock:
            return len(self._protocols)

    @property
    def active_streams(self) -> int:
        """Requests received and not yet fully answered, reset or dropped."""
        with self._lock:
            protocols = list(self._protocols)
        return sum(len(p._streams) for p in protocols if isinstance(p, _H2ServerProtocol))

    def _on_connection(self, protocol: _H2ServerProtocol | _H1Protocol) -> None:
        with self._lock:
            self._counts["connections"] += 1
            self._protocols.add(protocol)

    def _on_connection_lost(self, protocol: _H2ServerProtocol | _H1Protocol) -> None:
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
        if self._thread is not None:
            return self
        if self._certs is None:
            self._own_cert_dir = Path(tempfile.mkdtemp(prefix="sidecar-fsm-origin-"))
            self._certs = make_ca_and_cert(self._own_cert_dir)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._certs.cert_pem, self._certs.key_pem)
        context.set_alpn_protocols(["http/1.1"] if self.h1_only else ["h2"])

        self._context = context
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="sidecar-fsm-origin", daemon=True)
        self._thread.start()
        try:
            self._run(self._serve(context), _STARTUP_SECONDS)
        except BaseException:
            self.stop()
            raise
        return self

    async def _serve(self, context: ssl.SSLContext, port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = functools.partial(
            _H1Protocol if self.h1_only else _H2ServerProtocol, self
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

    def _run(self, coro: Coroutine[Any, Any, None], timeout: float) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def goaways(self) -> int:
        """Graceful GOAWAYs sent by ``goaway()``."""
        return self._read("goaways")

    def goaway(self) -> None:
        """Send a graceful GOAWAY on every open connection; each closes once its streams end."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._run(self._goaway_all(), _STARTUP_SECONDS)

    async def _goaway_all(self) -> None:
        with self._lock:
            protocols = list(self._protocols)
        for protocol in protocols:
            if isinstance(protocol, _H2ServerProtocol):
                protocol.goaway()

    def drop_connections(self) -> None:
        """Close every open connection (GOAWAY first) but keep listening: an upstream restart."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._run(self._close_all(), _CLOSE_FLUSH_SECONDS * 4 + 5)

    def go_down(self) -> None:
        """Crash: stop listening (connects are refused) and drop every connection, no GOAWAY.

        What a redeploy looks like from outside: the process is gone, the kernel closes its
        sockets, and requests in flight get no answer and no promise that they were not
        processed. ``come_back()`` listens again on the same port.
        """
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._run(self._crash(), _CLOSE_FLUSH_SECONDS * 4 + 5)

    def come_back(self) -> None:
        """Listen again on the port ``go_down()`` closed; idempotent while listening."""
        if self._context is None or self._loop is None:
            raise RuntimeError("TlsH2Origin: not started; call start() first")
        if self._server is None:
            self._run(self._serve(self._context, self.port), _STARTUP_SECONDS)

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

    async def _close_all(self) -> None:
        with self._lock:
            protocols = list(self._protocols)
        await asyncio.gather(*(protocol.close() for protocol in protocols), return_exceptions=True)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all()
        # Handlers were cancelled by connection_lost; wait for them so none is destroyed pending.
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def stop(self) -> None:
        """Close every connection, cancel every handler, stop and join the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            if thread.is_alive():
                with contextlib.suppress(Exception):
                    self._run(self._shutdown(), _CLOSE_FLUSH_SECONDS * 4 + 5)
                loop.call_soon_threadsafe(loop.stop)
                thread.join(10)
            if not thread.is_alive():
                loop.close()
        self._loop, self._thread, self._server = None, None, None
        if self._own_cert_dir is not None:
            shutil.rmtree(self._own_cert_dir, ignore_errors=True)
            self._own_cert_dir, self._certs = None, None

    def __enter__(self) -> TlsH2Origin:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
