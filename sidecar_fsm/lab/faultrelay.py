"""A TCP relay whose path can be broken on command while traffic flows: the lab's network faults.

This kernel has no netem, so faults are made in user space: one asyncio loop in a background
thread pipes each client of ``127.0.0.1:<port>`` to a fresh connection to the target, and the
path can be switched at any moment to

- ``blackhole()``: nothing forwarded either way, nothing closed; bytes wait in kernel buffers and
  the relay's queues as packets wait for a route that is gone, so a connection that outlives the
  fault resumes where it was;
- ``reset()``: every open pair aborted with RST on both sides, as a load balancer's hard drop;
- ``delay(ms)``: each chunk delivered ``ms`` after it was read, each way, order kept;
- ``rate(bytes_per_second)``: each direction of each pair paced to that many bytes a second;
- ``heal()``: no blackhole, no delay, no rate limit;
- ``restart(down)``: every pair closed, the port refusing for ``down`` seconds, then listening
  again on the same port (an upstream redeploy behind a fixed address).

With ``idle`` set, a pair silent both ways that long is closed, as ``IdleRelay`` does. Must not
listen on anything but loopback, buffer without bound (``_MAX_QUEUED`` per direction), or leave
a socket, task or thread behind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable

from .loopthread import LoopThread
from .relay import RelayCounts

_CHUNK = 64 * 1024
_MAX_QUEUED = 256 * 1024
_CONNECT_TIMEOUT = 5.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class _Path:
    """The state every pair consults: shared by all of them, changed only on the loop thread."""

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.delay = 0.0
        self.rate: float | None = None


class _Direction:
    """One way of one pair: chunks read from ``src`` waiting (with their due time) for ``dst``."""

    def __init__(self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pair = pair
        self.reader = reader
        self.writer = writer
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.changed = asyncio.Event()
        self.eof = False

    async def pump_in(self, path: _Path) -> None:
        """Read from the sender while the path flows and the queue has room."""
        while True:
            await path.flowing.wait()
            while self.queued >= _MAX_QUEUED:
                self.changed.clear()
                await self.changed.wait()
            data = await self.reader.read(_CHUNK)
            # A blackhole that started during the read still holds these bytes back: they are
            # queued now and the writer waits for the path to flow.
            self.pair.touch()
            if not data:
                self.eof = True
                self.changed.set()
                return
            self.queue.append((time.monotonic() + path.delay, data))
            self.queued += len(data)
            self.changed.set()

    async def pump_out(self, path: _Path) -> None:
        """Deliver queued chunks when due, paced by the rate limit; pass the sender's FIN on."""
        while True:
            if not self.queue:
                if self.eof:
                    with contextlib.suppress(OSError):
                        if self.writer.can_write_eof():
                            self.writer.write_eof()
                    return
                self.changed.clear()
                await self.changed.wait()
                continue
            await path.flowing.wait()
            due, data = self.queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if path.rate is not None:
                piece = max(1, int(path.rate / 20))
                data, rest = data[:piece], data[piece:]
                if rest:
                    self.queue[0] = (due, rest)
                else:
                    self.queue.popleft()
            else:
                self.queue.popleft()
            self.queued -= len(data)
            self.changed.set()
            self.writer.write(data)
            await self.writer.drain()
            self.pair.touch()
            if path.rate is not None:
                await asyncio.sleep(len(data) / path.rate)


class _Pair:
    """One client connection and its connection to the target, with the two pumps each way."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.writers = (client[1], upstream[1])
        self.up = _Direction(self, client[0], upstream[1])
        self.down = _Direction(self, upstream[0], client[1])
        self.last_activity = time.monotonic()
        self.tasks: list[asyncio.Task[None]] = []

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def close(self, *, abort: bool) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            if abort:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    # SO_LINGER 0: close() sends RST, the "connection reset" of a hard drop.
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()


class FaultRelay(LoopThread, RelayCounts):
    """Relay ``127.0.0.1:<port>`` → ``target_host:target_port`` with faults on command; each fault
    method may be called from any thread while traffic flows and returns once it is in force.
    ``resets`` counts pairs aborted by ``reset()``, ``drops`` those closed for idleness."""

    def __init__(
        self, target_host: str, target_port: int, *, idle: float | None = None, port: int = 0
    ) -> None:
        super().__init__()
        if target_host not in _LOOPBACK:
            raise ValueError(f"FaultRelay target_host: '{target_host}' is not loopback; use 127.0.0.1")
        if idle is not None and idle <= 0:
            raise ValueError(f"FaultRelay idle: '{idle}' must be above 0; use seconds, e.g. 2.0")
        self.target = (target_host, target_port)
        self.idle = idle
        self._wanted_port = port
        self._lock = threading.Lock()
        self._counts = {"connections": 0, "resets": 0, "drops": 0, "refused": 0}
        self._pairs: set[_Pair] = set()
        self._path: _Path | None = None
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # --- counters and addresses (any thread) -------------------------------------------------

    @property
    def resets(self) -> int:
        return self._read("resets")

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FaultRelay: not started; call start() first")
        return self._port

    # --- faults (any thread) -----------------------------------------------------------------

    def blackhole(self) -> None:
        """Stop forwarding both ways on every pair, new ones included; close nothing."""
        self.call(self._apply(lambda path: path.flowing.clear()))

    def heal(self) -> None:
        """Forward again, at once and at full speed: no blackhole, delay or rate limit."""

        def change(path: _Path) -> None:
            path.delay, path.rate = 0.0, None
            path.flowing.set()

        self.call(self._apply(change))

    def delay(self, milliseconds: float) -> None:
        """Deliver each chunk read from now on ``milliseconds`` after it was read, each way."""
        if milliseconds < 0:
            raise ValueError(f"FaultRelay delay: '{milliseconds}' must be 0 or above (milliseconds)")
        seconds = milliseconds / 1000.0
        self.call(self._apply(lambda path: setattr(path, "delay", seconds)))

    def rate(self, bytes_per_second: float | None) -> None:
        """Pace each direction of each pair to ``bytes_per_second`` (None: no limit)."""
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"FaultRelay rate: '{bytes_per_second}' must be above 0 (bytes a second)")
        self.call(self._apply(lambda path: setattr(path, "rate", bytes_per_second)))

    def reset(self) -> int:
        """Abort every open pair with RST on both sides; return how many were aborted."""
        aborted: int = self.call(self._close_pairs(abort=True, counter="resets"))
        return aborted

    def go_down(self) -> None:
        """Close every pair (FIN both sides) and stop listening: connects are refused."""
        self.call(self._go_down())

    def come_back(self) -> None:
        """Listen again on the same port."""
        self.call(self._listen(self.port))

    def restart(self, down: float) -> None:
        """``go_down()``, ``down`` seconds refusing, ``come_back()``; returns once it is back."""
        self.go_down()
        time.sleep(down)
        self.come_back()

    # --- life cycle (LoopThread: start, stop, call) ---------------------------------------------

    thread_name = "sidecar-fsm-fault-relay"

    def stop(self) -> None:
        super().stop()
        self._server = None

    async def _begin(self) -> None:
        self._path = _Path()
        await self._listen(self._wanted_port)
        if self.idle is not None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(self.idle))

    async def _listen(self, port: int) -> None:
        if self._server is not None:
            return
        # reuse_address: the port's old connections may sit in TIME_WAIT after a restart.
        self._server = await asyncio.start_server(
            self._serve, host="127.0.0.1", port=port, backlog=512, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def _go_down(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self._close_pairs(abort=False, counter=None)

    async def _apply(self, change: Callable[[_Path], None]) -> None:
        assert self._path is not None
        change(self._path)

    async def _close_pairs(self, *, abort: bool, counter: str | None) -> int:
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close(abort=abort)
            if counter is not None:
                self.count(counter)
        await asyncio.gather(*(task for pair in pairs for task in pair.tasks), return_exceptions=True)
        return len(pairs)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._path is not None
        self.count("connections")
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*self.target), _CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError):
            self.count("refused")
            writer.transport.abort()
            return
        pair = _Pair((reader, writer), upstream)
        for stream_writer in pair.writers:
            sock = stream_writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._pairs.add(pair)
        loop = asyncio.get_running_loop()
        path = self._path
        pair.tasks = [
            loop.create_task(pair.up.pump_in(path)),
            loop.create_task(pair.up.pump_out(path)),
            loop.create_task(pair.down.pump_in(path)),
            loop.create_task(pair.down.pump_out(path)),
        ]
        done, _ = await asyncio.wait(pair.tasks, return_when=asyncio.FIRST_EXCEPTION)
        if all(task.done() for task in pair.tasks) and not any(_failed(task) for task in pair.tasks):
            # Both ways ended with a FIN that was passed on: a clean close.
            self._forget(pair, abort=False)
        elif any(_failed(task) for task in done):
            # A reset or a broken pipe on one side is passed on as a reset to the other.
            self._forget(pair, abort=True)

    def _forget(self, pair: _Pair, *, abort: bool) -> None:
        with self._lock:
            known = pair in self._pairs
            self._pairs.discard(pair)
        if known:
            pair.close(abort=abort)

    async def _sweep(self, idle: float) -> None:
        while True:
            now = time.monotonic()
            with self._lock:
                pairs = list(self._pairs)
            for pair in pairs:
                if now - pair.last_activity >= idle:
                    self.count("drops")
                    self._forget(pair, abort=False)
            await asyncio.sleep(min(idle / 4, 0.25))

    async def _shutdown(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self._go_down()
        await self._cancel_other_tasks()


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None
