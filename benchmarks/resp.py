"""A minimal pipelined Redis client for the bench app's ``count`` handler: ``INCR`` only.

Why: dtq's handlers are coroutines, and redis-py's asyncio client spends ~75 µs of CPU per
``INCR`` on this machine (its connection pool, retry and observability layers), against ~40 µs
for the synchronous client the peers' handlers call. So that every queue's task does the same
work at a similar cost, the ``count`` handler writes ``INCR <key>`` on one shared connection
per worker process and awaits its own reply (replies arrive in request order): ~18 µs. Each
task still makes one round trip to Redis and returns only after its increment is acknowledged.
``BENCH_COUNT_CLIENT=redis-py`` switches the handler back to redis-py (benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast


class RespError(Exception):
    """Redis answered with an error, or the connection was lost with replies outstanding."""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.waiters: deque[asyncio.Future[int]] = deque()
        self.buffer = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's classes
        self.transport = cast(asyncio.WriteTransport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            line, sep, rest = self.buffer.partition(b"\r\n")
            if not sep:
                return
            self.buffer = rest
            waiter = self.waiters.popleft()
            if waiter.done():
                continue
            if line[:1] == b":":
                waiter.set_result(int(line[1:]))
            else:
                waiter.set_exception(RespError(line.decode(errors="replace")))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(RespError(f"connection lost: {exc}"))


class IncrClient:
    """``await client.incr(key)`` over one lazily opened connection to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is None or self._protocol.transport is None:
                loop = asyncio.get_running_loop()
                _, self._protocol = await loop.create_connection(_Protocol, self._host, self._port)
            return self._protocol

    async def incr(self, key: str) -> int:
        """Increment ``key``; returns its new value.

        Raises:
            RespError: Redis refused the command, or the connection was lost.
        """
        protocol = await self._connected()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        transport = protocol.transport
        if transport is None:
            raise RespError("connection lost")
        protocol.waiters.append(waiter)
        transport.write(b"INCR " + key.encode() + b"\r\n")
        return await waiter
