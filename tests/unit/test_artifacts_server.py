"""``POST /v1/artifacts`` behind a real uvicorn server, over raw sockets: a chunked upload over
``API_MAX_ARTIFACT_BYTES`` still gets its 413 (the body guard drains), and an upload whose client
hangs up mid-body leaves no file behind (issue 13, "Bad input and failure")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import uvicorn

from dtq.entrypoints.api import create_app
from dtq.entrypoints.container import open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.unit.api_harness import SETTINGS

LIMIT = 256 * 1024


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[int]:
    settings = replace(SETTINGS, artifact_dir=root, api_max_artifact_bytes=LIMIT)
    async with open_services(settings, backend="memory") as services:
        metrics = OrchestratorMetrics(new_registry())
        app = create_app(services.api, settings, metrics, metrics.registry, body_timeout=5.0)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        try:
            async with asyncio.timeout(5):
                while not server.started:
                    await asyncio.sleep(0.01)
            yield server.servers[0].sockets[0].getsockname()[1]
        finally:
            server.should_exit = True
            await task


def _head(connection: str, extra: str) -> bytes:
    return (
        "POST /v1/artifacts HTTP/1.1\r\nHost: test\r\nContent-Type: application/octet-stream\r\n"
        f"Connection: {connection}\r\n{extra}\r\n"
    ).encode()


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split()[1]), json.loads(body)


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
async def test_chunked_upload_over_the_limit_gets_413_and_leaves_nothing(
    tmp_path: Path, connection: str
) -> None:
    async with serving(tmp_path) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head(connection, "Transfer-Encoding: chunked\r\n"))
        chunk = b"x" * 8192
        for _ in range(4 * LIMIT // len(chunk)):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        status, body = await _response(reader)
        writer.close()
    assert (status, body["error"]["code"]) == (413, "request_too_large")  # type: ignore[index]
    assert _files(tmp_path) == []


async def test_chunked_upload_within_the_limit_is_stored(tmp_path: Path) -> None:
    async with serving(tmp_path) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("close", "Transfer-Encoding: chunked\r\n"))
        for _ in range(10):
            writer.write(b"%x\r\n%s\r\n" % (1000, b"a" * 1000))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        status, body = await _response(reader)
        writer.close()
    assert status == 201
    assert body["size"] == 10_000
    assert len(_files(tmp_path)) == 1


async def test_upload_cut_mid_body_leaves_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("keep-alive", f"Content-Length: {LIMIT}\r\n"))
        writer.write(b"z" * (LIMIT // 2))
        await writer.drain()
        for _ in range(100):  # the server streams the first half into a temp file...
            await asyncio.sleep(0.02)
            if _files(tmp_path):
                break
        assert [p.parent.name for p in _files(tmp_path)] == [".tmp"]
        writer.close()  # ...and the client hangs up before the rest
        await writer.wait_closed()
        for _ in range(100):  # the server notices the hang-up and discards the upload
            await asyncio.sleep(0.02)
            if not _files(tmp_path):
                break
    assert _files(tmp_path) == []
