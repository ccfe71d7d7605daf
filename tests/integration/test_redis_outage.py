"""The Redis client notices an unreachable Redis in seconds (issue 12): through
:class:`~tests.tcp_proxy.CuttableProxy`, a stalled server (connections open, nothing comes back)
costs one call at most ``REDIS_STALL_BOUND`` seconds, a refused one fails at once, and the client
works again as soon as the server answers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from dtq.adapters.redis import RedisQueue, connect_redis
from dtq.domain.errors import BackendUnavailable
from tests.tcp_proxy import CuttableProxy

from .conftest import REDIS_URL

pytestmark = pytest.mark.integration

#: Seconds one call may take against a stalled Redis: the client's 3 s read timeout (or 2 s
#: connect timeout), plus room on a loaded 2-core machine.
REDIS_STALL_BOUND = 4.0


@pytest.fixture
async def through_proxy(
    redis_client: Redis, redis_prefix: str
) -> AsyncIterator[tuple[RedisQueue, CuttableProxy]]:
    """A ``RedisQueue`` on a ``connect_redis`` client that reaches Redis through the proxy."""
    url = urlsplit(REDIS_URL)
    proxy = await asyncio.to_thread(CuttableProxy, url.hostname or "127.0.0.1", url.port or 6379)
    await asyncio.to_thread(proxy.restore)
    client = connect_redis(f"127.0.0.1:{proxy.port}")
    try:
        queue = RedisQueue(client, prefix=redis_prefix, marker_ttl=30.0)
        await queue.ping()
        yield queue, proxy
    finally:
        await asyncio.to_thread(proxy.restore)
        await client.aclose()
        await asyncio.to_thread(proxy.close)


async def _timed_failure(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        await asyncio.wait_for(call(), timeout=60)
    return time.monotonic() - started


Call = Callable[[RedisQueue], Awaitable[Any]]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda q: q.enqueue_many([(uuid.uuid4(), "default")]), id="enqueue-idempotent"
        ),
        pytest.param(lambda q: q.pop_many(["default"], 30.0, 1), id="blocking-pop"),
        pytest.param(lambda q: q.pop_many(["default"], 0, 4), id="pop-script"),
        pytest.param(lambda q: q.ping(), id="ping"),
    ],
)
async def test_a_stalled_redis_fails_a_call_within_seconds_and_then_works_again(
    through_proxy: tuple[RedisQueue, CuttableProxy], call: Call
) -> None:
    queue, proxy = through_proxy
    await asyncio.to_thread(proxy.stall)

    took = await _timed_failure(lambda: call(queue))

    print(f"\nstalled Redis: call failed after {took:.2f}s")
    assert took < REDIS_STALL_BOUND
    await asyncio.to_thread(proxy.restore)
    started = time.monotonic()
    assert await queue.enqueue_many([(uuid.uuid4(), "default")]) == 1
    assert time.monotonic() - started < 1.0


async def test_a_refused_redis_fails_at_once_and_the_client_reconnects_after(
    through_proxy: tuple[RedisQueue, CuttableProxy],
) -> None:
    queue, proxy = through_proxy
    await asyncio.to_thread(proxy.cut)

    took = await _timed_failure(lambda: queue.enqueue_many([(uuid.uuid4(), "default")]))

    assert took < 1.5
    await asyncio.to_thread(proxy.restore)
    assert await queue.enqueue_many([(uuid.uuid4(), "default")]) == 1
