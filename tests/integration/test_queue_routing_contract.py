"""Contract suite of the ``Queue`` port's kind-aware routing (issue 15 item 2).

The same bodies run on ``InMemoryQueue``, on ``RedisQueue`` over one Redis server and over the
local three-master Redis Cluster: the fixtures are those of ``test_queue_contract.py``. What is
pinned: ``route`` moves an id to the routed list of its (priority, kind) behind a re-armed marker;
``pop_many`` with ``kinds`` takes those lists with the tiers (and without ``kinds`` never does);
the lists of one tier are taken in a rotating order (fairness across kinds); a blocked pop is
woken by a routed push; ``enqueue_unlisted`` finds an id waiting on its routed list.
"""

from __future__ import annotations

import asyncio
import uuid
from uuid import UUID

import pytest

from dtq.application.ports import Queue
from tests.integration.test_queue_contract import (  # noqa: F401  (fixtures)
    QueuePeek,
    advance,
    fake_clock,
    flush,
    listed_scan_limit,
    marker_ttl,
    memory_flush,
    memory_peek,
    memory_queue,
    peek,
    queue,
    redis_cluster_flush,
    redis_cluster_queue,
    redis_flush,
    redis_queue,
)
from tests.single import enqueue_one


def new_id() -> UUID:
    return uuid.uuid4()


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

    popped = [
        (await queue.pop_many(["default"], 0, 1, kinds=["a", "b"]))[0] for _ in range(3)
    ]

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
