"""Contract suite of the ``QueueInspector`` port (explain, issue 14 item 7), on ``InMemoryQueue``
(FakeClock) and on ``RedisQueueInspector`` (the Redis server's clock), on one server and on a
Redis Cluster (``redis_cluster``).

Each test stages the state through the ``Queue`` port and reads it back through the inspector the
queue adapter offers (``inspector()``), so the inspector's key layout cannot drift from the
queue's. As in ``test_queue_contract.py``, the fake clock starts at the real time and ``advance``
both sleeps and moves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from redis.asyncio import Redis, RedisCluster

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.redis import KeyLayout, RedisQueue
from dtq.adapters.redis.inspect import RedisQueueInspector
from dtq.application.ports import Lease, Queue, QueueInspector

Advance = Callable[[float], Awaitable[None]]

MARKER_TTL = 30.0


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock(start=datetime.now(UTC))


@pytest.fixture
def memory_queue(fake_clock: FakeClock) -> InMemoryQueue:
    return InMemoryQueue(fake_clock, marker_ttl=MARKER_TTL)


@pytest.fixture
def redis_queue(redis_client: Redis, redis_prefix: str) -> RedisQueue:
    return RedisQueue(redis_client, prefix=redis_prefix, marker_ttl=MARKER_TTL)


@pytest.fixture
def redis_cluster_queue(
    redis_cluster_client: RedisCluster, redis_cluster_prefix: str
) -> RedisQueue:
    return RedisQueue(redis_cluster_client, prefix=redis_cluster_prefix, marker_ttl=MARKER_TTL)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("redis_cluster", marks=pytest.mark.integration),
    ]
)
def queue(request: pytest.FixtureRequest) -> InMemoryQueue | RedisQueue:
    queue: InMemoryQueue | RedisQueue = request.getfixturevalue(f"{request.param}_queue")
    return queue


@pytest.fixture
def inspector(queue: InMemoryQueue | RedisQueue) -> QueueInspector:
    return queue.inspector()


@pytest.fixture
def advance(fake_clock: FakeClock) -> Advance:
    async def advance(seconds: float) -> None:
        await asyncio.sleep(seconds)
        fake_clock.advance(seconds)

    return advance


def near(expected: float, tolerance: float = 0.5) -> object:
    return pytest.approx(expected, abs=tolerance)


async def test_an_unknown_task_has_an_empty_snapshot(inspector: QueueInspector) -> None:
    snap = await inspector.inspect(uuid4(), "default")

    assert (snap.marker_ttl, snap.lease, snap.lease_ttl, snap.scheduled_at) == (None,) * 4
    assert (snap.ready_depth, snap.ready_position, snap.searched) == (0, None, 0)
    assert abs(snap.server_time - datetime.now(UTC)) < timedelta(seconds=5)


async def test_an_enqueued_task_shows_its_marker_depth_and_position(
    queue: Queue, inspector: QueueInspector
) -> None:
    ids = [uuid4() for _ in range(3)]
    await queue.enqueue_many([(task_id, "default") for task_id in ids])

    snaps = [await inspector.inspect(task_id, "default") for task_id in ids]

    assert [s.ready_position for s in snaps] == [0, 1, 2]  # 0: the next one popped
    assert {s.ready_depth for s in snaps} == {3}
    assert all(s.marker_ttl == near(MARKER_TTL) for s in snaps)
    assert (await inspector.inspect(ids[0], "other")).ready_position is None


async def test_a_popped_task_keeps_its_marker_and_leaves_the_list(
    queue: Queue, inspector: QueueInspector, advance: Advance
) -> None:
    task_id = uuid4()
    await queue.enqueue_many([(task_id, "default")])
    assert await queue.pop_many(["default"], 0, 1) == [task_id]
    await advance(0.2)

    snap = await inspector.inspect(task_id, "default")

    assert (snap.ready_depth, snap.ready_position) == (0, None)
    assert snap.marker_ttl == near(MARKER_TTL - 0.2, 0.15)


async def test_a_lease_is_shown_with_its_holder_and_ttl(
    queue: Queue, inspector: QueueInspector
) -> None:
    task_id, run_id = uuid4(), uuid4()
    lease = Lease(task_id=task_id, worker_id="w1", run_id=run_id, deadline_ms=1_700_000_000_000)
    await queue.set_leases([lease], ttl=20)

    snap = await inspector.inspect(task_id, "default")

    assert snap.lease == lease
    assert snap.lease_ttl == near(20)
    assert snap.marker_ttl is None


async def test_a_scheduled_entry_shows_its_due_time_under_its_priority(
    queue: Queue, inspector: QueueInspector
) -> None:
    task_id = uuid4()
    due = datetime.now(UTC).replace(microsecond=123_000) + timedelta(minutes=5)
    await queue.schedule(task_id, "high", due)

    assert (await inspector.inspect(task_id, "high")).scheduled_at == due
    assert (await inspector.inspect(task_id, "default")).scheduled_at is None


@pytest.mark.integration
async def test_past_the_scan_limit_the_place_comes_from_the_lists_books(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    inspector = RedisQueueInspector(redis_client, prefix=redis_prefix, scan_limit=2)
    ids = [uuid4() for _ in range(4)]
    await queue.enqueue_many([(task_id, "default") for task_id in ids])
    await queue.pop_many(["default"], 0, 1)  # ids[0] leaves: the books count the pop too

    oldest, newest, popped = (
        await inspector.inspect(ids[1], "default"),
        await inspector.inspect(ids[3], "default"),
        await inspector.inspect(ids[0], "default"),
    )

    assert (oldest.ready_position, oldest.searched, oldest.ready_depth) == (0, 3, 3)
    assert (newest.ready_position, newest.searched) == (2, 3)  # past LPOS's MAXLEN 2
    assert (popped.ready_position, popped.searched) == (None, 3)  # known to be on no list


@pytest.mark.integration
async def test_an_id_without_books_is_searched_down_to_the_scan_limit(
    redis_client: Redis, redis_prefix: str
) -> None:
    inspector = RedisQueueInspector(redis_client, prefix=redis_prefix, scan_limit=2)
    ready = KeyLayout(redis_prefix).ready("default")
    old = [uuid4() for _ in range(3)]  # pushed by a version before the books: a bare LPUSH
    await redis_client.lpush(ready, *(str(task_id) for task_id in old))

    first, last = (
        await inspector.inspect(old[0], "default"),
        await inspector.inspect(old[2], "default"),
    )

    assert (first.ready_position, first.searched, first.ready_depth) == (0, 2, 3)
    assert (last.ready_position, last.searched) == (None, 2)  # position unknown beyond 2


async def test_memory_place_is_exact_at_any_depth(memory_queue: InMemoryQueue) -> None:
    ids = [uuid4() for _ in range(3)]
    await memory_queue.enqueue_many([(task_id, "default") for task_id in ids])

    newest = await memory_queue.inspect(ids[2], "default")

    assert (newest.ready_position, newest.searched, newest.ready_depth) == (2, 3, 3)


async def test_a_routed_task_is_found_on_the_routed_list_of_its_kind(
    queue: Queue, inspector: QueueInspector
) -> None:
    """Kind-aware routing (issue 15 item 2): explain reads the list the task is in."""
    on_tier, routed = uuid4(), [uuid4() for _ in range(2)]
    await queue.enqueue_many([(on_tier, "default")])
    await queue.route([(task_id, "default", "b") for task_id in routed])

    snap = await inspector.inspect(routed[1], "default", "b")
    assert (snap.routed, snap.ready_depth, snap.ready_position) == (True, 2, 1)
    assert snap.marker_ttl == near(MARKER_TTL)

    tier = await inspector.inspect(on_tier, "default", "b")  # on the tier, not routed
    assert (tier.routed, tier.ready_depth, tier.ready_position) == (False, 1, 0)
    without_kind = await inspector.inspect(routed[0], "default")
    assert (without_kind.routed, without_kind.ready_position) == (False, None)
