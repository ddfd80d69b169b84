"""The asyncio HTTP/1.1 client of the load phases: one request per connection, many held at
once, or POST echoes on keep-alive connections.

Owns talking HTTP/1.1 to a proxy under test and counting the outcome (``Outcome``: ok, failed by
reason, latencies). Hand-written rather than aiohttp or http.client: 10,000 connections must
be opened first and written in one pass (``held_waits``), and the bytes sent must be exactly
these. Must only connect to the address it is given (loopback in every benchmark).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        body = await reader.read()
    return status, headers, body


def request_bytes(method: str, target: str, host: str, body: bytes = b"") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"
    if method == "POST":
        head += f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


@dataclass
class Outcome:
    ok: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        self.failed += 1
        self.errors[why] = self.errors.get(why, 0) + 1

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


async def one_shot(
    addr: str, target: str, out: Outcome, timeout: float, ssl_ctx: ssl.SSLContext | None = None
) -> None:
    """One request on its own connection (aiohttp's pattern for concurrent requests)."""
    host, port = addr.rsplit(":", 1)
    t0 = time.monotonic()
    writer: asyncio.StreamWriter | None = None

    async def exchange() -> tuple[int, dict[str, str], bytes]:
        nonlocal writer
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ssl_ctx)
        writer.write(request_bytes("GET", target, addr))
        return await read_response(reader)

    try:
        status, _, body = await asyncio.wait_for(exchange(), timeout)
        if status == 200 and body == b"ok\n":
            out.ok += 1
            out.latencies.append(time.monotonic() - t0)
        else:
            out.fail(f"status {status}: {body[:80]!r}")
    except (
        OSError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        asyncio.TimeoutError,
        ValueError,
    ) as e:
        out.fail(type(e).__name__)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def held_waits(
    addr: str,
    n: int,
    wait: str,
    timeout: float,
    while_waiting: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> tuple[Outcome, dict[str, Any]]:
    """`n` GET /wait requests with ids s0..s<n-1>, one connection each (aiohttp's pattern),
    sent together: every connection is opened first, then every request is written in one
    pass. So all `n` reach the proxy within a moment of each other however long the connects
    took (10,000 asyncio connects take seconds here, longer than a short wait), and the proxy
    really holds `n` at once. `while_waiting` runs once all are sent; its result is returned.
    Latency is from the request's write to its last byte."""
    host, port = addr.rsplit(":", 1)
    out = Outcome()
    # The proxy's accept queue is bounded (somaxconn): SYNs beyond it are dropped and re-sent
    # a second later, so connects go out a few hundred at a time.
    gate = asyncio.Semaphore(256)

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with gate:
            return await asyncio.wait_for(asyncio.open_connection(host, int(port)), 30)

    conns = await asyncio.gather(*(connect() for _ in range(n)), return_exceptions=True)
    try:

        async def answer(reader: asyncio.StreamReader, t0: float) -> None:
            try:
                status, _, body = await asyncio.wait_for(read_response(reader), timeout)
            except (
                OSError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                asyncio.TimeoutError,
                ValueError,
            ) as e:
                out.fail(type(e).__name__)
                return
            if status == 200 and body == b"ok\n":
                out.ok += 1
                out.latencies.append(time.monotonic() - t0)
            else:
                out.fail(f"status {status}: {body[:80]!r}")

        pending = []
        for i, c in enumerate(conns):
            if isinstance(c, BaseException):
                out.fail(f"connect: {type(c).__name__}")
                continue
            reader, writer = c
            writer.write(request_bytes("GET", f"/wait?first_byte={wait}&id=s{i}", addr))
            pending.append(asyncio.ensure_future(answer(reader, time.monotonic())))
        # Let every reader start (each parks on its socket) before `while_waiting` runs, so a
        # scrape timed in a thread does not wait for this loop's GIL instead of for the proxy.
        await asyncio.sleep(0)
        during = await while_waiting() if while_waiting is not None else {}
        await asyncio.gather(*pending)
        return out, during
    finally:
        for c in conns:
            if not isinstance(c, BaseException):
                c[1].close()


async def echo_load(addr: str, total: int, conc: int, size: int, timeout: float) -> Outcome:
    """`total` POSTs of `size` random bytes from `conc` keep-alive connections; a response
    counts only if the echoed body is byte-exact."""
    out = Outcome()
    todo = iter(range(total))
    host, port = addr.rsplit(":", 1)

    async def worker() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for i in todo:
            body = os.urandom(size)
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
                reader, writer = conn
                writer.write(request_bytes("POST", f"/echo?id=g{i}", addr, body))
                status, headers, got = await asyncio.wait_for(read_response(reader), timeout)
                if headers.get("connection", "").lower() == "close":
                    conn[1].close()
                    conn = None
                if status == 200 and got == body:
                    out.ok += 1
                    out.latencies.append(time.monotonic() - t0)
                else:
                    out.fail(f"status {status}" if status != 200 else "body differs")
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                out.fail(type(e).__name__)
                if conn is not None:
                    conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out
