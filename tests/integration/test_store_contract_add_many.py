"""``JobRepository.add_many`` (group commit of submissions, issue 17 item 3) on the memory
store and on PostgreSQL: several jobs with their tasks and edges read back as written; a key
held by another job, or twice in the group, refuses the whole group."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Job
from dtq.domain.errors import DuplicateIdempotencyKey
from tests.integration.test_store_contract import (
    add,
    db_now,
    new_job,
    new_task,
)


async def test_several_jobs_tasks_and_edges_read_back_equal(store: Store) -> None:
    now = await db_now(store)
    one, two, three = new_job(now), new_job(now, key="k-2"), new_job(now, metadata={"m": 1})
    two.trace_context = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
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


async def test_a_key_in_use_refuses_the_whole_group(store: Store) -> None:
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


async def test_one_key_twice_in_the_group_is_refused(store: Store) -> None:
    now = await db_now(store)
    first, second = new_job(now, key="twice"), new_job(now, key="twice")

    async def write(tx: Transaction) -> None:
        await tx.jobs.add_many(
            [(first, [new_task(first, "t", now)], []), (second, [new_task(second, "t", now)], [])]
        )

    with pytest.raises(DuplicateIdempotencyKey):
        await store.run(write)


async def test_the_group_writes_the_created_events_of_every_job(store: Store) -> None:
    now = await db_now(store)
    one, two = new_job(now), new_job(now)
    a, b = new_task(one, "a", now), new_task(two, "b", now)

    async def write(tx: Transaction) -> None:
        await tx.jobs.add_many([(one, [a], []), (two, [b], [])])

    await store.run(write)

    async def events_of(tx: Transaction) -> dict[UUID, list[str]]:
        found = await tx.events.page(after=None, job_id=None, types=None, settle=0.0, limit=100)
        by_job: dict[UUID, list[str]] = {}
        for event in found:
            by_job.setdefault(event.job_id, []).append(event.type)
        return by_job

    by_job = await store.run(events_of)
    assert set(by_job) == {one.id, two.id}
    assert by_job[one.id] == by_job[two.id]
    assert "job.submitted" in by_job[one.id]
