"""A small Server-Sent Events reader for the event stream's tests (``GET /v1/events``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Message:
    """One SSE message: its ``id``, ``event`` and the decoded ``data`` (None for a comment)."""

    id: str | None = None
    event: str | None = None
    data: Any = None
    comments: list[str] = field(default_factory=list)


async def messages(response: httpx.Response) -> AsyncIterator[Message]:
    """The messages of a streaming response, as they arrive (comments included)."""
    current = Message()
    lines: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if lines:
                current.data = json.loads("\n".join(lines))
            if lines or current.comments or current.id:
                yield current
            current, lines = Message(), []
        elif line.startswith(":"):
            current.comments.append(line[1:].strip())
        elif line.startswith("id: "):
            current.id = line[4:]
        elif line.startswith("event: "):
            current.event = line[7:]
        elif line.startswith("data: "):
            lines.append(line[6:])


async def collect(
    client: httpx.AsyncClient,
    params: dict[str, str] | None = None,
    *,
    count: int,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> list[Message]:
    """Open ``GET /v1/events`` and read until ``count`` events (comments not counted) arrived;
    then close the stream. Raises ``TimeoutError`` when they do not within ``timeout`` s."""
    found: list[Message] = []
    async with asyncio.timeout(timeout):
        async with client.stream(
            "GET", "/v1/events", params=params, headers=headers, timeout=timeout
        ) as response:
            assert response.status_code == 200, response.status_code
            assert response.headers["content-type"].startswith("text/event-stream")
            async for message in messages(response):
                if message.event is not None:
                    found.append(message)
                    if len(found) >= count:
                        break
    return found
