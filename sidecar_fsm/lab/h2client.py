"""A small blocking HTTP/2-over-TLS client: the "direct" request of the demo and the tests' probe.

No background thread: frames are read only while a call waits. It sends no PING unless asked
(``ping_interval``), so a plain request through an idle-dropping relay fails as any HTTP/2 client
without keepalive PINGs does; with PINGs it survives, which is the sidecar's whole trick. Must not
log, print or store header values, and never disables certificate verification.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from .loopthread import ClosesOnExit

_READ_CHUNK = 64 * 1024


class H2ClientError(ConnectionError):
    """The connection or the stream ended before the response was complete."""


@dataclass
class H2Response:
    """One response: status, headers, body, and when each body chunk arrived (monotonic)."""

    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    chunk_times: list[float] = field(default_factory=list)
    done: bool = False
    error: str | None = None


class H2Client(ClosesOnExit):
    """One client HTTP/2 connection over TLS; not thread-safe (use one per thread).

    ``host``/``port`` is where to connect (the origin, or a relay in front of it);
    ``server_hostname`` is the name the certificate is checked against and, with the port, the
    default ``:authority``. Raises ``H2ClientError`` when the server does not negotiate h2.
    """

    def __init__(
        self,
        host: str,
        port: int,
        ca_file: str | os.PathLike[str],
        *,
        server_hostname: str = "localhost",
        authority: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.authority = authority or f"{server_hostname}:{port}"
        self.timeout = timeout
        self.ping_acks = 0
        self._responses: dict[int, H2Response] = {}
        self._terminated: str | None = None
        context = ssl.create_default_context(cafile=str(Path(ca_file)))
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection((host, port), timeout=timeout)
        try:
            self._sock = context.wrap_socket(raw, server_hostname=server_hostname)
        except BaseException:
            raw.close()
            raise
        try:
            chosen = self._sock.selected_alpn_protocol()
            if chosen != "h2":
                raise H2ClientError(
                    f"{host}:{port}: alpn chose {chosen!r}, not 'h2'; the server does not speak http/2"
                )
            self._conn = h2.connection.H2Connection(
                config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
            )
            self._conn.initiate_connection()
            self._send_pending()
            self._settings_seen = False
            # The server's SETTINGS say how many streams may be open; opening before it arrives
            # could exceed a limit h2 does not yet know.
            deadline = time.monotonic() + timeout
            while not self._settings_seen:
                self._read_once(deadline)
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        """Send GOAWAY (best effort) and close the socket. Idempotent."""
        if self._sock.fileno() < 0:
            return
        try:
            self._conn.close_connection()
            self._send_pending()
        except (OSError, h2.exceptions.ProtocolError):
            pass
        self._sock.close()

    # --- requests --------------------------------------------------------------------------

    def start_request(
        self,
        path: str,
        *,
        method: str = "GET",
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
    ) -> int:
        """Send one request (headers, then the body within flow control); return its stream id."""
        deadline = time.monotonic() + self.timeout
        while self._conn.open_outbound_streams >= self._conn.remote_settings.max_concurrent_streams:
            self._read_once(deadline)
        stream_id = self._conn.get_next_available_stream_id()
        request_headers = [
            (":method", method),
            (":scheme", "https"),
            (":authority", self.authority),
            (":path", path),
            *[(name.lower(), value) for name, value in headers],
        ]
        if body:
            request_headers.append(("content-length", str(len(body))))
        self._responses[stream_id] = H2Response()
        self._conn.send_headers(stream_id, request_headers, end_stream=not body)
        self._send_pending()
        view = memoryview(body)
        while view:
            window = min(self._conn.local_flow_control_window(stream_id), self._conn.max_outbound_frame_size)
            if window <= 0:
                self._read_once(deadline)
                self._raise_if_failed(stream_id)
                continue
            chunk, view = view[:window], view[window:]
            self._conn.send_data(stream_id, bytes(chunk), end_stream=not view)
            self._send_pending()
        return stream_id

    def ping(self) -> None:
        """Send one PING frame now."""
        self._conn.ping(os.urandom(8))
        self._send_pending()

    def reset(self, stream_id: int) -> None:
        """Cancel a request with RST_STREAM (CANCEL)."""
        self._conn.reset_stream(stream_id, error_code=h2.errors.ErrorCodes.CANCEL)
        self._send_pending()
        response = self._responses.get(stream_id)
        if response is not None and not response.done:
            response.error = "reset by client"

    def wait(
        self, stream_ids: Iterable[int], *, timeout: float | None = None, ping_interval: float | None = None
    ) -> dict[int, H2Response]:
        """Read until every stream in ``stream_ids`` is complete; return their responses.

        With ``ping_interval`` a PING is sent whenever that long passed without one, which keeps
        an idle-dropping middlebox from seeing silence. Raises ``H2ClientError`` when a stream is
        reset or the connection ends first, ``TimeoutError`` after ``timeout`` (default: the
        client's).
        """
        wanted = list(stream_ids)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        next_ping = time.monotonic() + ping_interval if ping_interval else None
        while True:
            for stream_id in wanted:
                self._raise_if_failed(stream_id)
            if all(self._responses[stream_id].done for stream_id in wanted):
                return {stream_id: self._responses[stream_id] for stream_id in wanted}
            if next_ping is not None and time.monotonic() >= next_ping:
                self.ping()
                next_ping = time.monotonic() + (ping_interval or 0)
            self._read_once(deadline if next_ping is None else min(deadline, next_ping), final=deadline)

    def request(
        self,
        path: str,
        *,
        method: str = "GET",
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        ping_interval: float | None = None,
    ) -> H2Response:
        stream_id = self.start_request(path, method=method, body=body, headers=headers)
        return self.wait([stream_id], timeout=timeout, ping_interval=ping_interval)[stream_id]

    # --- the frame pump --------------------------------------------------------------------

    def _raise_if_failed(self, stream_id: int) -> None:
        response = self._responses[stream_id]
        if response.error is not None:
            raise H2ClientError(f"stream {stream_id}: {response.error}")
        if not response.done and self._terminated is not None:
            raise H2ClientError(f"stream {stream_id}: {self._terminated} before the response was complete")

    def _send_pending(self) -> None:
        data = self._conn.data_to_send()
        if data:
            try:
                self._sock.sendall(data)
            except OSError as error:
                self._terminated = f"connection lost while sending ({error.__class__.__name__})"
                raise H2ClientError(self._terminated) from error

    def _read_once(self, until: float, *, final: float | None = None) -> None:
        """Read and process what arrives before ``until``; a timeout past ``final`` raises."""
        if self._terminated is not None:
            raise H2ClientError(self._terminated)
        try:
            remaining = until - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            data = self._sock.recv(_READ_CHUNK)
        except TimeoutError:
            if final is None or until >= final:
                raise TimeoutError("h2 request: no complete response before the deadline") from None
            return
        except OSError as error:
            self._terminated = f"connection lost ({error.__class__.__name__}: {error.strerror or error})"
            raise H2ClientError(self._terminated) from error
        if not data:
            self._terminated = "connection closed by the peer"
            raise H2ClientError(self._terminated)
        now = time.monotonic()
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            self._terminated = f"http/2 protocol error ({error.__class__.__name__})"
            raise H2ClientError(self._terminated) from error
        for event in events:
            self._handle(event, now)
        self._send_pending()

    def _handle(self, event: h2.events.Event, now: float) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self._settings_seen = True
        elif isinstance(event, h2.events.ResponseReceived):
            response = self._responses.get(event.stream_id or 0)
            if response is not None:
                response.headers = [(str(name), str(value)) for name, value in event.headers or []]
                status = dict(response.headers).get(":status", "0")
                response.status = int(status)
        elif isinstance(event, h2.events.DataReceived):
            response = self._responses.get(event.stream_id or 0)
            if response is not None and event.data:
                response.body += event.data
                response.chunk_times.append(now)
            if event.stream_id and event.flow_controlled_length:
                try:
                    self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                except h2.exceptions.StreamClosedError:
                    self._conn.increment_flow_control_window(event.flow_controlled_length)
        elif isinstance(event, h2.events.StreamEnded):
            response = self._responses.get(event.stream_id or 0)
            if response is not None:
                response.done = True
        elif isinstance(event, h2.events.StreamReset):
            response = self._responses.get(event.stream_id or 0)
            if response is not None and not response.done:
                response.error = f"reset by the server (error code {event.error_code})"
        elif isinstance(event, h2.events.PingAckReceived):
            self.ping_acks += 1
        elif isinstance(event, h2.events.ConnectionTerminated):
            last = event.last_stream_id or 0
            # A graceful GOAWAY still completes streams up to last_stream_id; only the rest fail.
            for stream_id, response in self._responses.items():
                if stream_id > last and not response.done and response.error is None:
                    response.error = f"refused by goaway (error code {event.error_code})"
            if event.error_code:
                self._terminated = f"connection ended by goaway (error code {event.error_code})"


def h2_request(
    host: str,
    port: int,
    path: str,
    ca_file: str | os.PathLike[str],
    server_hostname: str = "localhost",
    timeout: float = 30.0,
    *,
    method: str = "GET",
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    authority: str | None = None,
) -> tuple[int, bytes]:
    """Send one HTTP/2 request on a fresh connection, with no PINGs; return (status, body).

    Any status is returned, not raised. Raises ``H2ClientError`` when the connection or stream
    ends before the response is complete (an idle drop, for instance), ``TimeoutError`` after
    ``timeout`` seconds, ``ssl.SSLError``/``OSError`` when connecting or the handshake fails.
    """
    deadline = time.monotonic() + timeout
    with H2Client(
        host, port, ca_file, server_hostname=server_hostname, authority=authority, timeout=timeout
    ) as client:
        response = client.request(
            path, method=method, body=body, headers=headers, timeout=max(0.0, deadline - time.monotonic())
        )
    return response.status, response.body
