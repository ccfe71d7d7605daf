"""Group commit of submissions (issue 17 item 3): concurrent submits share transactions, each
keeping its own ids, idempotency and errors; an idle submit is written at once, alone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from uuid import UUID

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import CarriedTask
from dtq.application.submit import SubmitService
from dtq.domain.errors import BackendUnavailable, DuplicateIdempotencyKey, IdempotencyConflict

T = TypeVar("T")


class CountingStore(InMemoryStore):
    """The memory store, counting transactions; ``fail_next`` makes the next one raise."""

    def __init__(self) -> None:
        super().__init__(FakeClock())
        self.transactions = 0
        self.fail_next: list[BaseException] = []

    async def run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        self.transactions += 1
        if self.fail_next:
            raise self.fail_next.pop(0)
        return await super().run(fn)


def one(kind: str = "echo", *, key: str | None = None, payload: Any = None) -> SubmitJob:
    return SubmitJob(
        tasks=(TaskSpec("t", kind, payload),),
        idempotency_key=key,
        request_hash=None if key is None else f"hash-{kind}",
    )


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


@pytest.fixture
def service(store: CountingStore) -> SubmitService:
    return SubmitService(store=store, queue=InMemoryQueue(FakeClock()))


async def stored_jobs(store: InMemoryStore) -> int:
    return len(store._tables.jobs)


async def test_concurrent_submits_share_transactions_and_each_gets_its_own_ids(
    store: CountingStore, service: SubmitService
) -> None:
    results = await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(50)))

    assert len({r.job_id for r in results}) == 50
    assert all(r.created for r in results)
    assert await stored_jobs(store) == 50
    assert store.transactions == 1  # all fifty were waiting when the first lane started


async def test_an_idle_submit_is_written_at_once_alone(
    store: CountingStore, service: SubmitService
) -> None:
    result = await service.submit_job(one())

    assert result.created
    assert store.transactions == 1


async def test_a_conflicting_key_fails_only_its_own_submit(
    store: CountingStore, service: SubmitService
) -> None:
    await service.submit_job(one("a", key="used"))
    store.transactions = 0

    outcomes = await asyncio.gather(
        service.submit_job(one("b")),
        service.submit_job(one("c")),
        service.submit_job(one("other", key="used")),  # same key, another body: 409
        service.submit_job(one("a", key="used")),  # same key and body: the original ids
        service.submit_job(one("d")),
        return_exceptions=True,
    )

    assert isinstance(outcomes[2], IdempotencyConflict)
    replay = outcomes[3]
    assert isinstance(replay, SubmitResult) and not replay.created
    created = [o for i, o in enumerate(outcomes) if i not in (2, 3)]
    assert all(isinstance(o, SubmitResult) and o.created for o in created)
    assert await stored_jobs(store) == 4


async def test_one_key_twice_in_a_group_creates_one_job(
    store: CountingStore, service: SubmitService
) -> None:
    _, second, third = await asyncio.gather(
        service.submit_job(one()),
        service.submit_job(one(key="twice")),
        service.submit_job(one(key="twice")),
    )

    assert second.job_id == third.job_id
    assert sorted([second.created, third.created]) == [False, True]
    assert await stored_jobs(store) == 2
    assert store.transactions == 1 + 3  # the group refused by add_many, then one by one


async def test_a_lost_key_race_in_a_group_is_written_again_one_by_one(
    store: CountingStore, service: SubmitService
) -> None:
    store.fail_next.append(DuplicateIdempotencyKey("raced"))  # the group's transaction
    outcomes = await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(5)))

    assert all(o.created for o in outcomes)
    assert await stored_jobs(store) == 5
    assert store.transactions == 1 + 5  # the refused group, then one each


async def test_a_backend_failure_fails_every_submit_of_the_group(
    store: CountingStore, service: SubmitService
) -> None:
    store.fail_next.append(BackendUnavailable("database down"))
    outcomes = await asyncio.gather(
        *(service.submit_job(one(payload=i)) for i in range(4)), return_exceptions=True
    )

    assert all(isinstance(o, BackendUnavailable) for o in outcomes)
    assert await stored_jobs(store) == 0
    assert store.transactions == 1


async def test_a_job_larger_than_a_group_is_written_alone(store: CountingStore) -> None:
    service = SubmitService(store=store, queue=InMemoryQueue(FakeClock()), group_max_tasks=3)
    big = SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(5)))

    results = await asyncio.gather(service.submit_job(big), service.submit_job(one()))

    assert all(r.created for r in results)
    assert store.transactions == 2


async def test_grouping_off_writes_one_transaction_per_submit(store: CountingStore) -> None:
    service = SubmitService(store=store, queue=InMemoryQueue(FakeClock()), group_max_jobs=1)

    await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(10)))

    assert store.transactions == 10


async def test_a_cancelled_caller_does_not_lose_the_others(
    store: CountingStore, service: SubmitService
) -> None:
    first = asyncio.ensure_future(service.submit_job(one("first")))
    await asyncio.sleep(0)
    doomed = asyncio.ensure_future(service.submit_job(one("doomed")))
    kept = asyncio.ensure_future(service.submit_job(one("kept")))
    await asyncio.sleep(0)
    doomed.cancel()

    assert (await kept).created
    assert (await first).created
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert await stored_jobs(store) == 3  # the cancelled caller's job is written all the same


async def test_submits_queue_their_roots_after_the_group_commits() -> None:
    queue = InMemoryQueue(FakeClock())
    service = SubmitService(store=CountingStore(), queue=queue)

    results = await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(8)))

    assert sorted(queue.ready_ids("default")) == sorted(r.task_ids["t"] for r in results)


class HeldQueue(InMemoryQueue):
    """The memory queue whose ``enqueue_many`` of several ids waits for ``release``."""

    def __init__(self) -> None:
        super().__init__(FakeClock())
        self.release = asyncio.Event()

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        if len(items) > 1:
            await self.release.wait()
        return await super().enqueue_many(items, carried=carried)


async def test_a_group_is_answered_at_its_commit_and_pushed_afterwards() -> None:
    """The answers wait for the commit only: the group's push (which cannot fail them, the
    reconciler pushes what it misses) goes on after them, and still lands."""
    queue = HeldQueue()
    service = SubmitService(store=CountingStore(), queue=queue)

    results = await asyncio.wait_for(
        asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(8))), timeout=5
    )

    assert all(r.created for r in results)
    assert queue.ready_ids("default") == []  # the push is still held
    queue.release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert sorted(queue.ready_ids("default")) == sorted(r.task_ids["t"] for r in results)


class DownQueue(InMemoryQueue):
    """The memory queue with Redis down: every push raises ``BackendUnavailable``."""

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        raise BackendUnavailable("redis down")


async def test_a_group_whose_push_fails_is_created_and_the_lane_goes_on(
    store: CountingStore,
) -> None:
    """Redis down after the group's commit: every submission is created (the reconciler
    pushes the tasks later), and the service still writes the next submissions."""
    service = SubmitService(store=store, queue=DownQueue(FakeClock()))

    first = await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(8)))
    later = await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(3)))

    assert all(r.created for r in [*first, *later])
    assert await stored_jobs(store) == 11


class BrokenQueue(InMemoryQueue):
    """A queue whose push fails with an error that is not BackendUnavailable (as a Redis
    client built from a URL with an option its connections refuse raises TypeError)."""

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        raise TypeError("AbstractConnection.__init__() got an unexpected keyword argument 'foo'")


async def test_an_unexpected_push_error_answers_every_committed_submit_and_the_lane_goes_on(
    store: CountingStore,
) -> None:
    """The jobs are committed: each submit answers (created; the reconciler pushes the tasks
    later), alone or in a group, instead of waiting forever on a lane that died."""
    service = SubmitService(store=store, queue=BrokenQueue(FakeClock()))

    async with asyncio.timeout(5):
        alone = await service.submit_job(one())
        grouped = await asyncio.gather(*(service.submit_job(one(payload=i)) for i in range(8)))
        again = await service.submit_job(one())

    assert all(r.created for r in [alone, *grouped, again])
    assert await stored_jobs(store) == 10
