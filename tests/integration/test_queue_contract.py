"""Contract suite of the ``Queue`` port (spec §5), run against every adapter.

The same test bodies run on ``InMemoryQueue`` (driven by a ``FakeClock``), on ``RedisQueue`` over
one Redis server, and on ``RedisQueue`` over a local three-master Redis Cluster
(``redis_cluster``, issue 17 item 6); TTLs and due times on the Redis server's clock. To serve
all of them, the fake clock starts at the real current time and the ``advance`` fixture sleeps
for real *and* moves the fake clock by the same amount; TTLs in these tests are therefore short
(a few tenths of a second).

Redis-only checks (key layout, socket timeouts, error wrapping, helpers) are in
``test_redis_queue.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol
from uuid import UUID

import pytest
from redis.asyncio import Redis, RedisCluster

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.redis import RedisQueue
from dtq.application.ports import Lease, LeaseState, Queue
from tests.single import carried_snapshot, enqueue_one, pop_one

Advance = Callable[[float], Awaitable[None]]
Flush = Callable[[], Awaitable[None]]

SHORT_TTL = 0.3  # seconds; for the tests that watch a TTL run out


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def marker_ttl() -> float:
    """Pending-marker TTL of the queue under test; override with ``parametrize``."""
    return 30.0


@pytest.fixture
def fake_clock() -> FakeClock:
    """Starts at the real time, so due times agree with the Redis server's clock."""
    return FakeClock(start=datetime.now(UTC))


@pytest.fixture
def memory_queue(fake_clock: FakeClock, marker_ttl: float) -> InMemoryQueue:
    return InMemoryQueue(fake_clock, marker_ttl=marker_ttl)


@pytest.fixture
def redis_queue(redis_client: Redis, redis_prefix: str, marker_ttl: float) -> RedisQueue:
    return RedisQueue(redis_client, prefix=redis_prefix, marker_ttl=marker_ttl)


@pytest.fixture
def redis_cluster_queue(
    redis_cluster_client: RedisCluster,
    redis_cluster_prefix: str,
    marker_ttl: float,
) -> RedisQueue:
    return RedisQueue(redis_cluster_client, prefix=redis_cluster_prefix, marker_ttl=marker_ttl)


@pytest.fixture
def redis_cluster_flush(redis_cluster_wipe: Flush) -> Flush:
    return redis_cluster_wipe


@pytest.fixture
def memory_flush(memory_queue: InMemoryQueue) -> Flush:
    async def flush() -> None:
        memory_queue.flush()

    return flush


@pytest.fixture
def redis_flush(redis_wipe: Flush) -> Flush:
    return redis_wipe


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("redis_cluster", marks=pytest.mark.integration),
    ]
)
def queue(request: pytest.FixtureRequest) -> Queue:
    queue: Queue = request.getfixturevalue(f"{request.param}_queue")
    return queue


@pytest.fixture
def flush(request: pytest.FixtureRequest, queue: Queue) -> Flush:
    """Lose every marker, lease, list and scheduled entry of the queue under test."""
    flush: Flush = request.getfixturevalue(f"{request.node.callspec.params['queue']}_flush")
    return flush


class QueuePeek(Protocol):
    """The reads of the queue's state that no service needs (the fakes' inspection helpers)."""

    async def has_marker(self, task_id: UUID) -> bool: ...

    async def get_lease(self, task_id: UUID) -> Lease | None: ...


class MemoryPeek:
    """``QueuePeek`` over ``InMemoryQueue``'s plain inspection methods."""

    def __init__(self, queue: InMemoryQueue) -> None:
        self._queue = queue

    async def has_marker(self, task_id: UUID) -> bool:
        return self._queue.has_marker(task_id)

    async def get_lease(self, task_id: UUID) -> Lease | None:
        return self._queue.get_lease(task_id)


@pytest.fixture
def memory_peek(memory_queue: InMemoryQueue) -> QueuePeek:
    return MemoryPeek(memory_queue)


@pytest.fixture
def peek(request: pytest.FixtureRequest, queue: Queue) -> QueuePeek:
    """Inspection of the queue under test: markers and lease hashes."""
    peek: QueuePeek = request.getfixturevalue(f"{request.node.callspec.params['queue']}_peek")
    return peek


@pytest.fixture
def advance(fake_clock: FakeClock) -> Advance:
    """Let ``seconds`` pass on both clocks: real sleep (Redis) and fake advance (memory)."""

    async def advance(seconds: float) -> None:
        await asyncio.sleep(seconds)
        fake_clock.advance(seconds)

    return advance


@pytest.fixture
def now(fake_clock: FakeClock) -> Callable[[], datetime]:
    """The queue's current time (the fake clock, kept in step with real time)."""
    return fake_clock.now


def new_id() -> UUID:
    return uuid.uuid4()


def lease_for(task_id: UUID, *, run_id: UUID | None = None, deadline_ms: int = 1_000) -> Lease:
    return Lease(
        task_id=task_id, worker_id="w-1", run_id=run_id or new_id(), deadline_ms=deadline_ms
    )


# --- pending marker + enqueue -----------------------------------------------------------------


async def test_enqueue_sets_marker_and_pushes_once(queue: Queue, peek: QueuePeek) -> None:
    task_id = new_id()

    assert await enqueue_one(queue, task_id, "default") is True
    assert await peek.has_marker(task_id) is True
    assert await enqueue_one(queue, task_id, "default") is False

    assert await pop_one(queue, ["default"], 0) == task_id
    assert await pop_one(queue, ["default"], 0) is None


async def test_enqueue_refused_while_marker_lives_even_on_another_tier(queue: Queue) -> None:
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")

    assert await enqueue_one(queue, task_id, "high") is False
    assert await pop_one(queue, ["high"], 0) is None


async def test_release_marker_allows_enqueue_again(queue: Queue, peek: QueuePeek) -> None:
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")
    assert await pop_one(queue, ["default"], 0) == task_id

    await queue.release_markers([task_id])

    assert await peek.has_marker(task_id) is False
    assert await enqueue_one(queue, task_id, "default") is True
    assert await pop_one(queue, ["default"], 0) == task_id


async def test_release_marker_is_idempotent(queue: Queue, peek: QueuePeek) -> None:
    task_id = new_id()
    await queue.release_markers([task_id])
    await enqueue_one(queue, task_id, "default")
    await queue.release_markers([task_id])
    await queue.release_markers([task_id])
    assert await peek.has_marker(task_id) is False


async def test_enqueue_many_pushes_each_id_and_counts(queue: Queue, peek: QueuePeek) -> None:
    low, high1, high2 = new_id(), new_id(), new_id()

    assert await queue.enqueue_many([(high1, "high"), (low, "low"), (high2, "high")]) == 3

    for task_id in (low, high1, high2):
        assert await peek.has_marker(task_id) is True
    assert await pop_one(queue, ["high", "low"], 0) == high1
    assert await pop_one(queue, ["high", "low"], 0) == high2
    assert await pop_one(queue, ["high", "low"], 0) == low
    assert await pop_one(queue, ["high", "low"], 0) is None


async def test_enqueue_many_skips_ids_whose_marker_lives(queue: Queue) -> None:
    in_flight, fresh = new_id(), new_id()
    await enqueue_one(queue, in_flight, "default")
    assert await pop_one(queue, ["default"], 0) == in_flight  # popped, marker still held

    # The live marker blocks its id; a repeat within the batch finds the marker set just before.
    items = [(in_flight, "default"), (fresh, "default"), (fresh, "high")]
    assert await queue.enqueue_many(items) == 1

    assert await pop_one(queue, ["high", "default"], 0) == fresh
    assert await pop_one(queue, ["high", "default"], 0) is None


async def test_enqueue_many_of_nothing_pushes_nothing(queue: Queue) -> None:
    assert await queue.enqueue_many([]) == 0
    assert await pop_one(queue, ["default"], 0) is None


async def test_enqueue_unlisted_does_not_push_an_id_still_waiting(
    queue: Queue, peek: QueuePeek
) -> None:
    taken, waiting, lost = new_id(), new_id(), new_id()
    await queue.enqueue_many([(taken, "default"), (waiting, "default")])
    assert await pop_one(queue, ["default"], 0) == taken  # oldest first: `waiting` stays listed
    await queue.release_markers([taken, waiting])  # both markers gone (e.g. expired)

    items = [(waiting, "default", "k"), (lost, "default", "k"), (taken, "default", "k")]
    assert await queue.enqueue_unlisted(items) == 2  # `lost` and `taken` are pushed

    for task_id in (waiting, lost, taken):
        assert await peek.has_marker(task_id) is True  # the waiting id got its marker back
    assert await queue.pop_many(["default"], 0, 10) == [waiting, lost, taken]
    assert await queue.enqueue_unlisted([]) == 0


async def test_enqueue_unlisted_finds_an_id_at_any_depth_of_a_long_list(
    queue: Queue, peek: QueuePeek
) -> None:
    backlog = [new_id() for _ in range(3_000)]  # backlog[0] is the oldest entry
    await queue.enqueue_many([(task_id, "default") for task_id in backlog])
    taken = await queue.pop_many(["default"], 0, 1_000)  # the oldest thousand leave the list
    await queue.release_markers(backlog)  # every marker expired (or released) meanwhile
    shallow, deep, newest = backlog[1_000], backlog[2_400], backlog[-1]

    items = [(task_id, "default", "k") for task_id in (taken[0], shallow, deep, newest, taken[-1])]
    assert await queue.enqueue_unlisted(items) == 2  # only the two popped ids, once each

    for task_id in (shallow, deep, newest, taken[0]):
        assert await peek.has_marker(task_id) is True
    popped = await queue.pop_many(["default"], 0, 3_000)
    assert popped == [*backlog[1_000:], taken[0], taken[-1]]  # no id listed twice


async def test_enqueue_unlisted_sees_an_id_taken_by_a_blocking_pop_as_unlisted(
    queue: Queue,
) -> None:
    task_id = new_id()
    popper = asyncio.create_task(queue.pop_many(["default"], 2.0, 1))  # blocks: nothing waits
    await asyncio.sleep(0.1)
    await enqueue_one(queue, task_id, "default")
    assert await asyncio.wait_for(popper, 3.0) == [task_id]
    await queue.release_markers([task_id])  # its delivery ended without a claim

    assert await queue.enqueue_unlisted([(task_id, "default", "k")]) == 1
    assert await pop_one(queue, ["default"], 0) == task_id


async def test_enqueue_unlisted_tells_each_list_apart(queue: Queue) -> None:
    routed, popped_from_routed = new_id(), new_id()
    await queue.enqueue_many([(routed, "high")])  # a ready list of another priority
    await queue.route([(routed, "default", "b"), (popped_from_routed, "default", "b")])
    assert await queue.pop_many(["default"], 0, 1, kinds={"b"}) == [routed]
    await queue.release_markers([routed, popped_from_routed])

    items = [(routed, "default", "b"), (popped_from_routed, "default", "b")]
    assert await queue.enqueue_unlisted(items) == 1  # `routed` waits on neither of its lists

    assert await queue.pop_many(["default"], 0, 10) == [routed]
    assert await queue.pop_many(["default"], 0, 10, kinds={"b"}) == [popped_from_routed]


async def test_enqueue_unlisted_respects_a_live_marker(queue: Queue) -> None:
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")
    await pop_one(queue, ["default"], 0)  # popped, marker still held: in flight
    assert await queue.enqueue_unlisted([(task_id, "default", "k")]) == 0
    assert await pop_one(queue, ["default"], 0) is None


async def test_release_markers_frees_each_listed_id_only(queue: Queue, peek: QueuePeek) -> None:
    first, second, kept, never = new_id(), new_id(), new_id(), new_id()
    await queue.enqueue_many([(first, "default"), (second, "default"), (kept, "default")])

    await queue.release_markers([first, second, never, first])

    assert await peek.has_marker(first) is False
    assert await peek.has_marker(second) is False
    assert await peek.has_marker(kept) is True
    assert await queue.enqueue_many([(first, "default"), (kept, "default")]) == 1
    await queue.release_markers([])  # idempotent, and nothing to do
    await queue.release_markers([first, second])
    assert await peek.has_marker(first) is False


@pytest.mark.parametrize("marker_ttl", [SHORT_TTL])
async def test_leaked_marker_stalls_enqueue_until_its_ttl(
    queue: Queue, peek: QueuePeek, advance: Advance, marker_ttl: float
) -> None:
    # Given a delivery whose worker died between pop and claim: the marker is never released.
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")
    assert await pop_one(queue, ["default"], 0) == task_id

    # Then the task cannot be enqueued again while the marker lives...
    await advance(marker_ttl / 2)
    assert await enqueue_one(queue, task_id, "default") is False

    # ...and can once the TTL has run out.
    await advance(marker_ttl / 2 + 0.1)
    assert await peek.has_marker(task_id) is False
    assert await enqueue_one(queue, task_id, "default") is True
    assert await pop_one(queue, ["default"], 0) == task_id


# --- pop --------------------------------------------------------------------------------------


async def test_pop_is_fifo_within_a_tier(queue: Queue) -> None:
    ids = [new_id() for _ in range(5)]
    for task_id in ids:
        await enqueue_one(queue, task_id, "default")

    popped = [await pop_one(queue, ["default"], 0) for _ in ids]

    assert popped == ids


async def test_pop_tries_tiers_in_the_given_order(queue: Queue) -> None:
    low1, high1, low2, high2 = (new_id() for _ in range(4))
    for task_id, tier in [(low1, "low"), (high1, "high"), (low2, "low"), (high2, "high")]:
        await enqueue_one(queue, task_id, tier)

    assert await pop_one(queue, ["high", "low"], 0) == high1
    assert await pop_one(queue, ["low", "high"], 0) == low1
    assert await pop_one(queue, ["high", "low"], 0) == high2
    assert await pop_one(queue, ["high", "low"], 0) == low2
    assert await pop_one(queue, ["high", "low"], 0) is None


async def test_pop_ignores_tiers_not_asked_for(queue: Queue) -> None:
    await enqueue_one(queue, new_id(), "other")
    assert await pop_one(queue, ["default"], 0) is None


async def test_pop_without_timeout_returns_none_at_once_on_empty(queue: Queue) -> None:
    started = time.monotonic()
    assert await pop_one(queue, ["default", "low"], 0) is None
    assert time.monotonic() - started < 1.0  # a blocking pop with no timeout never returns


async def test_pop_with_timeout_returns_none_after_waiting(queue: Queue) -> None:
    started = time.monotonic()
    assert await pop_one(queue, ["default"], 0.2) is None
    assert 0.15 <= time.monotonic() - started < 1.0


async def test_blocking_pop_wakes_when_another_coroutine_enqueues(queue: Queue) -> None:
    task_id = new_id()
    popper = asyncio.create_task(pop_one(queue, ["high", "default"], 5.0))
    await asyncio.sleep(0.05)
    assert not popper.done()

    started = time.monotonic()
    await enqueue_one(queue, task_id, "default")

    assert await asyncio.wait_for(popper, 2.0) == task_id
    assert time.monotonic() - started < 1.0


async def test_pop_refuses_an_empty_tier_list(queue: Queue) -> None:
    with pytest.raises(ValueError, match="priorities"):
        await pop_one(queue, [], 0)


async def test_pop_many_is_fifo_within_a_tier_and_respects_max_count(queue: Queue) -> None:
    ids = [new_id() for _ in range(5)]
    await queue.enqueue_many([(task_id, "default") for task_id in ids])

    assert await queue.pop_many(["default"], 0, 3) == ids[:3]
    assert await queue.pop_many(["default"], 0, 1) == ids[3:4]
    assert await queue.pop_many(["default"], 0, 10) == ids[4:]
    assert await queue.pop_many(["default"], 0, 10) == []


async def test_pop_many_takes_tiers_in_the_given_order(queue: Queue) -> None:
    low1, high1, low2, high2, mid = (new_id() for _ in range(5))
    await queue.enqueue_many(
        [(low1, "low"), (high1, "high"), (low2, "low"), (high2, "high"), (mid, "mid")]
    )

    # The first tier is emptied before the next one is touched, oldest first within each.
    assert await queue.pop_many(["high", "mid", "low"], 0, 4) == [high1, high2, mid, low1]
    assert await queue.pop_many(["low", "high"], 0, 4) == [low2]


async def test_pop_many_ignores_tiers_not_asked_for(queue: Queue) -> None:
    await enqueue_one(queue, new_id(), "other")
    assert await queue.pop_many(["default", "high"], 0, 10) == []


async def test_pop_many_blocks_for_the_first_id_then_takes_what_is_waiting(queue: Queue) -> None:
    ids = [new_id() for _ in range(4)]
    popper = asyncio.create_task(queue.pop_many(["default"], 5.0, 3))
    await asyncio.sleep(0.05)
    assert not popper.done()

    started = time.monotonic()
    assert await queue.enqueue_many([(task_id, "default") for task_id in ids]) == 4

    assert await asyncio.wait_for(popper, 2.0) == ids[:3]
    assert time.monotonic() - started < 1.0
    assert await queue.pop_many(["default"], 0, 3) == ids[3:]


async def test_pop_many_with_timeout_returns_empty_after_waiting(queue: Queue) -> None:
    started = time.monotonic()
    assert await queue.pop_many(["default", "low"], 0.2, 10) == []
    assert 0.15 <= time.monotonic() - started < 1.0


async def test_pop_many_without_timeout_returns_empty_at_once(queue: Queue) -> None:
    started = time.monotonic()
    assert await queue.pop_many(["default"], 0, 10) == []
    assert time.monotonic() - started < 1.0  # a blocking pop with no timeout never returns


async def test_pop_many_refuses_a_bad_count_or_tier_list(queue: Queue) -> None:
    with pytest.raises(ValueError, match="max_count"):
        await queue.pop_many(["default"], 0, 0)
    with pytest.raises(ValueError, match="priorities"):
        await queue.pop_many([], 0, 5)


# --- scheduled set ----------------------------------------------------------------------------


async def test_promote_due_moves_only_due_entries(
    queue: Queue, peek: QueuePeek, now: Callable[[], datetime], advance: Advance
) -> None:
    due, later = new_id(), new_id()
    await queue.schedule(due, "default", now() - timedelta(seconds=1))
    await queue.schedule(later, "default", now() + timedelta(seconds=0.3))

    assert await queue.promote_due(100) == 1
    assert await peek.has_marker(due) is True
    assert await peek.has_marker(later) is False
    assert await pop_one(queue, ["default"], 0) == due
    assert await pop_one(queue, ["default"], 0) is None

    await advance(0.4)
    assert await queue.promote_due(100) == 1
    assert await pop_one(queue, ["default"], 0) == later
    assert await queue.promote_due(100) == 0


async def test_promote_due_drops_an_entry_whose_marker_is_set(
    queue: Queue, now: Callable[[], datetime]
) -> None:
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")  # a delivery is already in flight
    await queue.schedule(task_id, "default", now() - timedelta(seconds=1))

    assert await queue.promote_due(100) == 0

    # The entry was dropped, not kept for later.
    await queue.release_markers([task_id])
    assert await queue.promote_due(100) == 0
    assert await pop_one(queue, ["default"], 0) == task_id
    assert await pop_one(queue, ["default"], 0) is None


async def test_promote_due_respects_limit_and_due_order(
    queue: Queue, now: Callable[[], datetime]
) -> None:
    ids = [new_id() for _ in range(5)]
    base = now() - timedelta(seconds=10)
    for offset, task_id in reversed(list(enumerate(ids))):
        await queue.schedule(task_id, "default", base + timedelta(seconds=offset))

    assert await queue.promote_due(2) == 2
    assert await queue.promote_due(10) == 3
    assert [await pop_one(queue, ["default"], 0) for _ in ids] == ids


async def test_promote_due_pushes_onto_the_entry_priority(
    queue: Queue, now: Callable[[], datetime]
) -> None:
    task_id = new_id()
    await queue.schedule(task_id, "high", now() - timedelta(seconds=1))

    assert await queue.promote_due(10) == 1
    assert await pop_one(queue, ["default"], 0) is None
    assert await pop_one(queue, ["high"], 0) == task_id


async def test_schedule_again_moves_the_due_time(
    queue: Queue, peek: QueuePeek, now: Callable[[], datetime]
) -> None:
    task_id = new_id()
    await queue.schedule(task_id, "default", now() - timedelta(seconds=1))
    await queue.schedule(task_id, "default", now() + timedelta(seconds=60))

    assert await queue.promote_due(10) == 0
    assert await peek.has_marker(task_id) is False


async def test_promote_due_with_no_room_moves_nothing(
    queue: Queue, now: Callable[[], datetime]
) -> None:
    await queue.schedule(new_id(), "default", now() - timedelta(seconds=1))
    assert await queue.promote_due(0) == 0
    assert await queue.promote_due(1) == 1


async def test_schedule_refuses_a_naive_due_time(queue: Queue) -> None:
    with pytest.raises(ValueError, match="timezone"):
        await queue.schedule(new_id(), "default", datetime(2026, 1, 1))


# --- leases -----------------------------------------------------------------------------------


async def test_get_lease_round_trips_fields(queue: Queue, peek: QueuePeek) -> None:
    lease = Lease(
        task_id=new_id(), worker_id="worker-7", run_id=new_id(), deadline_ms=1_767_225_600_123
    )
    await queue.set_leases([lease], 30.0)
    assert await peek.get_lease(lease.task_id) == lease


async def test_get_lease_of_unknown_task_is_none(queue: Queue, peek: QueuePeek) -> None:
    assert await peek.get_lease(new_id()) is None


async def test_set_lease_overwrites_another_runs_lease(queue: Queue, peek: QueuePeek) -> None:
    task_id = new_id()
    await queue.set_leases([lease_for(task_id)], 30.0)
    newer = Lease(task_id=task_id, worker_id="w-2", run_id=new_id(), deadline_ms=5)

    await queue.set_leases([newer], 30.0)

    assert await peek.get_lease(task_id) == newer


async def test_extend_lease_by_its_run_extends_ttl_and_deadline(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    lease = lease_for(new_id(), deadline_ms=1_000)
    await queue.set_leases([lease], SHORT_TTL)
    await advance(0.2)

    renewed = Lease(lease.task_id, lease.worker_id, lease.run_id, deadline_ms=2_000)
    assert await queue.extend_leases([renewed], SHORT_TTL) == [LeaseState.EXTENDED]

    await advance(0.2)  # 0.4 s after set_lease: alive only because it was extended
    assert await peek.get_lease(lease.task_id) == renewed


async def test_extend_lease_by_another_run_is_lost_and_changes_nothing(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    lease = lease_for(new_id())
    await queue.set_leases([lease], SHORT_TTL)
    intruder = Lease(lease.task_id, "w-2", new_id(), deadline_ms=99_999)

    assert await queue.extend_leases([intruder], 30.0) == [LeaseState.LOST]
    assert await peek.get_lease(lease.task_id) == lease

    await advance(SHORT_TTL + 0.1)  # the TTL was not extended either
    assert await peek.get_lease(lease.task_id) is None


async def test_extend_lease_after_expiry_is_missing(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    lease = lease_for(new_id())
    await queue.set_leases([lease], 0.2)
    await advance(0.3)

    assert await queue.extend_leases([lease], 30.0) == [LeaseState.MISSING]
    assert await peek.get_lease(lease.task_id) is None


async def test_extend_lease_never_set_is_missing(queue: Queue) -> None:
    assert await queue.extend_leases([lease_for(new_id())], 30.0) == [LeaseState.MISSING]


async def test_extend_leases_answers_each_lease_in_order_in_one_call(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    ours, theirs = lease_for(new_id(), deadline_ms=1_000), lease_for(new_id())
    await queue.set_leases([ours, theirs], SHORT_TTL)
    await advance(0.2)
    renewed = Lease(ours.task_id, ours.worker_id, ours.run_id, deadline_ms=2_000)
    intruder = Lease(theirs.task_id, "w-2", new_id(), deadline_ms=99_999)
    never = lease_for(new_id())

    states = await queue.extend_leases([never, renewed, intruder], SHORT_TTL)

    assert states == [LeaseState.MISSING, LeaseState.EXTENDED, LeaseState.LOST]
    await advance(0.2)  # 0.4 s after set_leases: only the extended lease is alive
    assert await peek.get_lease(ours.task_id) == renewed
    assert await peek.get_lease(theirs.task_id) is None
    assert await peek.get_lease(never.task_id) is None
    assert await queue.extend_leases([], SHORT_TTL) == []


async def test_recreate_lease_creates_a_missing_lease_with_its_ttl(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    lease = lease_for(new_id(), deadline_ms=4_000)

    assert await queue.recreate_lease(lease, SHORT_TTL) is LeaseState.EXTENDED
    assert await peek.get_lease(lease.task_id) == lease

    await advance(SHORT_TTL + 0.1)
    assert await peek.get_lease(lease.task_id) is None


async def test_recreate_lease_never_overwrites_another_runs_lease(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    theirs = lease_for(new_id())
    await queue.set_leases([theirs], SHORT_TTL)
    mine = Lease(theirs.task_id, "w-2", new_id(), deadline_ms=99_999)

    assert await queue.recreate_lease(mine, 30.0) is LeaseState.LOST
    assert await peek.get_lease(theirs.task_id) == theirs

    await advance(SHORT_TTL + 0.1)  # nor was its TTL moved
    assert await peek.get_lease(theirs.task_id) is None


async def test_recreate_lease_of_our_own_lease_extends_it(
    queue: Queue, peek: QueuePeek, advance: Advance
) -> None:
    lease = lease_for(new_id(), deadline_ms=1_000)
    await queue.set_leases([lease], SHORT_TTL)
    await advance(0.2)
    renewed = Lease(lease.task_id, lease.worker_id, lease.run_id, deadline_ms=2_000)

    assert await queue.recreate_lease(renewed, SHORT_TTL) is LeaseState.EXTENDED
    assert await queue.recreate_lease(renewed, SHORT_TTL) is LeaseState.EXTENDED  # a replay

    await advance(0.2)  # 0.4 s after set_lease: alive only because it was extended
    assert await peek.get_lease(lease.task_id) == renewed


async def test_recreate_lease_refuses_a_non_positive_ttl(queue: Queue) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await queue.recreate_lease(lease_for(new_id()), 0)


async def test_delete_lease_only_by_its_run(queue: Queue, peek: QueuePeek) -> None:
    lease = lease_for(new_id())
    await queue.set_leases([lease], 30.0)

    await queue.delete_leases([(lease.task_id, new_id())])
    assert await peek.get_lease(lease.task_id) == lease

    await queue.delete_leases([(lease.task_id, lease.run_id)])
    assert await peek.get_lease(lease.task_id) is None
    await queue.delete_leases([(lease.task_id, lease.run_id)])  # idempotent


async def test_leases_present_lists_live_leases_only(queue: Queue, advance: Advance) -> None:
    held, expiring, never = new_id(), new_id(), new_id()
    await queue.set_leases([lease_for(held)], 30.0)
    await queue.set_leases([lease_for(expiring)], 0.2)
    await advance(0.3)

    assert await queue.leases_present([held, expiring, never]) == {held}
    assert await queue.leases_present([]) == set()


async def test_set_lease_refuses_a_non_positive_ttl(queue: Queue) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await queue.set_leases([lease_for(new_id())], 0)


async def test_set_leases_creates_or_overwrites_each_lease(queue: Queue, peek: QueuePeek) -> None:
    fresh_task, taken_task = new_id(), new_id()
    await queue.set_leases([lease_for(taken_task)], 30.0)
    fresh = lease_for(fresh_task, deadline_ms=7)
    newer = Lease(task_id=taken_task, worker_id="w-2", run_id=new_id(), deadline_ms=9)

    await queue.set_leases([fresh, newer], 30.0)

    assert await peek.get_lease(fresh_task) == fresh
    assert await peek.get_lease(taken_task) == newer
    assert await queue.leases_present([fresh_task, taken_task]) == {fresh_task, taken_task}


async def test_set_leases_expire_after_their_ttl(queue: Queue, advance: Advance) -> None:
    leases = [lease_for(new_id()) for _ in range(3)]
    await queue.set_leases(leases, SHORT_TTL)
    assert await queue.leases_present([lease.task_id for lease in leases]) == {
        lease.task_id for lease in leases
    }

    await advance(SHORT_TTL + 0.1)

    assert await queue.leases_present([lease.task_id for lease in leases]) == set()


async def test_set_leases_refuses_a_non_positive_ttl(queue: Queue) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await queue.set_leases([lease_for(new_id())], 0)


async def test_delete_leases_deletes_only_the_leases_of_the_named_runs(
    queue: Queue, peek: QueuePeek
) -> None:
    ours, theirs = lease_for(new_id()), lease_for(new_id())
    await queue.set_leases([ours, theirs], 30.0)
    never = new_id()

    await queue.delete_leases(
        [(ours.task_id, ours.run_id), (theirs.task_id, new_id()), (never, new_id())]
    )

    assert await peek.get_lease(ours.task_id) is None
    assert await peek.get_lease(theirs.task_id) == theirs
    await queue.delete_leases([(ours.task_id, ours.run_id)])  # idempotent
    await queue.delete_leases([])
    await queue.delete_leases([(theirs.task_id, theirs.run_id)])
    assert await peek.get_lease(theirs.task_id) is None


# --- losing the queue's data ------------------------------------------------------------------


async def test_flush_loses_markers_leases_lists_and_schedule(
    queue: Queue, peek: QueuePeek, flush: Flush, now: Callable[[], datetime]
) -> None:
    queued, leased, scheduled = new_id(), new_id(), new_id()
    await enqueue_one(queue, queued, "default")
    await queue.set_leases([lease_for(leased)], 30.0)
    await queue.schedule(scheduled, "default", now() - timedelta(seconds=1))

    await flush()

    assert await peek.has_marker(queued) is False
    assert await peek.get_lease(leased) is None
    assert await queue.leases_present([leased]) == set()
    assert await pop_one(queue, ["default"], 0) is None
    assert await queue.promote_due(10) == 0
    assert await enqueue_one(queue, queued, "default") is True  # the reconciler can repair


async def test_ping_succeeds(queue: Queue) -> None:
    await queue.ping()


# --- reconciler safety: queue epoch and server clock (issue 12 bugs 3 and 7) -----------------


async def test_epoch_is_created_once_then_kept_and_ages(
    queue: Queue, flush: Flush, advance: Advance
) -> None:
    await flush()
    first = await queue.epoch("first")
    assert first.created is True and first.age < 1.0
    await advance(0.2)
    again = await queue.epoch("second")
    assert again.created is False
    assert again.id == first.id
    assert 0.15 <= again.age < 5.0


async def test_epoch_is_new_after_the_queue_loses_its_data(queue: Queue, flush: Flush) -> None:
    before = await queue.epoch("before")
    await flush()
    after = await queue.epoch("after")
    assert after.created is True
    assert after.id != before.id and after.age < 1.0


async def test_server_time_is_the_clock_promote_due_reads(
    queue: Queue, now: Callable[[], datetime]
) -> None:
    server = await queue.server_time()
    assert server.tzinfo is not None
    assert abs((server - now()).total_seconds()) < 1.0


# --- kind-aware routing (issue 15 item 2) --------------------------------------------------------
# ``route`` moves an id to the routed list of its (priority, kind) behind a re-armed marker;
# ``pop_many`` with ``kinds`` takes those lists with the tiers (without ``kinds`` it never does),
# in a rotating order within a tier (fairness across kinds); ``enqueue_unlisted`` finds an id
# waiting on its routed list.


async def test_a_routed_id_is_popped_only_by_a_worker_serving_its_kind(
    queue: Queue, peek: QueuePeek
) -> None:
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")
    assert await queue.pop_many(["default"], 0, 4, kinds={"a"}) == [task_id]

    await queue.route([(task_id, "default", "b")])

    assert await peek.has_marker(task_id) is True  # still a pending delivery: it is listed
    assert await queue.pop_many(["default"], 0, 4) == []  # the tier alone never sees it
    assert await queue.pop_many(["default"], 0, 4, kinds={"a"}) == []
    assert await queue.pop_many(["high"], 0, 4, kinds={"b"}) == []  # routed per priority too
    assert await queue.pop_many(["default"], 0, 4, kinds={"a", "b"}) == [task_id]


async def test_route_re_arms_a_released_marker(queue: Queue, peek: QueuePeek) -> None:
    task_id = new_id()
    await queue.route([(task_id, "default", "b")])
    assert await peek.has_marker(task_id) is True
    await queue.route([])  # nothing to do, no error


async def test_a_worker_with_kinds_still_takes_every_kind_from_the_tier(queue: Queue) -> None:
    ids = [new_id() for _ in range(3)]
    await queue.enqueue_many([(task_id, "default") for task_id in ids])
    assert await queue.pop_many(["default"], 0, 10, kinds={"a"}) == ids


async def test_tiers_keep_their_order_with_routed_lists(queue: Queue) -> None:
    low_routed, high_ready, high_routed = new_id(), new_id(), new_id()
    await queue.route([(low_routed, "low", "a"), (high_routed, "high", "a")])
    await enqueue_one(queue, high_ready, "high")

    popped = await queue.pop_many(["high", "low"], 0, 10, kinds={"a"})

    assert set(popped[:2]) == {high_ready, high_routed}  # the whole high tier first
    assert popped[2:] == [low_routed]


async def test_the_lists_of_a_tier_are_taken_in_turn(queue: Queue) -> None:
    """A deep backlog of one kind does not starve another: one-id pops rotate over the tier's
    ready list and routed lists."""
    backlog_a = [new_id() for _ in range(20)]
    lone_b = new_id()
    ready = [new_id() for _ in range(20)]
    await queue.route([(task_id, "default", "a") for task_id in backlog_a])
    await queue.route([(lone_b, "default", "b")])
    await queue.enqueue_many([(task_id, "default") for task_id in ready])

    popped = [(await queue.pop_many(["default"], 0, 1, kinds=["a", "b"]))[0] for _ in range(3)]

    assert lone_b in popped  # within one rotation (3 lists) every non-empty list gave one
    assert set(popped) & set(backlog_a) and set(popped) & set(ready)


async def test_a_blocked_pop_with_kinds_is_woken_by_a_routed_push(queue: Queue) -> None:
    task_id = new_id()
    popper = asyncio.create_task(queue.pop_many(["default"], 2.0, 4, kinds={"b"}))
    await asyncio.sleep(0.1)
    await queue.route([(task_id, "default", "b")])
    assert await asyncio.wait_for(popper, 3.0) == [task_id]


async def test_enqueue_unlisted_finds_an_id_waiting_on_its_routed_list(
    queue: Queue, peek: QueuePeek
) -> None:
    waiting, lost = new_id(), new_id()
    await queue.route([(waiting, "default", "b")])
    await queue.release_markers([waiting])  # its marker expired while no worker served "b"

    items = [(waiting, "default", "b"), (lost, "default", "b")]
    assert await queue.enqueue_unlisted(items) == 1  # only `lost`, onto the tier

    assert await peek.has_marker(waiting) is True  # the waiting id got its marker back
    assert await queue.pop_many(["default"], 0, 10) == [lost]
    assert await queue.pop_many(["default"], 0, 10, kinds={"b"}) == [waiting]


async def test_kinds_must_not_be_a_bare_string(queue: Queue) -> None:
    with pytest.raises(ValueError, match="kinds"):
        await queue.pop_many(["default"], 0, 1, kinds="ab")


async def test_set_leases_releases_the_named_markers_in_the_same_call(
    queue: Queue, peek: QueuePeek
) -> None:
    """A claim's Redis side is one call: its leases written, its popped ids' markers dropped."""
    claimed, refused, kept = new_id(), new_id(), new_id()
    await queue.enqueue_many([(claimed, "default"), (refused, "default"), (kept, "default")])
    lease = lease_for(claimed)

    await queue.set_leases([lease], 30.0, release=[claimed, refused])

    assert await peek.get_lease(claimed) == lease
    assert await peek.has_marker(claimed) is False
    assert await peek.has_marker(refused) is False
    assert await peek.has_marker(kept) is True
    await queue.set_leases([], 30.0, release=[kept])  # markers alone: no lease, no ttl check
    assert await peek.has_marker(kept) is False


# --- carried snapshots (the carried claim, issue 17 item 4) -------------------------------------


async def test_only_a_push_onto_an_empty_list_carries_and_a_pop_hands_it_out_once(
    queue: Queue,
) -> None:
    first, second = carried_snapshot(), carried_snapshot()

    await queue.enqueue_many([(first.task.id, "default")], carried=[first])
    await queue.enqueue_many([(second.task.id, "default")], carried=[second])  # behind one

    popped = await queue.pop_many(["default"], timeout=0, max_count=2)
    assert popped == [first.task.id, second.task.id]
    assert queue.carried(first.task.id) == first
    assert queue.carried(first.task.id) is None  # once
    assert queue.carried(second.task.id) is None  # its list held an id already


async def test_a_batch_carries_its_first_id_onto_an_empty_list_only(
    queue: Queue,
) -> None:
    a, b = carried_snapshot(), carried_snapshot()

    pushed = await queue.enqueue_many(
        [(a.task.id, "default"), (b.task.id, "default")], carried=[a, b]
    )

    assert pushed == 2
    assert await queue.pop_many(["default"], timeout=0, max_count=2) == [a.task.id, b.task.id]
    assert queue.carried(a.task.id) == a
    assert queue.carried(b.task.id) is None
