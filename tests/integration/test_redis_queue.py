"""Checks of ``RedisQueue`` that the ``Queue`` contract does not cover (spec §5 Redis data model):
the key layout under the prefix, BRPOP against the socket timeout, malformed list entries, the
batch scripts' layout and round trips, error wrapping, and the connection helpers
(``connect_redis``, ``check_eviction_policy``). The contract itself is ``test_queue_contract.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from dtq.adapters.redis import RedisQueue, check_eviction_policy, connect_redis, tagged_prefix
from dtq.application.ports import Lease
from dtq.domain.errors import BackendUnavailable
from tests.single import enqueue_one, pop_one

from .conftest import REDIS_URL


def new_id() -> UUID:
    return uuid.uuid4()


def lease_for(task_id: UUID, *, run_id: UUID | None = None, deadline_ms: int = 1_000) -> Lease:
    return Lease(
        task_id=task_id, worker_id="w-1", run_id=run_id or new_id(), deadline_ms=deadline_ms
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.integration
async def test_redis_keys_follow_spec_layout_under_the_prefix(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix, marker_ttl=30.0)
    tag = tagged_prefix(redis_prefix)  # the prefix as the hash tag of every key: "{...}:"
    queued, leased, scheduled = new_id(), new_id(), new_id()
    lease = lease_for(leased, deadline_ms=123)
    await enqueue_one(queue, queued, "high")
    await queue.set_leases([lease], 30.0)
    await queue.schedule(scheduled, "low|tier", datetime(2030, 1, 1, tzinfo=UTC))

    keys = {_text(key) async for key in redis_client.scan_iter(match=f"{tag}*")}
    assert keys == {
        f"{tag}queue:ready:high",
        f"{tag}queue:pushes:ready:high",  # the list's books (issue 17 item 5)
        f"{tag}queue:listed:ready:high",
        f"{tag}queue:pending:{queued}",
        f"{tag}lease:task:{leased}",
        f"{tag}queue:scheduled",
    }
    for task_id in (queued, leased, scheduled):
        anywhere = [_text(k) async for k in redis_client.scan_iter(match=f"*{task_id}*")]
        assert all(key.startswith(tag) for key in anywhere)

    assert await redis_client.lrange(f"{tag}queue:ready:high", 0, -1) == [str(queued).encode()]
    assert 0 < await redis_client.pttl(f"{tag}queue:pending:{queued}") <= 30_000
    assert 0 < await redis_client.pttl(f"{tag}lease:task:{leased}") <= 30_000
    assert await redis_client.hgetall(f"{tag}lease:task:{leased}") == {
        b"worker_id": b"w-1",
        b"run_id": str(lease.run_id).encode(),
        b"deadline_ms": b"123",
    }
    members = await redis_client.zrange(f"{tag}queue:scheduled", 0, -1, withscores=True)
    assert members == [(f"low|tier|{scheduled}".encode(), 1_893_456_000_000.0)]

    # A priority containing "|" survives promotion (the member is split at the last "|").
    await queue.schedule(scheduled, "low|tier", datetime(2020, 1, 1, tzinfo=UTC))
    assert await queue.promote_due(10) == 1
    assert await pop_one(queue, ["low|tier"], 0) == scheduled


@pytest.mark.integration
async def test_redis_pop_waits_longer_than_the_socket_timeout(redis_prefix: str) -> None:
    client: Redis = Redis.from_url(REDIS_URL, socket_timeout=0.4)
    try:
        queue = RedisQueue(client, prefix=redis_prefix)
        started = time.monotonic()
        assert await pop_one(queue, ["default"], 1.0) is None
        assert 0.9 <= time.monotonic() - started < 2.0

        task_id = new_id()
        popper = asyncio.create_task(pop_one(queue, ["default"], 2.0))
        await asyncio.sleep(0.6)  # past the first BRPOP slice
        await enqueue_one(queue, task_id, "default")
        assert await asyncio.wait_for(popper, 2.0) == task_id

        started = time.monotonic()
        assert await queue.pop_many(["default"], 1.0, 8) == []
        assert 0.9 <= time.monotonic() - started < 2.0
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_redis_pop_discards_malformed_entries(redis_client: Redis, redis_prefix: str) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    task_id = new_id()
    await redis_client.lpush(f"{tagged_prefix(redis_prefix)}queue:ready:default", "not-a-uuid")
    await enqueue_one(queue, task_id, "default")

    assert await pop_one(queue, ["default"], 0.5) == task_id


@pytest.mark.integration
async def test_redis_pop_many_discards_malformed_entries(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    first, second = new_id(), new_id()
    ready = f"{tagged_prefix(redis_prefix)}queue:ready:default"
    await redis_client.lpush(ready, "not-a-uuid")
    await enqueue_one(queue, first, "default")
    await redis_client.lpush(ready, "")
    await enqueue_one(queue, second, "default")

    assert await queue.pop_many(["default"], 0, 10) == [first, second]
    assert await redis_client.llen(ready) == 0


@pytest.mark.integration
async def test_redis_batch_writes_follow_the_single_id_layout(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix, marker_ttl=30.0)
    tag = tagged_prefix(redis_prefix)
    queued, leased = new_id(), new_id()
    lease = lease_for(leased, deadline_ms=123)
    await queue.enqueue_many([(queued, "high")])
    await queue.set_leases([lease], 20.0)

    keys = {_text(key) async for key in redis_client.scan_iter(match=f"{tag}*")}
    assert keys == {
        f"{tag}queue:ready:high",
        f"{tag}queue:pushes:ready:high",
        f"{tag}queue:listed:ready:high",
        f"{tag}queue:pending:{queued}",
        f"{tag}lease:task:{leased}",
    }
    assert await redis_client.get(f"{tag}queue:pushes:ready:high") == b"1"
    assert await redis_client.zrange(f"{tag}queue:listed:ready:high", 0, -1, withscores=True) == [
        (str(queued).encode(), 1.0)
    ]
    assert await redis_client.get(f"{tag}queue:pending:{queued}") == b"1"
    assert 20_000 < await redis_client.pttl(f"{tag}queue:pending:{queued}") <= 30_000
    assert 0 < await redis_client.pttl(f"{tag}lease:task:{leased}") <= 20_000
    assert await redis_client.hgetall(f"{tag}lease:task:{leased}") == {
        b"worker_id": b"w-1",
        b"run_id": str(lease.run_id).encode(),
        b"deadline_ms": b"123",
    }


@pytest.mark.integration
async def test_redis_a_waiting_pop_many_takes_a_batch_in_the_call_that_wakes(
    redis_client: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a pop_many blocked waiting (its first non-blocking pass found nothing)...
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    script = queue._pop_now
    calls = 0

    async def counted(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await script(**kwargs)

    monkeypatch.setattr(queue, "_pop_now", counted)
    first, second = new_id(), new_id()
    popper = asyncio.create_task(queue.pop_many(["default"], 5.0, 10))
    await asyncio.sleep(0.05)
    await queue.enqueue_many([(first, "default"), (second, "default")])

    # ...when ids arrive, the blocking call (BLMPOP) brings them all, oldest first: no pop
    # script runs after it (one round trip fewer between a push and the claim).
    assert await asyncio.wait_for(popper, 2.0) == [first, second]
    assert calls == 1


@pytest.mark.integration
async def test_redis_pop_many_keeps_the_popped_id_when_the_follow_up_fails(
    redis_client: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a pop_many blocked in BRPOP (Redis < 7.0, no BLMPOP), whose non-blocking follow-up
    # will fail...
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    queue._blmpop = False
    script = queue._pop_now
    calls = 0

    async def flaky(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RedisConnectionError("lost after BRPOP")
        return await script(**kwargs)

    monkeypatch.setattr(queue, "_pop_now", flaky)
    task_id, other = new_id(), new_id()
    popper = asyncio.create_task(queue.pop_many(["default"], 5.0, 10))
    await asyncio.sleep(0.05)
    await queue.enqueue_many([(task_id, "default"), (other, "default")])

    # ...then the id BRPOP already took is returned rather than lost; the rest stays queued.
    assert await asyncio.wait_for(popper, 2.0) == [task_id]
    assert calls == 2
    ready = f"{tagged_prefix(redis_prefix)}queue:ready:default"
    assert await redis_client.lrange(ready, 0, -1) == [str(other).encode()]


async def test_redis_batch_methods_make_no_round_trip_for_empty_input() -> None:
    client = Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    queue = RedisQueue(client, prefix="dtqtest:down:")
    try:
        assert await queue.enqueue_many([]) == 0
        await queue.release_markers([])
        await queue.set_leases([], 30.0)
        await queue.delete_leases([])
        assert await queue.leases_present([]) == set()
    finally:
        await client.aclose()


async def test_redis_errors_become_backend_unavailable() -> None:
    client = Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    queue = RedisQueue(client, prefix="dtqtest:down:")
    try:
        with pytest.raises(BackendUnavailable) as caught:
            await queue.ping()
        assert caught.value.__cause__ is not None
        with pytest.raises(BackendUnavailable):
            await enqueue_one(queue, new_id(), "default")
        with pytest.raises(BackendUnavailable):
            await pop_one(queue, ["default"], 0.1)
        with pytest.raises(BackendUnavailable):
            await queue.leases_present([new_id()])
        with pytest.raises(BackendUnavailable):
            await queue.enqueue_many([(new_id(), "default")])
        with pytest.raises(BackendUnavailable):
            await queue.release_markers([new_id()])
        with pytest.raises(BackendUnavailable):
            await queue.pop_many(["default"], 0, 5)
        with pytest.raises(BackendUnavailable):
            await queue.pop_many(["default"], 0.1, 5)
        with pytest.raises(BackendUnavailable):
            await queue.set_leases([lease_for(new_id())], 30.0)
        with pytest.raises(BackendUnavailable):
            await queue.delete_leases([(new_id(), new_id())])
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("addr", "host", "port"),
    [
        ("127.0.0.1:6379", "127.0.0.1", 6379),
        ("redis.internal:6380", "redis.internal", 6380),
        ("localhost", "localhost", 6379),
        ("[::1]:6381", "::1", 6381),
        ("redis://cache:6390/2", "cache", 6390),
    ],
)
async def test_connect_redis_parses_addresses(addr: str, host: str, port: int) -> None:
    client = connect_redis(addr)
    assert isinstance(client, Redis)
    try:
        options = client.connection_pool.connection_kwargs
        assert (options["host"], options["port"]) == (host, port)
        assert options.get("decode_responses", False) is False
    finally:
        await client.aclose()


@pytest.mark.parametrize("addr", ["host:notaport", "host:6379/0", ""])
def test_connect_redis_rejects_bad_addresses(addr: str) -> None:
    with pytest.raises(ValueError, match="Redis address"):
        connect_redis(addr)


class _ConfigStub:
    """Stands in for a client in ``check_eviction_policy`` (the shared server is not touched)."""

    def __init__(self, reply: dict[str, str] | Exception) -> None:
        self._reply = reply

    async def config_get(self, pattern: str) -> dict[str, str]:
        if isinstance(self._reply, Exception):
            raise self._reply
        return self._reply


@pytest.mark.parametrize(
    ("reply", "warns"),
    [
        ({"maxmemory-policy": "noeviction"}, False),
        ({"maxmemory-policy": "allkeys-lru"}, True),
        (ResponseError("unknown command 'CONFIG'"), True),
    ],
)
async def test_check_eviction_policy_warns_unless_noeviction(reply: Any, warns: bool) -> None:
    warning = await check_eviction_policy(_ConfigStub(reply))  # type: ignore[arg-type]
    assert (warning is not None) is warns
    if warns:
        assert warning is not None
        assert "maxmemory-policy" in warning


@pytest.mark.integration
async def test_check_eviction_policy_agrees_with_the_server(redis_client: Redis) -> None:
    policy = _text(next(iter((await redis_client.config_get("maxmemory-policy")).values())) or "")
    warning = await check_eviction_policy(redis_client)
    assert (warning is None) is (policy == "noeviction")


# --- the lists' books (issue 17 item 5: a million-task backlog) ----------------------------------


async def _script_commands(
    client: Redis, tag: str, action: Callable[[], Awaitable[Any]]
) -> list[str]:
    """Run ``action`` under MONITOR: the commands scripts ran on this test's keys (the server is
    shared with other tests, so others' commands are filtered out by the key prefix)."""
    sentinel = f"dtq-monitor-end-{uuid.uuid4().hex}"
    seen: list[str] = []
    monitor_client = Redis.from_url(REDIS_URL)
    try:
        async with monitor_client.monitor() as monitor:

            async def watch() -> None:
                while True:
                    info = await monitor.next_command()
                    if sentinel in info["command"]:
                        return
                    if info["client_type"] == "lua" and tag in info["command"]:
                        seen.append(info["command"])

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.05)
            await action()
            await client.echo(sentinel)
            await asyncio.wait_for(watcher, 10.0)
    finally:
        await monitor_client.aclose()
    return seen


@pytest.mark.integration
async def test_redis_enqueue_unlisted_reads_no_list_entries(
    redis_client: Redis, redis_prefix: str
) -> None:
    # Given a 5,000-entry backlog whose markers expired, and ids deep in it and popped from it,
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    tag = tagged_prefix(redis_prefix)
    backlog = [new_id() for _ in range(5_000)]
    await queue.enqueue_many([(task_id, "default") for task_id in backlog])
    popped = await queue.pop_many(["default"], 0, 10)
    await queue.release_markers(backlog)
    items = [(task_id, "default", "k") for task_id in [*backlog[-20:], *popped]]

    # when the reconciler's push runs for them,
    pushed = 0

    async def push() -> None:
        nonlocal pushed
        pushed = await queue.enqueue_unlisted(items)

    commands = await _script_commands(redis_client, tag, push)

    # then only the popped ids are pushed, and the script read no entry of any list: a fixed
    # number of O(log n) commands per id, whatever the lists' length (it used to LRANGE them).
    assert pushed == 10
    names = [command.split(" ", 1)[0].strip('"').upper() for command in commands]
    assert "ZSCORE" in names and not {"LRANGE", "LPOS", "LINDEX"} & set(names)
    assert len(names) <= 8 * len(items) + 10


@pytest.mark.integration
async def test_redis_listed_books_shrink_as_the_list_drains(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    listed = f"{tagged_prefix(redis_prefix)}queue:listed:ready:default"
    await queue.enqueue_many([(new_id(), "default") for _ in range(3_000)])
    assert len(await queue.pop_many(["default"], 0, 3_000)) == 3_000
    assert await redis_client.zcard(listed) == 3_000  # popped ids are pruned by later pushes

    for _ in range(3):  # each push call prunes at most 1,000 + 2 x its ids (bounded work)
        await queue.enqueue_many([(new_id(), "default")])

    assert await redis_client.zcard(listed) == 3  # only the three ids still listed


@pytest.mark.integration
async def test_redis_ids_without_books_or_whose_list_was_deleted_are_pushed_again(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    ready = f"{tagged_prefix(redis_prefix)}queue:ready:default"
    bare, booked = new_id(), new_id()
    await redis_client.lpush(ready, str(bare))  # pushed by a version without the books
    await queue.enqueue_many([(booked, "default")])
    await queue.release_markers([booked])
    items = [(bare, "default", "k"), (booked, "default", "k")]

    assert await queue.enqueue_unlisted(items) == 1  # `bare` once more (a harmless duplicate)
    await queue.release_markers([bare, booked])
    assert await queue.enqueue_unlisted(items) == 0  # now both are on the books

    await redis_client.delete(ready)  # the list lost (by hand): its books no longer vouch
    await queue.release_markers([bare, booked])
    assert await queue.enqueue_unlisted(items) == 2
    assert await queue.pop_many(["default"], 0, 10) == [bare, booked]


async def test_a_refusal_of_the_redis_server_is_reported_in_its_own_words() -> None:
    """``REDIS_ADDR=…/99`` on a server with 16 databases: the health check and the start-up
    policy check said only "ResponseError" and "CONFIG GET refused"."""
    client = connect_redis(REDIS_URL.rsplit("/", 1)[0] + "/99")
    try:
        with pytest.raises(BackendUnavailable, match="ResponseError: DB index is out of range"):
            await RedisQueue(client, prefix="dbcheck", marker_ttl=30.0).ping()
        warning = await check_eviction_policy(client)
    finally:
        await client.aclose()

    assert warning is not None
    assert "DB index is out of range" in warning
