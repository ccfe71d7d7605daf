"""``JobRepository.add_many`` (group commit of submissions, issue 17 item 3) on the memory
store and on PostgreSQL: several jobs with their tasks and edges read back as written; a key
held by another job, or twice in the group, refuses the whole group."""

from __future__ import annotations

from typing import Any

import pytest

from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Job
from dtq.domain.errors import DuplicateIdempotencyKey
from tests.integration.test_store_contract import (  # noqa: F401  (fixtures)
    add,
    db_now,
    memory_store,
    new_job,
    new_task,
    store,
)


async def test_several_jobs_tasks_and_edges_read_back_equal(store: Store) -> None:  # noqa: F811
    now = await db_now(store)
    one, two, three = new_job(now), new_job(now, key="k-2"), new_job(now, metadata={"m": 1})
    a, b = new_task(one, "a", now), new_task(one, "b", now, position=1)
    c = new_task(two, "c", now)
    d = new_task(three, "d", now)

    async def write(tx: Transaction) -> None:
        await tx.jobs.add_many([(one, [a, b], [(b.id, a.id)]), (two, [c], []), (three, [d], [])])

    await store.run(write)

    async def fetch(tx: Transaction) -> tuple[list[Job | None], list[Any], list[Any]]:
        jobs = [await tx.jobs.get(j.id) for j in (one, two, three)]
        tasks = [await tx.tasks.list_by_job(j.id) for j in (one, two, three)]
        return jobs, tasks, [await tx.tasks.dependencies(b.id)]

    jobs, tasks, deps = await store.run(fetch)
    assert jobs == [one, two, three]
    assert tasks == [[a, b], [c], [d]]
    assert deps == [[a.id]]


async def test_a_key_in_use_refuses_the_whole_group(store: Store) -> None:  # noqa: F811
    now = await db_now(store)
    held = new_job(now, key="taken")
    await add(store, held, [new_task(held, "t", now)])
    fresh, clash = new_job(now), new_job(now, key="taken")

    async def write(tx: Transaction) -> None:
        await tx.jobs.add_many(
            [(fresh, [new_task(fresh, "t", now)], []), (clash, [new_task(clash, "t", now)], [])]
        )

    with pytest.raises(DuplicateIdempotencyKey):
        await store.run(write)

    async def fetch(tx: Transaction) -> tuple[Job | None, Job | None]:
        return await tx.jobs.get(fresh.id), await tx.jobs.get(clash.id)

    assert await store.run(fetch) == (None, None)


async def test_one_key_twice_in_the_group_is_refused(store: Store) -> None:  # noqa: F811
    now = await db_now(store)
    first, second = new_job(now, key="twice"), new_job(now, key="twice")

    async def write(tx: Transaction) -> None:
        await tx.jobs.add_many(
            [(first, [new_task(first, "t", now)], []), (second, [new_task(second, "t", now)], [])]
        )

    with pytest.raises(DuplicateIdempotencyKey):
        await store.run(write)
