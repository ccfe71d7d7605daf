"""The orchestrator's HTTP server: one write per response, access lines only at debug level
(``entrypoints/cli/http.py``, ``cli/orchestrator.http_config``; issue 17 item 3)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from dtq.entrypoints.cli.http import FLUSH_AT, CoalescedWrites, http_protocol
from dtq.entrypoints.cli.orchestrator import http_config
from dtq.entrypoints.config import Settings
from tests.tcp_proxy import free_port


class RecordingTransport:
    """The transport calls CoalescedWrites makes: what was written, and when it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default


async def test_writes_of_one_loop_iteration_go_out_as_one() -> None:
    inner = RecordingTransport()
    transport = CoalescedWrites(inner)  # type: ignore[arg-type]

    transport.write(b"HTTP/1.1 201 Created\r\n\r\n")
    transport.write(b'{"ok":true}')
    assert inner.writes == []
    await asyncio.sleep(0)

    assert inner.writes == [b'HTTP/1.1 201 Created\r\n\r\n{"ok":true}']


async def test_a_later_iteration_is_a_later_write() -> None:
    inner = RecordingTransport()
    transport = CoalescedWrites(inner)  # type: ignore[arg-type]

    transport.write(b"a")
    await asyncio.sleep(0)
    transport.write(b"b")
    await asyncio.sleep(0)

    assert inner.writes == [b"a", b"b"]


async def test_a_large_body_is_written_without_waiting_for_the_iteration() -> None:
    inner = RecordingTransport()
    transport = CoalescedWrites(inner)  # type: ignore[arg-type]

    transport.write(b"h")
    transport.write(b"x" * FLUSH_AT)

    assert inner.writes == [b"h" + b"x" * FLUSH_AT]


async def test_close_sends_what_was_gathered_first() -> None:
    inner = RecordingTransport()
    transport = CoalescedWrites(inner)  # type: ignore[arg-type]

    transport.write(b"bye")
    transport.close()
    await asyncio.sleep(0)

    assert inner.writes == [b"bye"]
    assert inner.closed


async def test_writelines_keeps_the_order_of_gathered_writes() -> None:
    inner = RecordingTransport()
    transport = CoalescedWrites(inner)  # type: ignore[arg-type]

    transport.write(b"1")
    transport.writelines([b"2", b"3"])
    transport.write(b"4")
    await asyncio.sleep(0)

    assert inner.writes == [b"1234"]


async def test_other_calls_reach_the_wrapped_transport() -> None:
    transport = CoalescedWrites(RecordingTransport())  # type: ignore[arg-type]

    assert transport.get_extra_info("peername") == ("127.0.0.1", 1234)
    assert not transport.is_closing()


def test_access_lines_are_logged_only_at_debug_level() -> None:
    assert http_config(object(), Settings(log_level="info")).access_log is False
    assert http_config(object(), Settings(log_level="debug")).access_log is True


async def test_the_server_answers_through_it_with_keep_alive() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        headers = [(b"content-length", b"5")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"hello"})

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=http_protocol(), lifespan="off", log_config=None
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # the second request on the same connection
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
        writer.close()
        await writer.wait_closed()
    finally:
        server.should_exit = True
        await serving
