"""The listing's port methods (issue 14 item 5), run against the in-memory fake and PostgreSQL:
``TaskRepository.list_page`` / ``matching_task_ids`` / ``count_by_status`` and
``JobRepository.list_page``. Every filter shape is walked page by page and compared with the
order the filter defines (newest first; ties on ``created_at`` inside and across jobs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import uuid4

from dtq.application.filters import (
    JobFilter,
    JobKeyset,
    TaskFilter,
    TaskKeyset,
    job_keyset,
    task_keyset,
)
from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Job, Task
from dtq.domain.status import JobStatus, TaskStatus

T = TypeVar("T")


async def run(store: Store, fn: Callable[[Transaction], Awaitable[T]]) -> T:
    return await store.run(fn)


async def base_time(store: Store) -> datetime:
    async def now(tx: Transaction) -> datetime:
        return await tx.now()

    return (await run(store, now)).replace(microsecond=0) - timedelta(days=1)


def job(at: datetime, name: str = "job", status: JobStatus = JobStatus.PENDING) -> Job:
    return Job(id=uuid4(), name=name, status=status, created_at=at, updated_at=at)


STATUSES = [TaskStatus.QUEUED, TaskStatus.FAILED, TaskStatus.PENDING, TaskStatus.COMPLETED]


def tasks_of(j: Job, count: int, *, priority: str = "default") -> list[Task]:
    return [
        Task(
            id=uuid4(),
            job_id=j.id,
            name=f"t{i}",
            kind="k.a" if i % 2 == 0 else "k.b",
            payload={"big": "x" * 100},
            status=STATUSES[i % len(STATUSES)],
            scheduled_at=j.created_at,
            created_at=j.created_at,
            updated_at=j.created_at,
            priority=priority,
            position=i,
            result={"r": i},
        )
        for i in range(count)
    ]


async def seed(store: Store) -> tuple[list[Job], list[Task], datetime]:
    """Four jobs: two sharing their created_at (a tie across jobs), every job's tasks sharing
    theirs (ties inside a job); the last job's tasks on priority ``high``."""
    base = await base_time(store)
    jobs = [
        job(base),
        job(base),
        job(base + timedelta(seconds=1)),
        job(base + timedelta(seconds=2)),
    ]
    tasks: list[Task] = []
    for index, j in enumerate(jobs):
        mine = tasks_of(j, 5, priority="high" if index == 3 else "default")
        tasks.extend(mine)

        async def add(tx: Transaction, j: Job = j, mine: list[Task] = mine) -> None:
            await tx.jobs.add(j, mine, [])

        await run(store, add)
    return jobs, tasks, base


async def walk_tasks(store: Store, where: TaskFilter, size: int) -> list[Task]:
    """Every page of ``list_page`` from the start, following the last keyset."""
    seen: list[Task] = []
    after: TaskKeyset | None = None
    while True:

        async def page(tx: Transaction, after: TaskKeyset | None = after) -> list[Task]:
            return await tx.tasks.list_page(where, after=after, limit=size)

        found = await run(store, page)
        assert len(found) <= size
        if not found:
            return seen
        seen.extend(found)
        after = task_keyset(found[-1])


def expected(tasks: list[Task], where: TaskFilter) -> list[Task]:
    return sorted((t for t in tasks if where.matches(t)), key=task_keyset, reverse=True)


def filters(jobs: list[Job], base: datetime) -> list[TaskFilter]:
    return [
        TaskFilter(),
        TaskFilter(statuses=frozenset({TaskStatus.QUEUED, TaskStatus.FAILED})),
        TaskFilter(kind="k.a"),
        TaskFilter(kind="k.b", statuses=frozenset({TaskStatus.FAILED})),
        TaskFilter(job_id=jobs[0].id),
        TaskFilter(job_id=jobs[1].id, statuses=frozenset({TaskStatus.PENDING}), kind="k.a"),
        TaskFilter(priority="high"),
        TaskFilter(since=base + timedelta(seconds=1)),
        TaskFilter(until=base + timedelta(seconds=1), statuses=frozenset({TaskStatus.QUEUED})),
        TaskFilter(kind="k.a", since=base, until=base + timedelta(seconds=2)),
        TaskFilter(kind="nobody"),
    ]


async def test_every_filter_shape_pages_in_order_with_no_duplicate_and_no_miss(
    store: Store,
) -> None:
    jobs, tasks, base = await seed(store)

    for where in filters(jobs, base):
        want = [t.id for t in expected(tasks, where)]
        for size in (1, 3, 50):
            got = [t.id for t in await walk_tasks(store, where, size)]
            assert got == want, (where, size)
    assert len(expected(tasks, TaskFilter())) == 20


async def test_listed_tasks_leave_out_the_heavy_columns(store: Store) -> None:
    jobs, tasks, _ = await seed(store)

    listed = await walk_tasks(store, TaskFilter(job_id=jobs[0].id), 50)

    assert len(listed) == 5
    stored = {t.id: t for t in tasks}
    for task in listed:
        assert (task.payload, task.result, task.progress) == (None, None, None)
        original = stored[task.id]
        assert (task.name, task.kind, task.status, task.priority, task.position) == (
            original.name,
            original.kind,
            original.status,
            original.priority,
            original.position,
        )
        assert task.created_at == original.created_at


async def test_matching_task_ids_are_the_listings_keysets_batch_by_batch(store: Store) -> None:
    jobs, tasks, base = await seed(store)

    for where in filters(jobs, base):
        keys: list[TaskKeyset] = []
        after: TaskKeyset | None = None
        while True:

            async def batch(
                tx: Transaction, after: TaskKeyset | None = after, where: TaskFilter = where
            ) -> Any:
                return await tx.tasks.matching_task_ids(where, after=after, limit=4)

            found = await run(store, batch)
            if not found:
                break
            keys.extend(found)
            after = found[-1]
        assert keys == [task_keyset(t) for t in expected(tasks, where)], where


async def test_count_by_status_counts_the_job_only(store: Store) -> None:
    jobs, _, _ = await seed(store)

    async def counts(tx: Transaction) -> Any:
        return await tx.tasks.count_by_status(jobs[0].id), await tx.tasks.count_by_status(uuid4())

    mine, unknown = await run(store, counts)

    # 5 tasks cycling queued, failed, pending, completed: queued twice
    assert mine == {
        TaskStatus.QUEUED: 2,
        TaskStatus.FAILED: 1,
        TaskStatus.PENDING: 1,
        TaskStatus.COMPLETED: 1,
    }
    assert unknown == {}


async def test_jobs_page_newest_first_by_every_filter_shape(store: Store) -> None:
    base = await base_time(store)
    jobs = [
        job(base, "nightly", JobStatus.COMPLETED),
        job(base, "nightly", JobStatus.FAILED),
        job(base, "adhoc", JobStatus.FAILED),
        job(base + timedelta(seconds=1), "nightly", JobStatus.RUNNING),
        job(base + timedelta(seconds=2), "adhoc", JobStatus.PENDING),
    ]
    for j in jobs:

        async def add(tx: Transaction, j: Job = j) -> None:
            await tx.jobs.add(j, [], [])

        await run(store, add)
    shapes = [
        JobFilter(),
        JobFilter(name="nightly"),
        JobFilter(name="nightly", statuses=frozenset({JobStatus.FAILED, JobStatus.RUNNING})),
        JobFilter(statuses=frozenset({JobStatus.FAILED})),
        JobFilter(since=base + timedelta(seconds=1)),
        JobFilter(until=base + timedelta(seconds=1), name="adhoc"),
        JobFilter(name="nobody"),
    ]

    for where in shapes:
        want = [j.id for j in sorted(filter(where.matches, jobs), key=job_keyset, reverse=True)]
        for size in (1, 2, 50):
            got: list[Job] = []
            after: JobKeyset | None = None
            while True:

                async def page(
                    tx: Transaction,
                    after: JobKeyset | None = after,
                    where: JobFilter = where,
                    size: int = size,
                ) -> list[Job]:
                    return await tx.jobs.list_page(where, after=after, limit=size)

                found = await run(store, page)
                if not found:
                    break
                got.extend(found)
                after = job_keyset(found[-1])
            assert [j.id for j in got] == want, (where, size)
