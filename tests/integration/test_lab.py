"""The lab itself: the TLS HTTP/2 origin, the idle-dropping relay and the blocking h2 client.

Everything here is real: TLS handshakes with a throwaway CA, HTTP/2 frames from the ``h2`` package,
TCP on loopback. The last test runs the real proxy binary through the relay, the demo's claim.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import SIDECAR_FSM, ProcessRegistry, http11_request, wait_until

from sidecar_fsm.lab import H2Client, H2ClientError, IdleRelay, TlsH2Origin, h2_request, make_ca_and_cert


def _tls_client(origin: TlsH2Origin, alpn: list[str]) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(origin.ca_file))
    context.set_alpn_protocols(alpn)
    raw = socket.create_connection(("127.0.0.1", origin.port), timeout=5)
    return context.wrap_socket(raw, server_hostname="localhost")


def _read_until_closed(sock: ssl.SSLSocket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except (ConnectionResetError, ssl.SSLError):
        pass
    return received


# --- the certificates ----------------------------------------------------------------------------


def test_each_lab_ca_is_its_own(tmp_path: Path, tls_origin: TlsH2Origin) -> None:
    other = make_ca_and_cert(tmp_path / "other")
    assert stat.S_IMODE(other.key_pem.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" not in other.ca_pem.read_bytes() + other.cert_pem.read_bytes()
    with pytest.raises(ssl.SSLCertVerificationError):
        H2Client("127.0.0.1", tls_origin.port, other.ca_pem, timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, server_hostname="example.com", timeout=5)
    # The certificate names the ip too, so a client that dials 127.0.0.1 by address verifies.
    status, _ = h2_request(
        "127.0.0.1", tls_origin.port, "/echo", tls_origin.ca_file, server_hostname="127.0.0.1"
    )
    assert status == 200


# --- the origin --------------------------------------------------------------------------------


def test_origin_closes_a_client_that_does_not_negotiate_h2(tls_origin: TlsH2Origin) -> None:
    with _tls_client(tls_origin, ["http/1.1"]) as sock:
        assert sock.selected_alpn_protocol() is None
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _read_until_closed(sock) == b""
    wait_until(lambda: tls_origin.alpn_rejected == 1, 5, "the origin to count the refused connection")
    assert tls_origin.requests == 0


def test_h1_only_origin_speaks_only_http11(make_tls_origin: Callable[..., TlsH2Origin]) -> None:
    origin = make_tls_origin(h1_only=True)
    with _tls_client(origin, ["h2", "http/1.1"]) as sock:
        assert sock.selected_alpn_protocol() == "http/1.1"
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(H2ClientError, match="alpn chose None"):
        H2Client("127.0.0.1", origin.port, origin.ca_file, timeout=5)


def test_echo_describes_the_request_without_header_values(tls_origin: TlsH2Origin) -> None:
    body = b"0123456789" * 200_000  # 2 MB: several flow-control windows
    status, raw = h2_request(
        "127.0.0.1",
        tls_origin.port,
        "/echo?model=x&n=2",
        tls_origin.ca_file,
        method="POST",
        body=body,
        headers=[("Authorization", "Bearer very-secret-token"), ("X-Custom", "custom-value")],
        timeout=10,
    )
    assert status == 200
    assert b"very-secret-token" not in raw and b"custom-value" not in raw
    echo = json.loads(raw)
    assert echo["method"] == "POST"
    assert echo["path"] == "/echo"
    assert echo["query"] == "model=x&n=2"
    assert echo["authority"] == f"localhost:{tls_origin.port}"
    assert echo["host"] == f"localhost:{tls_origin.port}"
    assert echo["body_length"] == len(body)
    assert echo["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert echo["authorization_present"] is True
    assert {"authorization", "x-custom", "content-length"} <= set(echo["header_names"])
    assert tls_origin.requests == 1


def test_unknown_path_and_bad_query_are_answered_not_dropped(tls_origin: TlsH2Origin) -> None:
    with H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, timeout=5) as client:
        assert client.request("/nope").status == 404
        assert client.request("/slow?first_byte=soon").status == 400
        assert client.request("/sse?n=-1").status == 400


def test_slow_sends_headers_and_first_byte_only_after_the_delay(tls_origin: TlsH2Origin) -> None:
    with H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, timeout=10) as client:
        started = time.monotonic()
        response = client.request("/slow?first_byte=0.6&size=200000")
    assert response.status == 200
    assert len(response.body) == 200_000
    assert response.chunk_times[0] - started >= 0.6


def test_sse_spaces_its_events(tls_origin: TlsH2Origin) -> None:
    with H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, timeout=10) as client:
        response = client.request("/sse?n=4&interval=0.15")
    assert response.status == 200
    assert dict(response.headers)["content-type"] == "text/event-stream"
    events = [block for block in response.body.decode().split("\n\n") if block]
    assert [json.loads(block.split("data: ", 1)[1])["i"] for block in events] == [0, 1, 2, 3]
    # Each event is its own DATA frame, sent as it is produced: arrivals span the intervals.
    assert response.chunk_times[-1] - response.chunk_times[0] >= 3 * 0.15 - 0.02


def test_hundreds_of_concurrent_streams_on_several_connections(tls_origin: TlsH2Origin) -> None:
    clients = [H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, timeout=20) for _ in range(3)]
    try:
        started = time.monotonic()
        streams = [[c.start_request("/slow?first_byte=0.5") for _ in range(200)] for c in clients]
        assert tls_origin.active_connections == 3
        responses = [c.wait(ids) for c, ids in zip(clients, streams, strict=True)]
        elapsed = time.monotonic() - started
    finally:
        for client in clients:
            client.close()
    assert all(r.status == 200 for batch in responses for r in batch.values())
    # 600 half-second waits served one after another would take 300 s.
    assert elapsed < 10
    assert tls_origin.connections == 3
    assert tls_origin.requests == 600


def test_pings_are_counted_and_acknowledged(tls_origin: TlsH2Origin) -> None:
    with H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, timeout=5) as client:
        for _ in range(3):
            client.ping()
        # The origin answers in order, so the ACKs arrive before this response does.
        assert client.request("/echo").status == 200
        assert client.ping_acks == 3
    assert tls_origin.pings == 3


def test_the_origin_can_answer_no_ping_or_goaway_pings(make_tls_origin: Callable[..., TlsH2Origin]) -> None:
    silent = make_tls_origin(pings="ignore")
    with H2Client("127.0.0.1", silent.port, silent.ca_file, timeout=5) as client:
        client.ping()
        # Frames are answered in order: the response arriving proves no ACK was sent before it.
        assert client.request("/echo").status == 200
        assert client.ping_acks == 0
    assert silent.pings == 1

    calm = make_tls_origin(pings="goaway")
    with H2Client("127.0.0.1", calm.port, calm.ca_file, timeout=5) as client:
        assert client.request("/echo").status == 200  # requests are served until a PING comes
        client.ping()
        with pytest.raises(H2ClientError, match="goaway \\(error code (11|ErrorCodes.ENHANCE_YOUR_CALM)\\)"):
            client.request("/echo")
        assert client.ping_acks == 0
    assert (calm.pings, calm.goaways) == (1, 1)
    with pytest.raises(ValueError, match="pings: 'sometimes' must be one of answer, ignore, goaway"):
        TlsH2Origin(pings="sometimes")


def test_reset_stream_ends_the_handler_and_keeps_the_connection(tls_origin: TlsH2Origin) -> None:
    with H2Client("127.0.0.1", tls_origin.port, tls_origin.ca_file, timeout=5) as client:
        stream_id = client.start_request("/slow?first_byte=60")
        wait_until(lambda: tls_origin.active_streams == 1, 5, "the origin to hold the slow stream")
        client.reset(stream_id)
        wait_until(lambda: tls_origin.active_streams == 0, 5, "the reset to end the slow handler")
        assert tls_origin.resets == 1
        assert client.request("/echo").status == 200
    assert tls_origin.connections == 1


def test_stop_closes_open_connections(make_tls_origin: Callable[..., TlsH2Origin]) -> None:
    origin = make_tls_origin()
    with H2Client("127.0.0.1", origin.port, origin.ca_file, timeout=5) as client:
        stream_id = client.start_request("/slow?first_byte=60")
        wait_until(lambda: origin.active_streams == 1, 5, "the origin to hold the slow stream")
        started = time.monotonic()
        origin.stop()
        assert time.monotonic() - started < 5
        with pytest.raises(H2ClientError):
            client.wait([stream_id])
    origin.stop()  # idempotent


# --- the relay ---------------------------------------------------------------------------------


def test_relay_drops_a_connection_silent_for_the_idle_limit(
    tls_origin: TlsH2Origin, idle_relay: Callable[..., IdleRelay]
) -> None:
    relay = idle_relay(tls_origin, idle=0.5)
    started = time.monotonic()
    with pytest.raises(H2ClientError):
        h2_request("127.0.0.1", relay.port, "/slow?first_byte=3", tls_origin.ca_file, timeout=10)
    assert time.monotonic() - started < 3
    assert relay.drops == 1
    assert relay.connections == 1
    wait_until(lambda: relay.active == 0, 5, "the relay to forget the dropped pair")
    wait_until(lambda: tls_origin.active_streams == 0, 5, "the origin to see the connection go")
    assert tls_origin.requests == 0


def test_relay_keeps_connections_that_carry_bytes(
    tls_origin: TlsH2Origin, idle_relay: Callable[..., IdleRelay]
) -> None:
    relay = idle_relay(tls_origin, idle=0.5)
    with H2Client("127.0.0.1", relay.port, tls_origin.ca_file, timeout=10) as client:
        # Events every 0.25 s keep a 1.25 s stream alive through a 0.5 s idle limit ...
        assert client.request("/sse?n=6&interval=0.25").status == 200
        # ... and so do PINGs while a response's first byte takes three idle limits.
        response = client.request("/slow?first_byte=1.5", ping_interval=0.2)
    assert response.status == 200
    assert relay.drops == 0
    assert tls_origin.pings >= 5


def test_relay_stop_closes_its_connections(
    tls_origin: TlsH2Origin, idle_relay: Callable[..., IdleRelay]
) -> None:
    relay = idle_relay(tls_origin, idle=30)
    with H2Client("127.0.0.1", relay.port, tls_origin.ca_file, timeout=5) as client:
        assert client.request("/echo").status == 200
        stream_id = client.start_request("/slow?first_byte=60")
        relay.stop()
        with pytest.raises(H2ClientError):
            client.wait([stream_id])
    assert relay.drops == 0
    relay.stop()  # idempotent


def test_relay_refuses_a_non_loopback_target() -> None:
    with pytest.raises(ValueError, match="is not loopback"):
        IdleRelay("10.0.0.1", 443, idle=1)


# --- the demo's claim, with the real proxy -----------------------------------------------------


def test_sidecar_pings_keep_a_slow_request_alive_through_the_relay(
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., IdleRelay],
    run_sidecar: Callable[..., Any],
) -> None:
    relay = idle_relay(tls_origin, idle=1.0)
    sidecar = run_sidecar(
        f"https://localhost:{relay.port}", "-ping-interval", "300ms", ca_file=tls_origin.ca_file
    )
    response = http11_request(sidecar.host, sidecar.port, "/slow?first_byte=2.5", timeout=20)
    assert response.status == 200, response.body
    assert response.body.startswith(b"slow: first byte after 2.5s")
    assert relay.drops == 0
    assert tls_origin.pings >= 3


def test_sidecar_answers_502_for_an_http11_only_origin(
    make_tls_origin: Callable[..., TlsH2Origin], run_sidecar: Callable[..., Any]
) -> None:
    origin = make_tls_origin(h1_only=True)
    sidecar = run_sidecar(origin.url, ca_file=origin.ca_file)
    response = http11_request(sidecar.host, sidecar.port, "/echo", timeout=20)
    assert response.status == 502
    assert b"h2" in response.body.lower()
    assert origin.requests == 0


def test_lab_prints_an_upstream_and_ca_file_that_work(
    tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    output = tmp_path / "lab.out"
    with open(output, "wb") as out:
        lab = subprocess.Popen([str(SIDECAR_FSM), "lab", "--idle", "5"], stdout=out, stderr=subprocess.STDOUT)
    process_registry.add(lab)
    wait_until(lambda: "serving until Ctrl-C" in output.read_text() or lab.poll() is not None, 20, "the lab")
    values = dict(
        line.split(": ", 1)
        for line in output.read_text().splitlines()
        if line.startswith(("upstream:", "ca_file:"))
    )
    port = int(values["upstream"].rsplit(":", 1)[1])
    status, _ = h2_request("127.0.0.1", port, "/echo?x=1", values["ca_file"], server_hostname="localhost")
    assert status == 200
    lab.send_signal(signal.SIGTERM)
    assert lab.wait(timeout=10) == 0
    assert not os.path.exists(values["ca_file"])  # the lab's throwaway CA goes with it
