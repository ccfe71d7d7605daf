"""A TCP proxy for outage drills: between a dtq process (or client) and PostgreSQL or Redis, it can
cut every connection and refuse new ones (the host is down), or stall them (a host that drops
packets: connections open, nothing comes back), then let traffic through again on the same port."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a server that binds it
    later: one of :func:`listen_ports`, out of the way of outgoing connections."""
    return listen_ports(1)[0]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default first ephemeral port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listen_ports(count: int, *, offset: int = 0) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 for a server that binds them a while later.

    They lie below the kernel's ephemeral range, so no outgoing connection (of the server
    itself while it starts, or of another test) is handed one in the meantime, as can happen
    to a :func:`free_port`. Nothing listens on any of them now; with ``offset``, nothing on
    ``port + offset`` either, which lies below the range too (Redis Cluster's bus port).

    Raises:
        RuntimeError: fewer than ``count`` such ports are free.
    """
    last = _ephemeral_low() - 1 - offset
    candidates = list(range(10_000, last + 1))
    random.shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        if _bindable(port) and (not offset or _bindable(port + offset)):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"fewer than {count} free ports below {last + offset + 1}")


class CuttableProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``target`` that can cut and restore connections.

    It runs its own event loop in a daemon thread; every method is called from the test thread.
    ``stall()`` keeps accepting connections but holds every byte in both directions until
    ``restore()`` (which then passes the held bytes on) or ``cut()``.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing: asyncio.Event | None = None  # created on the proxy's loop
        self._thread.start()
        self._call(self._make_flowing())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def restore(self) -> None:
        """Accept connections again (also the first start)."""
        self._call(self._listen())

    def cut(self) -> None:
        """Stop accepting (connection refused) and reset every open connection."""
        self._call(self._cut())

    def stall(self) -> None:
        """Keep connections open and accept new ones, but pass no bytes on (a black hole)."""
        self._call(self._set_flowing(False))

    def close(self) -> None:
        self._call(self._cut())
        self._call(self._loop.shutdown_asyncgens())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    async def _make_flowing(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _listen(self) -> None:
        await self._set_flowing(True)
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                assert self._flowing is not None
                await self._flowing.wait()
                if writer.transport.is_closing():  # cut while the bytes were held
                    break
                writer.write(data)
                await writer.drain()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
