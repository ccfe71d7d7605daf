"""A one-server Redis client writes each command in the caller's task (``connection._InlineSend``)
and still bounds a write by its socket timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Generator
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from dtq.adapters.redis import connect_redis
from tests.tcp_proxy import CuttableProxy

from .conftest import REDIS_URL
from .test_redis_outage import REDIS_STALL_BOUND

pytestmark = pytest.mark.integration


async def test_a_command_is_written_without_a_task_of_its_own(redis_client: Redis) -> None:
    """redis-py bounds a write with ``asyncio.wait_for``, which on Python 3.11 runs the write as
    a task of its own (one more turn of the event loop per command); ``connect_redis``'s
    connections write in the caller's task."""
    client = connect_redis(REDIS_URL)
    loop = asyncio.get_running_loop()
    created: list[str] = []
    previous = loop.get_task_factory()

    def counting(
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
        **kwargs: Any,
    ) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **kwargs)

    try:
        await client.ping()  # connects (redis-py's own path)
        loop.set_task_factory(counting)
        for _ in range(5):
            assert await client.ping() is True
            await client.set("dtqtest:inline-send", b"1", px=10_000)
    finally:
        loop.set_task_factory(previous)
        await client.aclose()
    assert created == []


async def test_a_write_that_cannot_drain_fails_within_seconds_and_the_next_call_works() -> None:
    """Through a stalled proxy the socket's buffers fill and the write's drain never ends: the
    command fails within the socket timeout (3 s) with its connection closed, and once the
    proxy passes bytes again the next command gets a fresh connection."""
    url = urlsplit(REDIS_URL)
    proxy = await asyncio.to_thread(CuttableProxy, url.hostname or "127.0.0.1", url.port or 6379)
    await asyncio.to_thread(proxy.restore)  # listening
    client = connect_redis(f"127.0.0.1:{proxy.port}")
    try:
        assert await client.ping() is True
        await asyncio.to_thread(proxy.stall)
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError, match="writing"):  # not the reply's read
            await asyncio.wait_for(
                client.set("dtqtest:inline-send-big", b"x" * (64 << 20), px=1_000), timeout=30
            )
        took = time.monotonic() - started
        print(f"\nundrainable write failed after {took:.2f}s")
        assert took < REDIS_STALL_BOUND
        await asyncio.to_thread(proxy.restore)
        assert await client.ping() is True
    finally:
        await asyncio.to_thread(proxy.restore)
        await client.aclose()
        await asyncio.to_thread(proxy.close)
