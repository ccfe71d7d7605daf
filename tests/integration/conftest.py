"""Fixtures for integration tests against real services.

Each service has its own section. A fixture for an unreachable service skips the test on a laptop
and fails it when ``CI`` is set (STYLE: real-service fixtures).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from dtq.adapters.redis import connect_redis

# =================================================================================================
# Redis
# =================================================================================================

REDIS_URL = os.environ.get("DTQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _unavailable(message: str) -> None:
    """Skip on a laptop, fail in CI."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


async def delete_prefix_keys(client: Redis, prefix: str) -> None:
    """Delete every key under ``prefix`` (SCAN + DEL). Never FLUSHDB/FLUSHALL the shared server."""
    batch: list[bytes | str] = []
    async for key in client.scan_iter(match=f"{prefix}*", count=500):
        batch.append(key)
        if len(batch) >= 500:
            await client.delete(*batch)
            batch.clear()
    if batch:
        await client.delete(*batch)


@pytest.fixture(scope="session")
def redis_unreachable() -> str | None:
    """Probe Redis once per session (no retries): None when it answers, else why not.

    Saves every Redis test from waiting out the client's connection retries when it is down.
    """
    probe = redis.Redis.from_url(
        REDIS_URL, socket_connect_timeout=2.0, socket_timeout=2.0, retry=Retry(NoBackoff(), 0)
    )
    try:
        probe.ping()
    except (RedisError, OSError) as exc:
        return f"Redis unreachable at {REDIS_URL}: {exc}"
    finally:
        probe.close()
    return None


@pytest.fixture
async def redis_client(redis_unreachable: str | None) -> AsyncIterator[Redis]:
    """A client (``connect_redis``) for ``DTQ_TEST_REDIS_URL``, default
    ``redis://127.0.0.1:6379/0``; skips the test when Redis is unreachable (fails under ``CI``)."""
    if redis_unreachable:
        _unavailable(redis_unreachable)
    client = connect_redis(REDIS_URL)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        _unavailable(f"Redis unreachable at {REDIS_URL}: {exc}")
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def redis_prefix(redis_client: Redis) -> AsyncIterator[str]:
    """A key prefix unique to this test (``dtqtest:{uuid}:``); its keys are deleted afterwards."""
    prefix = f"dtqtest:{uuid.uuid4().hex}:"
    try:
        yield prefix
    finally:
        await delete_prefix_keys(redis_client, prefix)


@pytest.fixture
def redis_wipe(redis_client: Redis, redis_prefix: str) -> Callable[[], Awaitable[None]]:
    """Simulate losing Redis data for this test: delete the prefix's keys (not FLUSHALL)."""

    async def wipe() -> None:
        await delete_prefix_keys(redis_client, redis_prefix)

    return wipe


# =================================================================================================
# PostgreSQL / CockroachDB (fixtures to be added in this section)
# =================================================================================================
