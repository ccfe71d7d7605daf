"""Behaviour specific to ``InMemoryQueue``: concurrency, clock-driven expiry, test helpers.

The port's contract itself is tested once for every adapter in
``tests/integration/test_queue_contract.py``.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.ports import Lease, LeaseState
from tests.single import enqueue_one, pop_one
from tests.unit.conftest import POLICY, memory_container


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def queue(clock: FakeClock) -> InMemoryQueue:
    return InMemoryQueue(clock, marker_ttl=60.0)


def new_id() -> UUID:
    return uuid.uuid4()


# --- concurrency ------------------------------------------------------------------------------


async def test_many_concurrent_poppers_receive_each_id_exactly_once(queue: InMemoryQueue) -> None:
    ids = [new_id() for _ in range(500)]
    received: list[UUID] = []
    tier_sets = [["high", "default"], ["default"], ["high"], ["default", "high"]]

    async def popper(tiers: list[str]) -> None:
        while (task_id := await pop_one(queue, tiers, 0.2)) is not None:
            received.append(task_id)
            await asyncio.sleep(0)

    poppers = [asyncio.create_task(popper(tier_sets[n % len(tier_sets)])) for n in range(50)]
    await asyncio.sleep(0)  # every popper is now blocked
    rng = random.Random(7)
    for task_id in ids:
        assert await enqueue_one(queue, task_id, rng.choice(["high", "default"])) is True
        if rng.random() < 0.3:
            await asyncio.sleep(0)
    await asyncio.gather(*poppers)

    assert len(received) == len(ids)
    assert set(received) == set(ids)
    assert queue.ready_ids("high") == queue.ready_ids("default") == []


async def test_blocked_poppers_are_served_longest_waiting_first(queue: InMemoryQueue) -> None:
    first = asyncio.create_task(pop_one(queue, ["default"], 5.0))
    await asyncio.sleep(0)
    second = asyncio.create_task(pop_one(queue, ["default"], 5.0))
    await asyncio.sleep(0)
    a, b = new_id(), new_id()

    await enqueue_one(queue, a, "default")
    await enqueue_one(queue, b, "default")

    assert await first == a
    assert await second == b


async def test_cancelled_popper_gives_back_an_id_it_was_handed(queue: InMemoryQueue) -> None:
    popper = asyncio.create_task(pop_one(queue, ["default"], 5.0))
    await asyncio.sleep(0)
    task_id = new_id()

    await enqueue_one(queue, task_id, "default")  # handed to the blocked popper...
    popper.cancel()  # ...which is cancelled before it could resume

    with pytest.raises(asyncio.CancelledError):
        await popper
    assert queue.ready_ids("default") == [task_id]
    assert await pop_one(queue, ["default"], 0) == task_id


async def test_cancelled_popper_leaves_no_waiter_behind(queue: InMemoryQueue) -> None:
    popper = asyncio.create_task(pop_one(queue, ["default", "high"], 5.0))
    await asyncio.sleep(0)
    popper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await popper

    task_id = new_id()
    await enqueue_one(queue, task_id, "high")
    assert queue.ready_ids("high") == [task_id]


async def test_pop_listing_a_tier_twice_is_served_once(queue: InMemoryQueue) -> None:
    popper = asyncio.create_task(pop_one(queue, ["default", "default"], 5.0))
    await asyncio.sleep(0)
    a, b = new_id(), new_id()
    await enqueue_one(queue, a, "default")
    await enqueue_one(queue, b, "default")

    assert await popper == a
    assert queue.ready_ids("default") == [b]


async def test_pop_refuses_a_bare_string(queue: InMemoryQueue) -> None:
    with pytest.raises(ValueError, match="priorities"):
        await pop_one(queue, "default", 0)


@given(pushes=st.lists(st.sampled_from(["a", "b", "c"]), max_size=30))
def test_pop_order_is_tier_order_then_fifo(pushes: list[str]) -> None:
    async def scenario() -> None:
        queue = InMemoryQueue(FakeClock())
        pushed = [(tier, new_id()) for tier in pushes]
        for tier, task_id in pushed:
            await enqueue_one(queue, task_id, tier)
        popped = [await pop_one(queue, ["a", "b", "c"], 0) for _ in pushed]
        expected = [task_id for tier in "abc" for t, task_id in pushed if t == tier]
        assert popped == expected
        assert await pop_one(queue, ["a", "b", "c"], 0) is None

    asyncio.run(scenario())


# --- expiry by the clock ----------------------------------------------------------------------


async def test_marker_expires_exactly_when_its_ttl_has_elapsed(
    queue: InMemoryQueue, clock: FakeClock
) -> None:
    task_id = new_id()
    await enqueue_one(queue, task_id, "default")

    clock.advance(59.999)
    assert queue.has_marker(task_id) is True
    clock.advance(0.001)
    assert queue.has_marker(task_id) is False
    assert await enqueue_one(queue, task_id, "default") is True
    assert queue.ready_ids("default") == [task_id, task_id]  # the stale entry is still listed


async def test_lease_expires_by_the_clock_and_extension_restarts_the_ttl(
    queue: InMemoryQueue, clock: FakeClock
) -> None:
    lease = Lease(task_id=new_id(), worker_id="w", run_id=new_id(), deadline_ms=1)
    await queue.set_leases([lease], 10.0)
    clock.advance(9.0)
    assert await queue.extend_leases([lease], 10.0) == [LeaseState.EXTENDED]

    clock.advance(9.999)
    assert await queue.leases_present([lease.task_id]) == {lease.task_id}
    clock.advance(0.001)
    assert queue.get_lease(lease.task_id) is None
    assert await queue.extend_leases([lease], 10.0) == [LeaseState.MISSING]


async def test_promote_due_uses_the_clock(queue: InMemoryQueue, clock: FakeClock) -> None:
    task_id = new_id()
    await queue.schedule(task_id, "default", clock.now() + timedelta(seconds=10))

    assert await queue.promote_due(10) == 0
    clock.advance(10)
    assert await queue.promote_due(10) == 1  # due exactly now counts
    assert queue.ready_ids("default") == [task_id]


async def test_promote_due_drops_a_second_entry_of_the_same_task(
    queue: InMemoryQueue, clock: FakeClock
) -> None:
    task_id = new_id()
    await queue.schedule(task_id, "high", clock.now())
    await queue.schedule(task_id, "low", clock.now())

    assert await queue.promote_due(10) == 1
    assert queue.ready_ids("high") == [task_id]
    assert queue.ready_ids("low") == []
    assert queue.scheduled_ids() == []


def test_marker_ttl_must_be_positive(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="ttl"):
        InMemoryQueue(clock, marker_ttl=0)


async def test_extend_lease_refuses_a_non_positive_ttl(queue: InMemoryQueue) -> None:
    lease = Lease(task_id=new_id(), worker_id="w", run_id=new_id(), deadline_ms=1)
    await queue.set_leases([lease], 10.0)
    with pytest.raises(ValueError, match="ttl"):
        await queue.extend_leases([lease], -1.0)


# --- test helpers -----------------------------------------------------------------------------


async def test_ready_ids_lists_a_tier_in_pop_order(queue: InMemoryQueue) -> None:
    ids = [new_id() for _ in range(3)]
    for task_id in ids:
        await enqueue_one(queue, task_id, "default")

    assert queue.ready_ids("default") == ids
    assert queue.ready_ids("unknown") == []


async def test_scheduled_ids_lists_due_and_future_entries_soonest_first(
    queue: InMemoryQueue, clock: FakeClock
) -> None:
    later, sooner = new_id(), new_id()
    await queue.schedule(later, "default", clock.now() + timedelta(hours=1))
    await queue.schedule(sooner, "default", clock.now() - timedelta(hours=1))

    assert queue.scheduled_ids() == [sooner, later]


async def test_flush_drops_everything_but_blocked_poppers_keep_waiting(
    queue: InMemoryQueue, clock: FakeClock
) -> None:
    queued, leased = new_id(), new_id()
    await enqueue_one(queue, queued, "default")
    await queue.set_leases([Lease(leased, "w", new_id(), 1)], 10.0)
    await queue.schedule(new_id(), "default", clock.now())
    popper = asyncio.create_task(pop_one(queue, ["other"], 5.0))
    await asyncio.sleep(0)

    queue.flush()

    assert queue.ready_ids("default") == []
    assert queue.scheduled_ids() == []
    assert queue.has_marker(queued) is False
    assert queue.get_lease(leased) is None
    late = new_id()
    await enqueue_one(queue, late, "other")
    assert await popper == late


# --- a delivery stranded between pop and claim (issue 12 bug 4) -------------------------------


async def test_a_delivery_popped_by_a_worker_that_died_is_pushed_again_within_seconds() -> None:
    # The production wiring with default settings: a worker pops a task and dies before its
    # claim; the marker it never released must lapse within seconds, not minutes.
    clock = FakeClock()
    container = memory_container(clock, POLICY)
    submit, reconcile, queue = container.submit(), container.reconcile(), container.queue()
    assert isinstance(queue, InMemoryQueue)
    result = await submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "echo"),)))
    task_id = result.task_ids["a"]
    assert await pop_one(queue, ["default"], 0) == task_id  # ...and the worker is gone

    assert await reconcile.enqueue_due() == 0  # the marker still holds the delivery
    clock.advance(15.001)
    assert await reconcile.enqueue_due() == 1
    assert queue.ready_ids("default") == [task_id]
