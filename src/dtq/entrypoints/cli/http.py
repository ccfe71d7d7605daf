"""The orchestrator's HTTP/1.1 server protocol: uvicorn's, with each response sent in one write.

uvicorn writes a response's status line and headers, then its body, as two ``transport.write``
calls; on uvloop each is its own ``send()`` system call and, with ``TCP_NODELAY``, its own
packet, which the client then reads in two wake-ups. :func:`http_protocol` returns uvicorn's
protocol (httptools when installed, else h11) on a transport that gathers the writes made in
one event-loop iteration and sends them together at the end of it (issue 17 item 3: about 20 µs
of server and 25 µs of client CPU per small response, measured in benchmarks/PROFILE.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

#: Bytes gathered before they are written at once, without waiting for the iteration's end (a
#: large streamed body keeps uvicorn's own flow control).
FLUSH_AT = 64 * 1024


class CoalescedWrites:
    """An ``asyncio.Transport`` wrapper whose writes of one loop iteration go out as one.

    Everything but ``write``, ``writelines``, ``close`` and ``write_eof`` is the wrapped
    transport's. ``close`` and ``write_eof`` send what is gathered first; data gathered when the
    transport is already closing is dropped, as the transport itself would drop it; ``abort``
    drops it too.

    Args:
        transport: the connection's transport.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._size = 0
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Gather ``data``; it is written at the end of this loop iteration (or at once past
        :data:`FLUSH_AT` bytes)."""
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        """Gather each of ``lines`` (in order with what :meth:`write` gathered)."""
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Write what is gathered, as one ``write`` of the wrapped transport."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Write what is gathered, then close the wrapped transport."""
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        """Write what is gathered, then half-close the wrapped transport."""
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's automatic HTTP protocol class, on :class:`CoalescedWrites` transports (for
    ``uvicorn.Config(http=...)``)."""

    class CoalescingHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(CoalescedWrites(transport))  # type: ignore[arg-type]

    return CoalescingHTTPProtocol
