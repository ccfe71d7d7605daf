"""The ``RetentionRepository`` part of the ``Store`` contract (issue 14 item 8), run against
the in-memory fake and PostgreSQL like ``test_store_contract.py`` (whose helpers
it reuses). Rows are written with explicit times relative to the store's clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID, uuid4

from dtq.application.ports import FinishedJob, PrunedJobs, Store, Tombstone, Transaction
from dtq.domain.entities import Job, Task, TaskRun
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from tests.integration.test_store_contract import add, db_now, new_job, new_task

DAY = timedelta(days=1)


async def finished(
    store: Store,
    at: datetime,
    *,
    status: JobStatus = JobStatus.COMPLETED,
    key: str | None = None,
    task_status: TaskStatus = TaskStatus.COMPLETED,
) -> tuple[Job, list[Task]]:
    """A job of two tasks (b depends on a) with one run each, all ended at ``at``."""
    job = new_job(at, key=key)
    job.status = status
    a = new_task(job, "a", at, status=TaskStatus.COMPLETED, finished_at=at)
    b = new_task(job, "b", at, status=task_status, finished_at=at)
    if not task_status.terminal:
        b.finished_at = None
    await add(store, job, [a, b], [(b.id, a.id)])
    runs = [
        TaskRun(
            id=uuid4(),
            task_id=t.id,
            attempt_number=1,
            worker_id="w",
            status=RunStatus.SUCCEEDED,
            started_at=at,
            finished_at=at,
        )
        for t in (a, b)
    ]

    async def write(tx: Transaction) -> None:
        await tx.runs.add_many(runs)

    await store.run(write)
    return job, [a, b]


async def delete(
    store: Store, ids: list[UUID], status: JobStatus, before: datetime, tombstone: bool = True
) -> PrunedJobs:
    async def fn(tx: Transaction) -> PrunedJobs:
        at = await tx.now() if tombstone else None
        return await tx.retention.delete_jobs(
            ids, status=status, finished_before=before, tombstone_at=at
        )

    return await store.run(fn)


async def test_finished_jobs_lists_one_status_before_the_cutoff_in_keyset_order(
    store: Store,
) -> None:
    now = await db_now(store)
    old = [await finished(store, now - (10 - i) * DAY) for i in range(3)]
    await finished(store, now - 10 * DAY, status=JobStatus.FAILED)
    await finished(store, now)  # too recent

    async def page(after: tuple[datetime, UUID] | None) -> list[FinishedJob]:
        async def fn(tx: Transaction) -> list[FinishedJob]:
            return await tx.retention.finished_jobs(
                status=JobStatus.COMPLETED, updated_before=now - DAY, after=after, limit=2
            )

        return await store.run(fn)

    first = await page(None)
    rest = await page((first[-1].updated_at, first[-1].id))

    assert [j.id for j in first + rest] == [job.id for job, _ in old]
    assert first[0].updated_at == old[0][0].updated_at


async def test_task_counts_count_each_jobs_tasks(store: Store) -> None:
    now = await db_now(store)
    job, _ = await finished(store, now)

    async def fn(tx: Transaction) -> dict[UUID, int]:
        return await tx.retention.task_counts([job.id, uuid4()])

    assert await store.run(fn) == {job.id: 2}


async def test_delete_jobs_deletes_qualifying_jobs_whole_and_leaves_a_tombstone(
    store: Store,
) -> None:
    now = await db_now(store)
    keyed, tasks = await finished(store, now - 10 * DAY, key="key-1")
    plain, _ = await finished(store, now - 10 * DAY)

    pruned = await delete(store, [keyed.id, plain.id, uuid4()], JobStatus.COMPLETED, now - DAY)
    again = await delete(store, [keyed.id, plain.id], JobStatus.COMPLETED, now - DAY)

    assert pruned == PrunedJobs(jobs=2, tasks=4, runs=4, tombstones_written=1)
    assert again == PrunedJobs()

    async def fn(tx: Transaction) -> tuple[object, ...]:
        return (
            await tx.jobs.get(keyed.id),
            await tx.jobs.get_by_idempotency_key("key-1"),
            await tx.tasks.get_many([t.id for t in tasks]),
            await tx.runs.list_for_task(tasks[0].id),
            await tx.tasks.dependents(tasks[0].id),
            await tx.retention.get_tombstone("key-1"),
            await tx.retention.get_tombstone("unknown"),
        )

    job, by_key, left, runs, dependents, tombstone, unknown = await store.run(fn)
    assert (job, by_key, left, runs, dependents, unknown) == (None, None, [], [], [], None)
    assert isinstance(tombstone, Tombstone)
    assert (tombstone.request_hash, tombstone.job_id, tombstone.task_ids) == (
        "hash",
        keyed.id,
        {"a": tasks[0].id, "b": tasks[1].id},
    )


async def test_delete_jobs_skips_jobs_that_no_longer_qualify(store: Store) -> None:
    now = await db_now(store)
    running, _ = await finished(store, now - 10 * DAY, task_status=TaskStatus.RUNNING)
    late, late_tasks = await finished(store, now - 10 * DAY)
    other_status, _ = await finished(store, now - 10 * DAY, status=JobStatus.FAILED)
    late_tasks[1].finished_at = now  # its last task ended after the cutoff

    async def finish_late(tx: Transaction) -> None:
        await tx.tasks.save(late_tasks[1])

    await store.run(finish_late)

    ids = [running.id, late.id, other_status.id]
    assert await delete(store, ids, JobStatus.COMPLETED, now - DAY) == PrunedJobs()
    assert await delete(store, [late.id], JobStatus.COMPLETED, now - 5 * DAY) == PrunedJobs()


async def test_no_tombstone_without_a_tombstone_time(store: Store) -> None:
    now = await db_now(store)
    job, _ = await finished(store, now - 10 * DAY, key="key-2")

    pruned = await delete(store, [job.id], JobStatus.COMPLETED, now - DAY, tombstone=False)

    async def fn(tx: Transaction) -> Tombstone | None:
        return await tx.retention.get_tombstone("key-2")

    assert (pruned.jobs, pruned.tombstones_written) == (1, 0)
    assert await store.run(fn) is None


async def test_delete_tombstones_deletes_the_oldest_expired_up_to_the_limit(store: Store) -> None:
    now = await db_now(store)
    jobs = [await finished(store, now - 10 * DAY, key=f"t{i}") for i in range(3)]
    for i, (job, _) in enumerate(jobs):  # pruned at three different (store) times

        async def fn(tx: Transaction, job_id: UUID = job.id, i: int = i) -> None:
            await tx.retention.delete_jobs(
                [job_id],
                status=JobStatus.COMPLETED,
                finished_before=now - DAY,
                tombstone_at=now - (5, 4, 1)[i] * DAY,
            )

        await store.run(fn)

    async def expire(tx: Transaction) -> int:
        return await tx.retention.delete_tombstones(pruned_before=now - 2 * DAY, limit=2)

    async def keys(tx: Transaction) -> list[bool]:
        return [await tx.retention.get_tombstone(f"t{i}") is not None for i in range(3)]

    assert await store.run(expire) == 2
    assert await store.run(keys) == [False, False, True]
    assert await store.run(expire) == 0
