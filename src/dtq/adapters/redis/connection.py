"""Building the Redis client, checking the server's eviction policy, wrapping driver errors.

No redis-py exception leaves the adapter: ``wrap_errors`` turns driver errors and ``OSError`` into
``BackendUnavailable`` at every call site.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisError, ResponseError

from dtq.domain.errors import BackendUnavailable

DEFAULT_PORT = 6379


@contextmanager
def wrap_errors(operation: str) -> Iterator[None]:
    """Turn driver and socket errors into ``BackendUnavailable``: no redis error escapes."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise BackendUnavailable(f"redis {operation} failed: {type(exc).__name__}") from exc


def as_text(value: bytes | str) -> str:
    """A reply as ``str`` whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else value


def connect_redis(addr: str) -> Redis:
    """Build a client (hiredis parser, bytes responses); it connects on first use.

    Args:
        addr: ``"host:port"`` as in ``REDIS_ADDR`` (spec §8; port defaults to 6379, IPv6 as
            ``"[::1]:6379"``), or a ``redis://`` / ``rediss://`` / ``unix://`` URL.

    Returns:
        A ``redis.asyncio.Redis`` with a 5 s connect timeout, a 10 s socket read timeout
        (``RedisQueue.pop`` keeps each BRPOP under it) and at most 3 retries of a command on
        connection errors (jittered backoff up to 0.5 s), so an outage surfaces as
        ``BackendUnavailable`` within seconds. The caller closes it (``aclose()``).

    Raises:
        ValueError: ``addr`` cannot be parsed.
    """
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_connect_timeout": 5.0,
        "socket_timeout": 10.0,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=3),
    }
    if "://" in addr:
        return Redis.from_url(addr, **options)
    parts = urlsplit(f"redis://{addr}")
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"invalid Redis address {addr!r}") from exc
    if not host or parts.path or parts.query:
        raise ValueError(f"invalid Redis address {addr!r}; expected host:port")
    return Redis(host=host, port=port, **options)


async def check_eviction_policy(client: Redis) -> str | None:
    """Warn unless ``maxmemory-policy`` is ``noeviction`` (DESIGN §5: evicted leases mean reruns).

    Args:
        client: the Redis client the queue uses.

    Returns:
        A warning text when the policy evicts keys or cannot be read (CONFIG disabled, renamed
        or not permitted, as on some managed services); None when it is ``noeviction``.

    Raises:
        BackendUnavailable: Redis is unreachable.
    """
    unreadable = (
        "could not read Redis maxmemory-policy ({reason}); make sure it is 'noeviction', or "
        "evicted leases and markers will cause reruns and stalls"
    )
    try:
        with wrap_errors("config_get"):
            reply = await client.config_get("maxmemory-policy")
    except BackendUnavailable as exc:
        if isinstance(exc.__cause__, ResponseError):  # CONFIG disabled, renamed or not permitted
            return unreadable.format(reason="CONFIG GET refused")
        raise
    # The reply maps name -> value; redis-py decodes CONFIG GET to str even with bytes responses.
    raw_policy: bytes | str | None = next(iter(reply.values()), None)
    if raw_policy is None:
        return unreadable.format(reason="no such setting")
    policy = as_text(raw_policy)
    if policy == "noeviction":
        return None
    return (
        f"Redis maxmemory-policy is {policy!r}, not 'noeviction': under memory pressure Redis "
        "may evict leases (tasks reclaimed and rerun) and queue entries (delayed until reconcile)"
    )
