"""The HTTP API behind a real uvicorn server on a free local port, spoken to over raw sockets:
what only a real connection shows (chunked and streamed bodies over the limit, a client that
disconnects mid-body, a body that never finishes arriving). Issue 12, "Outages and bad input"."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn

from dtq.entrypoints.api import create_app
from dtq.entrypoints.api.middleware import CLIENT_CLOSED
from dtq.entrypoints.container import open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.unit.api_harness import SETTINGS

LIMIT = SETTINGS.api_max_body_bytes


@dataclass
class Server:
    port: int
    metrics: OrchestratorMetrics

    def requests(self, status: str) -> float:
        labels = {"method": "POST", "route": "/v1/tasks", "status": status}
        return (
            self.metrics.registry.get_sample_value("orchestrator_http_requests_total", labels)
            or 0.0
        )


@asynccontextmanager
async def serving(body_timeout: float = 5.0, keep_alive: float = 5.0) -> AsyncIterator[Server]:
    """The app on the memory backend under uvicorn on 127.0.0.1, port chosen by the kernel."""
    async with open_services(SETTINGS, backend="memory") as services:
        metrics = OrchestratorMetrics(new_registry())
        app = create_app(
            services.api, SETTINGS, metrics, metrics.registry, body_timeout=body_timeout
        )
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            lifespan="on",
            timeout_keep_alive=keep_alive,  # type: ignore[arg-type]  # uvicorn takes a float
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        try:
            async with asyncio.timeout(5):
                while not server.started:
                    await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            yield Server(port, metrics)
        finally:
            server.should_exit = True
            await task


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of one HTTP/1.1 response (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers["content-length"]))
    return status, json.loads(body)


def head(extra: str, connection: str = "keep-alive") -> bytes:
    extra = f"Connection: {connection}\r\n{extra}"
    return (
        f"POST /v1/tasks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


#: ``Connection: close`` is what urllib sends: the server then closes right after its response.
CONNECTIONS = pytest.mark.parametrize("connection", ["keep-alive", "close"])


@CONNECTIONS
async def test_a_chunked_body_over_the_limit_gets_the_413_json_error(connection: str) -> None:
    async with serving() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(head("Transfer-Encoding: chunked\r\n", connection))
        chunk = b"x" * 8192
        for _ in range(256 * LIMIT // len(chunk)):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

        status, body = await read_response(reader)

        writer.close()
        assert (status, body["error"]["code"]) == (413, "request_too_large")


@CONNECTIONS
async def test_a_large_body_streamed_with_its_length_gets_the_413_json_error(
    connection: str,
) -> None:
    async with serving() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        size = 256 * LIMIT
        writer.write(head(f"Content-Length: {size}\r\n", connection))
        for _ in range(size // 8192):
            writer.write(b"x" * 8192)
            await writer.drain()

        status, body = await read_response(reader)

        writer.close()
        assert (status, body["error"]["code"]) == (413, "request_too_large")


@CONNECTIONS
async def test_a_body_over_the_limit_streamed_slowly_gets_the_413_json_error(
    connection: str,
) -> None:
    """The server must not hang up (keep-alive expiry, or the close it was asked for, after its
    early 413) while the client is still sending: the client reads its response only once the
    body is sent."""
    async with serving(keep_alive=0.5) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(head("Transfer-Encoding: chunked\r\n", connection))
        chunk = b"x" * (LIMIT // 4)
        for _ in range(12):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

        status, body = await read_response(reader)

        writer.close()
        assert (status, body["error"]["code"]) == (413, "request_too_large")


async def test_a_client_that_disconnects_mid_body_is_a_client_event_not_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving() as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(head("Content-Length: 1000\r\n") + b'{"kind": "ec')
        await writer.drain()
        await asyncio.sleep(0.2)
        with caplog.at_level(logging.INFO):
            writer.close()
            await writer.wait_closed()
            async with asyncio.timeout(5):
                while not server.requests(CLIENT_CLOSED):
                    await asyncio.sleep(0.01)

    assert server.requests("500") == 0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not any(r.exc_info for r in caplog.records)


async def test_a_body_that_never_finishes_arriving_is_timed_out_with_a_408() -> None:
    async with serving(body_timeout=0.3) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(head("Content-Length: 1000\r\n") + b'{"kind": "ec')
        await writer.drain()

        async with asyncio.timeout(5):
            status, body = await read_response(reader)

        writer.close()
        assert (status, body["error"]["code"]) == (408, "request_timeout")
        assert server.requests("408") == 1


@pytest.mark.parametrize("path", ["/healthz", "/healthz/"])
async def test_head_healthz_announces_the_get_body_length_and_sends_no_body(path: str) -> None:
    async with serving() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            _, body = await read_response(reader)
            get_length = len(json.dumps(body, separators=(",", ":")))
            writer.write(f"HEAD {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
            # A second request on the same connection: its status line must come next, with
            # no body bytes of the HEAD response in between.
            writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            async with asyncio.timeout(5):
                following = await reader.readuntil(b"\r\n")
        finally:
            writer.close()
            await writer.wait_closed()

    assert lines[0].split()[1] == "200"
    assert sum(line.lower().startswith("content-length:") for line in lines) == 1, lines
    assert int(headers["content-length"]) in (0, get_length), headers
    assert following.startswith(b"HTTP/1.1 200"), following
