"""The real proxy against an upstream path that goes silent, crawls, restarts, or loses its clients.

Every fault is real: the lab's ``FaultRelay`` between the proxy and the TLS HTTP/2 origin stops
forwarding (blackhole) or delays each chunk, the origin crashes and comes back on its port, and a
thousand client sockets close at once. What is asserted is what a NeMo Gym job sees (each
request's status, body and timing) and what an operator scrapes from ``/metrics``, plus the
proxy's own descriptors read from ``/proc``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import http11_request, wait_until
from prometheus_client.parser import text_string_to_metric_families

from sidecar_fsm.lab import FaultRelay, H2Client, TlsH2Origin

PING_INTERVAL = 1.0
PING_TIMEOUT = 1.0
FAST_PINGS = ("-ping-interval", "1s", "-ping-timeout", "1s", "-metrics-listen", "127.0.0.1:0")


@pytest.fixture
def fault_relay() -> Iterator[Callable[..., FaultRelay]]:
    """Factory: ``fault_relay(origin, **kwargs)`` → a started ``FaultRelay``, stopped at the end."""
    relays: list[FaultRelay] = []

    def make(origin: TlsH2Origin, **kwargs: Any) -> FaultRelay:
        relay = FaultRelay("127.0.0.1", origin.port, **kwargs)
        relays.append(relay)
        return relay.start()

    yield make
    for relay in relays:
        relay.stop()


def scrape(sidecar: Any) -> dict[str, float]:
    """GET /metrics, parsed by prometheus-client; samples keyed ``name{label="value"}``."""
    address = json.loads(Path(sidecar.ready_path).read_text())["metrics"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


@dataclass
class Outcome:
    status: int | None = None
    body: bytes = b""
    error: BaseException | None = None
    ended_at: float = 0.0


def in_background(call: Callable[[], Any], count: int) -> tuple[list[Outcome], list[threading.Thread]]:
    """Run ``call`` ``count`` times at once, each in a thread recording status, body and end time."""
    outcomes = [Outcome() for _ in range(count)]

    def run(outcome: Outcome) -> None:
        try:
            response = call()
            outcome.status, outcome.body = response.status, response.body
        except Exception as error:
            outcome.error = error
        outcome.ended_at = time.monotonic()

    threads = [threading.Thread(target=run, args=(outcome,), daemon=True) for outcome in outcomes]
    for thread in threads:
        thread.start()
    return outcomes, threads


def join_all(threads: list[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), f"requests still hanging after {timeout:g}s"


def test_blackhole_mid_wait_ends_every_request_within_ping_interval_plus_timeout(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay], run_sidecar: Callable[..., Any]
) -> None:
    relay = fault_relay(tls_origin)
    sidecar = run_sidecar(f"https://localhost:{relay.port}", *FAST_PINGS, ca_file=tls_origin.ca_file)
    wait_until(lambda: scrape(sidecar)["h2ping_upstream_up"] == 1, 10, "the start-up dial")
    dials_before = scrape(sidecar)['h2ping_upstream_dials_total{result="ok"}']
    outcomes, threads = in_background(
        lambda: http11_request(sidecar.host, sidecar.port, "/slow?first_byte=30", timeout=20), 5
    )
    wait_until(lambda: tls_origin.active_streams == 5, 10, "5 waits to reach the origin")
    relay.blackhole()
    silent_from = time.monotonic()
    join_all(threads, PING_INTERVAL + PING_TIMEOUT + 5)
    bound = PING_INTERVAL + PING_TIMEOUT + 1
    for outcome in outcomes:
        assert outcome.status == 502, outcome
        assert b"no PING ack within 1s (-ping-timeout)" in outcome.body, outcome.body
        assert outcome.ended_at - silent_from <= bound, f"{outcome.ended_at - silent_from:.2f}s > {bound}s"
    metrics = scrape(sidecar)
    assert metrics['h2ping_upstream_errors_total{kind="ping_timeout"}'] == 1
    assert metrics["h2ping_requests_in_flight"] == 0
    assert metrics["h2ping_upstream_connections"] == 0

    relay.heal()
    answer = http11_request(sidecar.host, sidecar.port, "/echo", timeout=10)
    assert answer.status == 200, answer
    metrics = scrape(sidecar)
    assert metrics['h2ping_upstream_dials_total{result="ok"}'] == dials_before + 1  # a new connection
    assert metrics["h2ping_upstream_connections"] == 1


def test_origin_restart_under_load_fails_in_flight_at_once_and_resends_nothing(
    tls_origin: TlsH2Origin, run_sidecar: Callable[..., Any]
) -> None:
    sidecar = run_sidecar(tls_origin.url, *FAST_PINGS, ca_file=tls_origin.ca_file)
    wait_until(lambda: scrape(sidecar)["h2ping_upstream_up"] == 1, 10, "the start-up dial")
    body = os.urandom(50_000)
    gets, get_threads = in_background(
        lambda: http11_request(sidecar.host, sidecar.port, "/slow?first_byte=30", timeout=20), 6
    )
    posts, post_threads = in_background(
        lambda: http11_request(
            sidecar.host, sidecar.port, "/slow?first_byte=30", method="POST", body=body, timeout=20
        ),
        6,
    )
    wait_until(lambda: tls_origin.active_streams == 12, 10, "12 requests to reach the origin")
    assert tls_origin.received == 12
    tls_origin.go_down()
    crashed_at = time.monotonic()
    join_all(get_threads + post_threads, 5)
    for outcome in gets + posts:
        assert outcome.status == 502, outcome
        assert outcome.ended_at - crashed_at < 1.0, f"502 after {outcome.ended_at - crashed_at:.2f}s"
    # Once the proxy has seen its connections go, a new request is refused at once (one sent
    # at the very moment of the crash may instead meet the dying connection's EOF: also a 502).
    wait_until(lambda: scrape(sidecar)["h2ping_upstream_connections"] == 0, 5, "the pool to empty")
    refused = http11_request(sidecar.host, sidecar.port, "/echo", timeout=10)
    assert refused.status == 502 and b"connection refused" in refused.body, refused
    assert tls_origin.received == 12

    tls_origin.come_back()
    back_at = time.monotonic()
    answer = http11_request(sidecar.host, sidecar.port, "/echo", method="POST", body=body, timeout=10)
    assert answer.status == 200, answer
    assert time.monotonic() - back_at < 1.0
    assert json.loads(answer.body)["body_length"] == len(body)
    burst, burst_threads = in_background(
        lambda: http11_request(sidecar.host, sidecar.port, "/echo", timeout=10), 20
    )
    join_all(burst_threads, 10)
    assert [outcome.status for outcome in burst] == [200] * 20
    # 12 before the crash, none of them again, then 21 after it: no request was sent twice.
    assert tls_origin.received == 12 + 21
    metrics = scrape(sidecar)
    # No half-dead connection kept: the pool holds only what the origin still has open.
    assert metrics["h2ping_upstream_connections"] == tls_origin.active_connections >= 1
    assert metrics["h2ping_requests_in_flight"] == 0


def test_200ms_each_way_keeps_pings_acked_without_a_false_timeout(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay], run_sidecar: Callable[..., Any]
) -> None:
    relay = fault_relay(tls_origin)
    relay.delay(200)
    sidecar = run_sidecar(f"https://localhost:{relay.port}", *FAST_PINGS, ca_file=tls_origin.ca_file)
    answer = http11_request(sidecar.host, sidecar.port, "/slow?first_byte=4", timeout=20)
    assert answer.status == 200, answer
    metrics = scrape(sidecar)
    assert metrics["h2ping_ping_acks_total"] >= 2
    assert 0.4 <= metrics["h2ping_ping_rtt_seconds"] < PING_TIMEOUT
    assert metrics['h2ping_upstream_errors_total{kind="ping_timeout"}'] == 0
    assert tls_origin.pings >= 2


def _proxy_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _proxy_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status: no Threads line")


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def test_a_thousand_clients_leaving_mid_wait_leave_nothing_behind(
    tls_origin: TlsH2Origin, run_sidecar: Callable[..., Any]
) -> None:
    clients = 1000
    _raise_fd_limit(clients + 512)
    sidecar = run_sidecar(tls_origin.url, *FAST_PINGS, ca_file=tls_origin.ca_file)
    pid = sidecar.process.pid
    wait_until(lambda: scrape(sidecar)["h2ping_upstream_up"] == 1, 10, "the start-up dial")
    fds_before, threads_before = _proxy_fds(pid), _proxy_threads(pid)
    baseline = scrape(sidecar)
    connections_before = baseline["h2ping_upstream_connections"]
    sockets: list[socket.socket] = []
    try:
        request = b"GET /slow?first_byte=60 HTTP/1.1\r\nHost: localhost\r\n\r\n"
        for _ in range(clients):
            sock = socket.create_connection((sidecar.host, sidecar.port), timeout=10)
            sock.sendall(request)
            sockets.append(sock)
        wait_until(lambda: tls_origin.active_streams == clients, 30, f"{clients} waits at the origin")
        assert scrape(sidecar)["h2ping_requests_in_flight"] == clients
    finally:
        for sock in sockets:
            sock.close()
    wait_until(lambda: tls_origin.resets == clients, 15, f"{clients} stream resets at the origin")
    wait_until(lambda: scrape(sidecar)["h2ping_requests_in_flight"] == 0, 10, "in flight back to 0")
    assert tls_origin.active_streams == 0
    metrics = scrape(sidecar)
    assert metrics["h2ping_client_disconnects_total"] == clients

    # Back to where it was: every client socket closed; what remains beyond the start is only
    # the upstream connections the burst opened (idle now, kept for the next burst).
    def settled() -> bool:
        opened = scrape(sidecar)["h2ping_upstream_connections"] - connections_before
        return _proxy_fds(pid) == fds_before + opened

    try:
        wait_until(settled, 10, f"descriptors back to {fds_before} + new upstream connections")
    except AssertionError:
        now = _proxy_fds(pid)
        raise AssertionError(f"fds {now}, before {fds_before}; metrics {scrape(sidecar)}") from None
    opened = scrape(sidecar)["h2ping_upstream_connections"] - connections_before
    if "go_goroutines" in baseline:
        # A few goroutines per upstream connection (read loop, timers) may stay; one per client
        # (a thousand) may not.
        wait_until(
            lambda: scrape(sidecar)["go_goroutines"] <= baseline["go_goroutines"] + 4 * opened + 10,
            10,
            f"goroutines back near {baseline['go_goroutines']:g}",
        )
    # OS threads are not goroutines (the runtime keeps an idle thread or two it started for
    # the burst), but a thread per client, or one stuck per client, would show here.
    assert _proxy_threads(pid) <= threads_before + 4
    after = http11_request(sidecar.host, sidecar.port, "/echo", timeout=10)
    assert after.status == 200


def test_reset_fails_in_flight_at_once_and_the_next_request_redials(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay], run_sidecar: Callable[..., Any]
) -> None:
    relay = fault_relay(tls_origin)
    sidecar = run_sidecar(f"https://localhost:{relay.port}", *FAST_PINGS, ca_file=tls_origin.ca_file)
    outcomes, threads = in_background(
        lambda: http11_request(sidecar.host, sidecar.port, "/slow?first_byte=30", timeout=20), 4
    )
    wait_until(lambda: tls_origin.active_streams == 4, 10, "4 waits to reach the origin")
    assert relay.reset() == 1
    reset_at = time.monotonic()
    join_all(threads, 5)
    for outcome in outcomes:
        assert outcome.status == 502 and outcome.ended_at - reset_at < 1.0, outcome
    assert scrape(sidecar)['h2ping_upstream_errors_total{kind="reset"}'] >= 1
    assert http11_request(sidecar.host, sidecar.port, "/echo", timeout=10).status == 200


def test_rate_limit_paces_a_download_and_a_relay_restart_refuses_then_serves(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay], run_sidecar: Callable[..., Any]
) -> None:
    relay = fault_relay(tls_origin)
    sidecar = run_sidecar(f"https://localhost:{relay.port}", *FAST_PINGS, ca_file=tls_origin.ca_file)
    assert http11_request(sidecar.host, sidecar.port, "/echo", timeout=10).status == 200
    relay.rate(200_000)
    started = time.monotonic()
    answer = http11_request(sidecar.host, sidecar.port, "/slow?first_byte=0&size=400000", timeout=20)
    took = time.monotonic() - started
    assert answer.status == 200 and len(answer.body) == 400_000
    assert 1.5 <= took < 6, f"400 kB at 200 kB/s took {took:.2f}s"
    relay.heal()

    port = relay.port
    relay.go_down()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # The refusal is the answer once the proxy has read its connection's end: a request that
    # comes first goes out on the closing connection and gets its EOF as the 502. Idle, the
    # proxy reads the FIN within a millisecond; with every core busy, it can be later.
    wait_until(
        lambda: scrape(sidecar)["h2ping_upstream_connections"] == 0, 10, "the proxy to see its connection end"
    )
    refused = http11_request(sidecar.host, sidecar.port, "/echo", timeout=10)
    assert refused.status == 502 and b"connection refused" in refused.body, refused
    relay.come_back()
    assert relay.port == port
    assert http11_request(sidecar.host, sidecar.port, "/echo", timeout=10).status == 200


def test_a_proxy_frozen_past_ping_timeout_keeps_a_connection_whose_ack_waits_unread(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay], run_sidecar: Callable[..., Any]
) -> None:
    """The machine was late, not the upstream: the ack sits in the proxy's socket when it wakes."""
    relay = fault_relay(tls_origin)
    relay.delay(400)  # a PING is out for 800 ms: time to freeze the proxy while one is
    sidecar = run_sidecar(f"https://localhost:{relay.port}", *FAST_PINGS, ca_file=tls_origin.ca_file)
    outcomes, threads = in_background(
        lambda: http11_request(sidecar.host, sidecar.port, "/slow?first_byte=8", timeout=30), 1
    )
    wait_until(lambda: tls_origin.active_streams == 1, 10, "the wait to reach the origin")

    def ping_out() -> bool:
        metrics = scrape(sidecar)
        return metrics["h2ping_pings_sent_total"] > metrics["h2ping_ping_acks_total"]

    wait_until(ping_out, 10, "a PING in flight")
    os.kill(sidecar.process.pid, signal.SIGSTOP)
    try:
        # The fault is the freeze's length (2.5 x ping_timeout), not an ordering of events: the
        # ack arrives meanwhile and waits in the socket, the PING's deadline passes.
        time.sleep(2.5)
    finally:
        os.kill(sidecar.process.pid, signal.SIGCONT)
    join_all(threads, 20)
    assert outcomes[0].status == 200, outcomes[0]
    metrics = scrape(sidecar)
    assert metrics['h2ping_upstream_errors_total{kind="ping_timeout"}'] == 0
    assert metrics['h2ping_upstream_dials_total{result="ok"}'] == 1


def test_origin_goaway_lets_in_flight_finish_and_moves_new_requests(
    tls_origin: TlsH2Origin, run_sidecar: Callable[..., Any]
) -> None:
    sidecar = run_sidecar(tls_origin.url, *FAST_PINGS, ca_file=tls_origin.ca_file)
    waits, wait_threads = in_background(
        lambda: http11_request(sidecar.host, sidecar.port, "/slow?first_byte=2", timeout=20), 5
    )
    wait_until(lambda: tls_origin.active_streams == 5, 10, "5 waits to reach the origin")
    tls_origin.goaway()
    after = [http11_request(sidecar.host, sidecar.port, "/echo", timeout=10).status for _ in range(5)]
    join_all(wait_threads, 10)
    assert after == [200] * 5
    assert [outcome.status for outcome in waits] == [200] * 5
    assert (tls_origin.goaways, tls_origin.connections, tls_origin.received) == (1, 2, 10)
    wait_until(lambda: tls_origin.active_connections == 1, 5, "the retired connection to close")


# --- the relay alone, with the lab's own HTTP/2 client ----------------------------------------


def test_relay_blackhole_keeps_the_connection_and_heal_delivers_what_waited(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay]
) -> None:
    relay = fault_relay(tls_origin)
    with H2Client("127.0.0.1", relay.port, tls_origin.ca_file, timeout=10) as client:
        assert client.request("/echo").status == 200
        relay.blackhole()
        stream = client.start_request("/echo?after=heal")
        with pytest.raises(TimeoutError):
            client.wait([stream], timeout=1.0)
        assert tls_origin.received == 1 and relay.active == 1  # held, not dropped
        relay.heal()
        answer = client.wait([stream], timeout=5)[stream]
        assert answer.status == 200 and json.loads(answer.body)["query"] == "after=heal"
    assert relay.connections == 1


def test_relay_delay_adds_to_each_way_of_a_round_trip(
    tls_origin: TlsH2Origin, fault_relay: Callable[..., FaultRelay]
) -> None:
    relay = fault_relay(tls_origin)
    with H2Client("127.0.0.1", relay.port, tls_origin.ca_file, timeout=10) as client:
        relay.delay(150)
        started = time.monotonic()
        assert client.request("/echo").status == 200
        took = time.monotonic() - started
        relay.heal()
        assert 0.3 <= took < 1.5, f"a request through 150 ms each way took {took:.2f}s"
        started = time.monotonic()
        assert client.request("/echo").status == 200
        assert time.monotonic() - started < 0.3
