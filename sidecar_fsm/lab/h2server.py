"""The connections of the lab's TLS origin (``origin.TlsH2Origin``): HTTP/2 with ``h2``, or HTTP/1.1.

``H2ServerProtocol`` uses the ``h2`` package directly, so PINGs, resets and flow control are
visible and counted; ``H1Protocol`` is the ``h1_only`` origin's. Both run on the origin's loop
thread and report to it (``ConnectionHost``). Must not bind, start threads or log header values;
``close()`` never waits on a peer longer than ``CLOSE_FLUSH_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import struct
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from .nvcf import BadQuery, NvcfLab, float_arg

__all__ = ["CLOSE_FLUSH_SECONDS", "Connection", "ConnectionHost", "H1Protocol", "H2ServerProtocol"]


class ConnectionHost(Protocol):
    """What a connection reports to the origin that accepted it; called on the loop thread."""

    max_concurrent_streams: int
    # How PINGs are met: "answer" (an ACK, as RFC 9113 requires), "ignore" (no ACK ever: a
    # far side that does not carry or answer PINGs, as AWS ALB's) or "goaway" (GOAWAY
    # ENHANCE_YOUR_CALM and close: a gRPC-style server that refuses frequent PINGs).
    pings_policy: str
    # NVCF's invocation endpoints, when this origin speaks them (``nvcf`` module).
    nvcf: NvcfLab | None

    def count(self, name: str) -> None: ...

    def take_refusal(self) -> bool: ...

    def opened(self, protocol: Connection) -> None: ...

    def closed(self, protocol: Connection) -> None: ...


# A stream's and the connection's receive windows. The protocol default (64 KiB) makes a large
# /echo upload crawl at one round trip per window; 1 MiB per stream and 16 MiB per connection let
# a retry-body-limit sized body through quickly while still exercising flow control.
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_MAX_HEADER_LIST = 1 << 16
# How long stop() lets a connection flush its GOAWAY and TLS close_notify before aborting it.
CLOSE_FLUSH_SECONDS = 0.5
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


class Connection(asyncio.Protocol):
    """One accepted connection, either kind: reported to the origin, closed within a bound."""

    def __init__(self, origin: ConnectionHost) -> None:
        self._origin = origin
        self._transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._origin.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._origin.closed(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def abort(self) -> None:
        """End the connection at once, no GOAWAY: what a crashed server's peer sees."""
        if self._transport is not None:
            self._transport.abort()

    def _goodbye(self) -> None:
        """What to send before closing (HTTP/2: a GOAWAY)."""

    async def close(self) -> None:
        """Say goodbye, let it flush for a moment, then abort: stop() must not hang on a peer."""
        if self._transport is None:
            return
        if not self._transport.is_closing():
            self._goodbye()
            self._transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), CLOSE_FLUSH_SECONDS)
        except asyncio.TimeoutError:
            self._transport.abort()
            await self.lost


class H2ServerProtocol(Connection):
    """One accepted TLS connection speaking HTTP/2, all of it on the origin's loop thread."""

    def __init__(self, origin: ConnectionHost) -> None:
        super().__init__(origin)
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self._conn = h2.connection.H2Connection(config=config)
        self._streams: dict[int, _Stream] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = asyncio.Event()
        # Set by goaway(): the last stream this connection still answers.
        self._goaway_last: int | None = None

    @property
    def stream_count(self) -> int:
        """Requests open on this connection now (received, not yet answered in full)."""
        return len(self._streams)

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if alpn != "h2":
            # A client that did not offer h2 still completes the handshake (OpenSSL just selects
            # no protocol); closing here is what makes this origin h2-only for real.
            self._origin.count("alpn_rejected")
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
        super().connection_lost(exc)

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
                self._origin.count("received")
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
            if stream is not None and event.stream_id is not None and self._origin.take_refusal():
                self._refuse(event.stream_id)
                return
            if stream is not None and stream.task is None and event.stream_id is not None:
                stream.task = asyncio.get_running_loop().create_task(self._answer(event.stream_id, stream))
        elif isinstance(event, h2.events.StreamReset):
            self._origin.count("resets")
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
            # h2 queues the PING ACK itself (``_flush`` drops it unless the policy answers);
            # the count is the whole point of this origin.
            self._origin.count("pings")
            if self._origin.pings_policy == "goaway":
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self._conn.close_connection(error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                self._origin.count("goaways")
                self._flush()
                self._close_transport()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._flush()
            self._close_transport()

    def _refuse(self, stream_id: int) -> None:
        """Graceful GOAWAY naming the stream before ``stream_id`` as the last processed, then close,
        as a load balancer retiring a connection: the client may re-send it (RFC 9113 6.8)."""
        self._forget(stream_id, cancel=True)
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._conn.close_connection(
                error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=stream_id - 2
            )
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
        self._origin.count("goaways")
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self._goaway_last is not None and not self._streams:
            self._flush()
            self._close_transport()

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self._origin.pings_policy != "answer":
            data = _without_ping_acks(data)
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _close_transport(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _goodbye(self) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._conn.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR)
        self._flush()

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
            elif (nvcf := self._origin.nvcf) is not None and nvcf.serves(pseudo.get(":method"), split.path):
                await nvcf.answer(self, stream_id, stream.headers, stream.body_hash.hexdigest())
            else:
                await self._send_json(stream_id, 404, {"error": f"no endpoint {split.path!r}"})
        except BadQuery as error:
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
        delay = float_arg(query, "first_byte", 0.0, upper=3600.0)
        size = int(float_arg(query, "size", _SLOW_DEFAULT_SIZE, upper=_MAX_SLOW_SIZE))
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
        count = int(float_arg(query, "n", 3, upper=_MAX_SSE_EVENTS))
        interval = float_arg(query, "interval", 0.1, upper=3600.0)
        self._send_headers(
            stream_id, 200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        )
        for index in range(count):
            if index:
                await asyncio.sleep(interval)
            event = f"id: {index}\ndata: {json.dumps({'i': index, 'n': count})}\n\n".encode()
            await self._send_data(stream_id, event, end_stream=False)
        await self._send_data(stream_id, b"", end_stream=True)

    async def respond(self, stream_id: int, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """Answer ``stream_id`` in full: the ``nvcf`` lab's way in (``nvcf.Responder``)."""
        self._send_headers(stream_id, status, headers)
        await self._send_data(stream_id, body, end_stream=True)

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
        self._origin.count("requests")
        self._flush()


class H1Protocol(Connection):
    """The ``h1_only`` origin: one minimal HTTP/1.1 answer per connection, then close."""

    def __init__(self, origin: ConnectionHost) -> None:
        super().__init__(origin)
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if b"\r\n\r\n" not in self._buffer or self._transport is None:
            if len(self._buffer) > _MAX_HEADER_LIST and self._transport is not None:
                self._transport.close()
            return
        body = b"http/1.1 only: this origin does not speak HTTP/2\n"
        self._origin.count("requests")
        self._transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self._transport.close()


def _without_ping_acks(data: bytes) -> bytes:
    """``data`` (whole frames: h2 serializes each frame at once) without its PING ACKs."""
    kept = bytearray()
    view = memoryview(data)
    while len(view) >= 9:
        end = 9 + int.from_bytes(view[:3], "big")
        if not (view[3] == 0x6 and view[4] & 0x1):  # PING with the ACK flag
            kept += view[:end]
        view = view[end:]
    kept += view
    return bytes(kept)
