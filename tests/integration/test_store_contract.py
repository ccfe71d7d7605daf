"""The ``Store`` port contract, run against the in-memory fake and against PostgreSQL.

Every test builds its data relative to the store's own clock (``Transaction.now``) and passes
explicit times to the queries, so the same assertions hold for a fake clock and a real server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from dtq.application.ports import DueTask, RunningTask, Store, Transaction
from dtq.domain.entities import Job, Task, TaskRun, Worker
from dtq.domain.errors import (
    BackendUnavailable,
    ConcurrentUpdate,
    DuplicateIdempotencyKey,
    TaskNotFound,
)
from dtq.domain.status import JobStatus, RunStatus, TaskStatus

PAYLOADS: list[Any] = [
    {"text": "héllo ✓ 日本語 🚀", "nested": {"list": [1, [2, {"deep": None}]], "empty": {}}},
    {"max": 2**63 - 1, "min": -(2**63), "float": 3.25, "tenth": 0.1, "small": 1.5e-7},
    [True, False, None, "", 0, -1, 2.0],
    "just a string",
    None,
]


# --- helpers ----------------------------------------------------------------------------------


async def db_now(store: Store) -> datetime:
    async def read(tx: Transaction) -> datetime:
        return await tx.now()

    return await store.run(read)


def new_job(now: datetime, *, key: str | None = None, metadata: Any = None) -> Job:
    return Job(
        id=uuid4(),
        name="job",
        status=JobStatus.PENDING,
        created_at=now,
        updated_at=now,
        metadata=metadata,
        idempotency_key=key,
        request_hash="hash" if key else None,
    )


def new_task(job: Job, name: str, now: datetime, **fields: Any) -> Task:
    values: dict[str, Any] = {
        "id": uuid4(),
        "job_id": job.id,
        "name": name,
        "kind": "email.send",
        "payload": {"n": name},
        "status": TaskStatus.QUEUED,
        "scheduled_at": now,
        "created_at": now,
        "updated_at": now,
    }
    values.update(fields)
    return Task(**values)


async def add(
    store: Store, job: Job, tasks: list[Task], edges: list[tuple[UUID, UUID]] | None = None
) -> None:
    async def write(tx: Transaction) -> None:
        await tx.jobs.add(job, tasks, edges or [])

    await store.run(write)


async def read(store: Store, fn: Callable[[Transaction], Awaitable[Any]]) -> Any:
    return await store.run(fn)


async def get_task(store: Store, task_id: UUID) -> Task | None:
    async def fn(tx: Transaction) -> Task | None:
        return await tx.tasks.get(task_id)

    return await store.run(fn)


async def save_task(store: Store, task: Task) -> None:
    async def fn(tx: Transaction) -> None:
        await tx.tasks.save(task)

    await store.run(fn)


# --- jobs and tasks ---------------------------------------------------------------------------


async def test_added_job_tasks_and_edges_read_back_equal(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now, key="key-1", metadata={"owner": "zoë", "tags": ["a", "b"], "n": 7})
    tasks = [
        new_task(job, f"t{i}", now, payload=payload, priority="high", max_attempts=5)
        for i, payload in enumerate(PAYLOADS)
    ]
    tasks[1].status = TaskStatus.PENDING
    edges = [(tasks[1].id, tasks[0].id)]

    await add(store, job, tasks, edges)

    async def fetch(tx: Transaction) -> tuple[Any, ...]:
        return (
            await tx.jobs.get(job.id),
            await tx.jobs.get_by_idempotency_key("key-1"),
            await tx.tasks.get_many([t.id for t in tasks] + [uuid4()]),
            await tx.tasks.get(tasks[0].id),
            await tx.tasks.dependents(tasks[0].id),
        )

    got_job, by_key, got_tasks, first, dependents = await store.run(fetch)
    assert got_job == job
    assert by_key == job
    assert sorted(got_tasks, key=lambda t: t.id) == sorted(tasks, key=lambda t: t.id)
    assert [t.payload for t in sorted(got_tasks, key=lambda t: t.name)] == PAYLOADS
    assert first == tasks[0]
    assert dependents == [tasks[1].id]


async def test_tasks_read_with_their_jobs_each_job_once(store: Store) -> None:
    """``get_many_with_jobs`` (a lone claim's read): the tasks as ``get_many`` reads them,
    plus each distinct job of the tasks found once, equal to ``jobs.get``; unknown ids are
    left out and bring no job."""
    now = await db_now(store)
    job = new_job(now, key="with-jobs", metadata={"owner": "zoë"})
    other, unrelated = new_job(now), new_job(now)
    tasks = [new_task(job, f"t{i}", now) for i in range(3)]
    lone = new_task(other, "lone", now)
    await add(store, job, tasks)
    await add(store, other, [lone])
    await add(store, unrelated, [new_task(unrelated, "not asked", now)])

    async def fetch(tx: Transaction) -> tuple[Any, ...]:
        return (
            await tx.tasks.get_many_with_jobs([*(t.id for t in tasks), lone.id, uuid4()]),
            await tx.tasks.get_many_with_jobs([lone.id]),
            await tx.tasks.get_many_with_jobs([uuid4()]),
            await tx.tasks.get_many_with_jobs([]),
        )

    (got_tasks, got_jobs), one, unknown, empty = await store.run(fetch)
    assert sorted(got_tasks, key=lambda t: t.id) == sorted([*tasks, lone], key=lambda t: t.id)
    assert sorted(got_jobs, key=lambda j: j.id) == sorted([job, other], key=lambda j: j.id)
    assert one == ([lone], [other])
    assert unknown == ([], [])
    assert empty == ([], [])


async def test_finished_jobs_read_with_whether_some_task_failed_or_was_cancelled(
    store: Store,
) -> None:
    """``get_finished`` (what settling the jobs of a batch reads, one statement): of the ids
    given, the jobs with no task in the unfinished statuses, each as ``jobs.get`` reads it and
    with whether some task of it is ``failed`` / ``cancelled``; a job with work left and an
    unknown id are left out, a repeated id counts once."""
    now = await db_now(store)
    done = TaskStatus.COMPLETED
    shapes = {
        "failed": [done, TaskStatus.FAILED],
        "cancelled": [done, TaskStatus.CANCELLED],
        "both": [TaskStatus.CANCELLED, TaskStatus.FAILED],
        "neither": [done, done],
        "queued": [done, TaskStatus.QUEUED],
        "running": [TaskStatus.FAILED, TaskStatus.RUNNING],
        "pending": [TaskStatus.PENDING],
    }
    jobs = {}
    for name, statuses in shapes.items():
        job = new_job(now)
        await add(
            store, job, [new_task(job, f"t{i}", now, status=s) for i, s in enumerate(statuses)]
        )
        jobs[name] = job
    unfinished = (TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING)
    ids = [*(job.id for job in jobs.values()), uuid4(), jobs["failed"].id]

    async def fetch(tx: Transaction) -> dict[UUID, tuple[Job, bool, bool]]:
        return {found[0].id: found for found in await tx.jobs.get_finished(ids, unfinished)}

    async def fetch_none(tx: Transaction) -> list[tuple[Job, bool, bool]]:
        return await tx.jobs.get_finished([], unfinished)

    got = await store.run(fetch)
    assert got == {
        jobs["failed"].id: (jobs["failed"], True, False),
        jobs["cancelled"].id: (jobs["cancelled"], False, True),
        jobs["both"].id: (jobs["both"], True, True),
        jobs["neither"].id: (jobs["neither"], False, False),
    }
    assert await store.run(fetch_none) == []


async def test_unknown_ids_read_as_none_or_empty(store: Store) -> None:
    async def fetch(tx: Transaction) -> tuple[Any, ...]:
        return (
            await tx.jobs.get(uuid4()),
            await tx.jobs.get_by_idempotency_key("nope"),
            await tx.tasks.get(uuid4()),
            await tx.tasks.get_many([uuid4()]),
            await tx.tasks.list_by_job(uuid4()),
            await tx.tasks.dependents(uuid4()),
            await tx.runs.get(uuid4()),
            await tx.runs.list_for_task(uuid4()),
            await tx.jobs.get_many([uuid4(), uuid4()]),
            await tx.runs.get_many([uuid4()]),
            await tx.tasks.dependents_many([uuid4()]),
        )

    assert await store.run(fetch) == (None, None, None, [], [], [], None, [], [], [], [])


async def test_list_by_job_orders_by_created_at_then_name(store: Store) -> None:
    now = await db_now(store)
    job, other = new_job(now), new_job(now)
    late = new_task(job, "a", now + timedelta(seconds=2))
    early_z = new_task(job, "z", now)
    early_b = new_task(job, "b", now)
    await add(store, job, [late, early_z, early_b])
    await add(store, other, [new_task(other, "x", now)])

    async def fn(tx: Transaction) -> list[Task]:
        return await tx.tasks.list_by_job(job.id)

    assert [t.name for t in await store.run(fn)] == ["b", "z", "a"]


# --- optimistic concurrency -------------------------------------------------------------------


async def test_save_bumps_version_and_refuses_a_stale_copy(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now)
    await add(store, job, [task])

    async def fn(tx: Transaction) -> list[str]:
        outcomes = []
        fresh = await tx.tasks.get(task.id)
        fresh_job = await tx.jobs.get(job.id)
        assert fresh is not None
        assert fresh_job is not None
        stale, stale_job = replace(fresh), replace(fresh_job)
        fresh.last_error = "first writer"
        await tx.tasks.save(fresh)
        fresh_job.status = JobStatus.RUNNING
        await tx.jobs.save(fresh_job)
        outcomes.append(f"saved v{fresh.version} v{fresh_job.version}")
        stale.last_error = "second writer"
        stale_job.status = JobStatus.FAILED
        attempts: list[Awaitable[None]] = [tx.tasks.save(stale), tx.jobs.save(stale_job)]
        for attempt in attempts:
            try:
                await attempt
            except ConcurrentUpdate:
                outcomes.append("conflict")
        return outcomes

    assert await store.run(fn) == ["saved v1 v1", "conflict", "conflict"]
    stored = await get_task(store, task.id)
    assert stored is not None
    assert (stored.last_error, stored.version) == ("first writer", 1)


async def test_concurrent_update_reruns_the_whole_function(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now)
    await add(store, job, [task])
    calls = 0
    retries_before = store.retries  # type: ignore[attr-defined]

    async def fn(tx: Transaction) -> int:
        nonlocal calls
        calls += 1
        current = await tx.tasks.get(task.id)
        assert current is not None
        await tx.workers.upsert(Worker(f"w{calls}", None, await tx.now()))
        if calls == 1:
            current.version += 5  # as if another transaction had moved the row on
        current.last_error = f"try {calls}"
        await tx.tasks.save(current)
        return current.version

    assert await store.run(fn) == 1
    assert calls == 2
    assert store.retries == retries_before + 1  # type: ignore[attr-defined]
    stored = await get_task(store, task.id)
    assert stored is not None
    assert stored.last_error == "try 2"

    async def workers(tx: Transaction) -> list[str]:
        return [w.id for w in await tx.workers.list_active(now - timedelta(days=1))]

    assert await store.run(workers) == ["w2"]  # the first try's write was rolled back


async def test_a_conflict_that_never_clears_is_bounded(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now)
    await add(store, job, [task])
    stale = replace(task, version=task.version + 1)
    calls = 0

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.tasks.save(replace(stale))

    with pytest.raises(BackendUnavailable):
        await store.run(fn)
    assert 1 < calls <= 20


async def test_duplicate_idempotency_key_is_refused_without_retrying(store: Store) -> None:
    now = await db_now(store)
    first = new_job(now, key="same")
    await add(store, first, [new_task(first, "t", now)])
    second = new_job(now, key="same")
    calls = 0

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.jobs.add(second, [new_task(second, "t", now)], [])

    with pytest.raises(DuplicateIdempotencyKey):
        await store.run(fn)
    assert calls == 1

    async def fetch(tx: Transaction) -> tuple[Job | None, Job | None]:
        return await tx.jobs.get_by_idempotency_key("same"), await tx.jobs.get(second.id)

    assert await store.run(fetch) == (first, None)


async def test_jobs_without_a_key_never_collide(store: Store) -> None:
    now = await db_now(store)
    one, two = new_job(now), new_job(now)
    await add(store, one, [new_task(one, "t", now)])
    await add(store, two, [new_task(two, "t", now)])

    async def fetch(tx: Transaction) -> list[Job | None]:
        return [await tx.jobs.get(one.id), await tx.jobs.get(two.id)]

    assert await store.run(fetch) == [one, two]


# --- dependency and job probes ----------------------------------------------------------------


async def test_dependencies_lists_a_tasks_direct_dependencies_by_id(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    a, b = new_task(job, "a", now), new_task(job, "b", now)
    c, d = (new_task(job, n, now, status=TaskStatus.PENDING) for n in "cd")
    await add(store, job, [a, b, c, d], [(c.id, a.id), (c.id, b.id), (d.id, c.id)])

    async def probe(tx: Transaction) -> tuple[list[UUID], ...]:
        return (
            await tx.tasks.dependencies(c.id),
            await tx.tasks.dependencies(d.id),
            await tx.tasks.dependencies(a.id),
            await tx.tasks.dependencies(uuid4()),
        )

    assert await store.run(probe) == (sorted([a.id, b.id]), [c.id], [], [])


async def test_dependents_dependencies_completed_and_job_has_status(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    a = new_task(job, "a", now)
    b, c, d = (new_task(job, n, now, status=TaskStatus.PENDING) for n in "bcd")
    await add(store, job, [a, b, c, d], [(b.id, a.id), (c.id, a.id), (d.id, b.id), (d.id, c.id)])

    async def probe(tx: Transaction) -> tuple[Any, ...]:
        return (
            sorted(await tx.tasks.dependents(a.id)),
            await tx.tasks.dependents(d.id),
            await tx.tasks.dependencies_completed(a.id),
            await tx.tasks.dependencies_completed(d.id),
            await tx.tasks.job_has_status(job.id, [TaskStatus.PENDING]),
            await tx.tasks.job_has_status(job.id, [TaskStatus.RUNNING, TaskStatus.FAILED]),
            await tx.tasks.job_has_status(job.id, []),
            await tx.tasks.job_has_status(uuid4(), [TaskStatus.PENDING]),
        )

    assert await store.run(probe) == (
        sorted([b.id, c.id]),
        [],
        True,
        False,
        True,
        False,
        False,
        False,
    )

    b.status = TaskStatus.COMPLETED
    await save_task(store, b)

    async def after_b(tx: Transaction) -> tuple[bool, bool]:
        return (
            await tx.tasks.dependencies_completed(d.id),
            await tx.tasks.job_has_status(job.id, [TaskStatus.COMPLETED]),
        )

    assert await store.run(after_b) == (False, True)

    c.status = TaskStatus.FAILED
    await save_task(store, c)

    async def after_c(tx: Transaction) -> tuple[bool, bool]:
        return (
            await tx.tasks.dependencies_completed(d.id),
            await tx.tasks.job_has_status(job.id, [TaskStatus.RUNNING, TaskStatus.FAILED]),
        )

    assert await store.run(after_c) == (False, True)

    c.status = TaskStatus.COMPLETED
    c.version = 1
    await save_task(store, c)

    async def after_all(tx: Transaction) -> bool:
        return await tx.tasks.dependencies_completed(d.id)

    assert await store.run(after_all) is True


async def test_dependency_has_status_probes_the_direct_dependencies(store: Store) -> None:
    """The manual retry's probe (issue 14 item 4): some direct dependency in ``statuses``."""
    now = await db_now(store)
    job = new_job(now)
    a = new_task(job, "a", now, status=TaskStatus.FAILED)
    b = new_task(job, "b", now, status=TaskStatus.COMPLETED)
    c = new_task(job, "c", now, status=TaskStatus.FAILED)
    d = new_task(job, "d", now, status=TaskStatus.FAILED)  # depends on b and c
    await add(store, job, [a, b, c, d], [(c.id, a.id), (d.id, b.id), (d.id, c.id)])
    blocking = [TaskStatus.FAILED, TaskStatus.CANCELLED]

    async def probe(tx: Transaction) -> tuple[bool, ...]:
        return (
            await tx.tasks.dependency_has_status(a.id, blocking),  # no dependencies
            await tx.tasks.dependency_has_status(c.id, blocking),  # a failed
            await tx.tasks.dependency_has_status(d.id, blocking),  # c failed
            await tx.tasks.dependency_has_status(d.id, [TaskStatus.CANCELLED]),
            await tx.tasks.dependency_has_status(uuid4(), blocking),
        )

    assert await store.run(probe) == (False, True, True, False, False)

    c.status = TaskStatus.CANCELLED
    await save_task(store, c)

    async def after(tx: Transaction) -> tuple[bool, bool]:
        return (
            await tx.tasks.dependency_has_status(d.id, [TaskStatus.CANCELLED]),
            await tx.tasks.dependency_has_status(d.id, [TaskStatus.PENDING]),
        )

    assert await store.run(after) == (True, False)


async def test_a_run_ended_cancelled_round_trips_and_ends_once(store: Store) -> None:
    """A run closed because its task was cancelled (issue 14 item 1, migration 0021)."""
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now, status=TaskStatus.RUNNING, started_at=now)
    run = TaskRun(uuid4(), task.id, 1, "w1", RunStatus.RUNNING, started_at=now)
    await add(store, job, [task])

    async def fn(tx: Transaction) -> str:
        await tx.runs.add_many([replace(run)])
        cancelled, late = replace(run), replace(run)
        cancelled._end(RunStatus.CANCELLED, at=now, error="task cancelled")
        await tx.runs.save_many([cancelled])
        late._end(RunStatus.SUCCEEDED, at=now)
        try:
            await tx.runs.save(late)
        except ConcurrentUpdate:
            return "conflict"
        return "written"

    assert await store.run(fn) == "conflict"

    async def fetch(tx: Transaction) -> TaskRun | None:
        return await tx.runs.get(run.id)

    stored = await store.run(fetch)
    assert stored is not None
    assert (stored.status, stored.error) == (RunStatus.CANCELLED, "task cancelled")


# --- reconciler queries -----------------------------------------------------------------------


async def test_due_queued_filters_and_pages_by_scheduled_at_then_id(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    at = [now - timedelta(seconds=s) for s in (10, 10, 10, 5, 1, 0)]
    due = [
        new_task(job, f"due{i}", now, scheduled_at=t, priority=f"p{i}") for i, t in enumerate(at)
    ]
    not_due = new_task(job, "future", now, scheduled_at=now + timedelta(seconds=60))
    pending = new_task(job, "pending", now, status=TaskStatus.PENDING, scheduled_at=at[0])
    running = new_task(
        job,
        "running",
        now,
        status=TaskStatus.RUNNING,
        scheduled_at=at[0],
        started_at=at[0],
        current_run_id=uuid4(),
    )
    await add(store, job, [*due, not_due, pending, running])
    expected = [
        DueTask(id=t.id, priority=t.priority, scheduled_at=t.scheduled_at, kind=t.kind)
        for t in sorted(due, key=lambda t: (t.scheduled_at, t.id))
    ]

    pages: list[list[DueTask]] = []
    cursor: tuple[datetime, UUID] | None = None
    while True:

        async def page(tx: Transaction, after: Any = cursor) -> list[DueTask]:
            return await tx.tasks.due_queued(now=now, after=after, limit=4)

        got = await store.run(page)
        if not got:
            break
        pages.append(got)
        cursor = (got[-1].scheduled_at, got[-1].id)

    assert [len(p) for p in pages] == [4, 2]
    assert [t for p in pages for t in p] == expected


async def test_stale_running_filters_and_pages_by_id(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    old = now - timedelta(minutes=10)

    def running(name: str, started: datetime) -> Task:
        return new_task(
            job,
            name,
            now,
            status=TaskStatus.RUNNING,
            started_at=started,
            current_run_id=uuid4(),
            attempt=1,
        )

    stale = [running(f"stale{i}", old + timedelta(seconds=i)) for i in range(5)]
    fresh = running("fresh", now)
    queued = new_task(job, "queued", now, scheduled_at=old)
    await add(store, job, [*stale, fresh, queued])
    threshold = now - timedelta(minutes=1)

    seen: list[RunningTask] = []
    after: UUID | None = None
    for _ in range(10):

        async def page(tx: Transaction, cursor: UUID | None = after) -> list[RunningTask]:
            return await tx.tasks.stale_running(started_before=threshold, after=cursor, limit=2)

        got = await store.run(page)
        if not got:
            break
        assert len(got) <= 2
        seen.extend(got)
        after = got[-1].id

    assert seen == [
        RunningTask(id=t.id, run_id=t.current_run_id, priority=t.priority, started_at=t.started_at)  # type: ignore[arg-type]
        for t in sorted(stale, key=lambda t: t.id)
    ]


# --- runs -------------------------------------------------------------------------------------


async def test_runs_are_listed_by_started_at_even_when_attempt_numbers_repeat(
    store: Store,
) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now, scheduled_at=now - timedelta(seconds=60))
    await add(store, job, [task])

    async def claim_reclaim_claim(tx: Transaction) -> list[TaskRun]:
        current = await tx.tasks.get(task.id)
        assert current is not None
        first = current.claim(run_id=uuid4(), worker_id="w1", at=now - timedelta(seconds=30))
        await tx.runs.add_many([replace(first)])
        current.reclaim(first, reason="lease lost", max_reclaims=5, at=now - timedelta(seconds=20))
        await tx.runs.save(first)
        second = current.claim(run_id=uuid4(), worker_id="w2", at=now - timedelta(seconds=10))
        await tx.runs.add_many([second])
        await tx.tasks.save(current)
        return [first, second]

    first, second = await store.run(claim_reclaim_claim)

    async def history(tx: Transaction) -> list[TaskRun]:
        return await tx.runs.list_for_task(task.id)

    runs = await store.run(history)
    assert runs == [first, second]
    assert [r.attempt_number for r in runs] == [1, 1]
    assert [r.status for r in runs] == [RunStatus.DEAD, RunStatus.RUNNING]
    assert runs[0].error == "lease lost"


async def test_run_save_is_guarded_on_the_stored_run_still_running(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now, status=TaskStatus.RUNNING, started_at=now)
    run = TaskRun(uuid4(), task.id, 1, "w1", RunStatus.RUNNING, started_at=now)
    await add(store, job, [task])

    async def fn(tx: Transaction) -> list[str]:
        await tx.runs.add_many([replace(run)])
        winner, loser = replace(run), replace(run)
        winner._end(RunStatus.SUCCEEDED, at=now)
        await tx.runs.save(winner)
        loser._end(RunStatus.FAILED, at=now, error="late report")
        outcomes = []
        for candidate in (loser, replace(run, id=uuid4())):
            try:
                await tx.runs.save(candidate)
            except ConcurrentUpdate:
                outcomes.append("conflict")
        return outcomes

    assert await store.run(fn) == ["conflict", "conflict"]

    async def fetch(tx: Transaction) -> TaskRun | None:
        return await tx.runs.get(run.id)

    stored = await store.run(fetch)
    assert stored is not None
    assert (stored.status, stored.error, stored.finished_at) == (RunStatus.SUCCEEDED, None, now)


# --- batch methods ----------------------------------------------------------------------------


def by_id(items: list[Any]) -> list[Any]:
    return sorted(items, key=lambda x: x.id)


def new_run(task: Task, at: datetime, worker: str = "w1") -> TaskRun:
    return TaskRun(uuid4(), task.id, 1, worker, RunStatus.RUNNING, started_at=at)


async def test_batch_methods_do_nothing_on_empty_input(store: Store) -> None:
    async def fn(tx: Transaction) -> tuple[Any, ...]:
        await tx.jobs.save_many([])
        await tx.tasks.save_many([])
        await tx.runs.add_many([])
        await tx.runs.save_many([])
        return (
            await tx.jobs.get_many([]),
            await tx.tasks.get_many([]),
            await tx.runs.get_many([]),
            await tx.tasks.dependents_many([]),
        )

    assert await store.run(fn) == ([], [], [], [])


async def test_jobs_get_many_and_save_many_round_trip(store: Store) -> None:
    now = await db_now(store)
    one, two, untouched = new_job(now, key="k1"), new_job(now), new_job(now)
    for job in (one, two, untouched):
        await add(store, job, [new_task(job, "t", now)])
    later = now + timedelta(seconds=5)

    async def update(tx: Transaction) -> list[Job]:
        jobs = await tx.jobs.get_many([one.id, uuid4(), two.id, one.id])
        assert by_id(jobs) == by_id([one, two])
        for job in jobs:
            job.set_status(JobStatus.RUNNING, at=later)
        jobs[0].metadata = {"note": "ünïcode", "n": [1, 2.5, None]}
        jobs[1].metadata = None
        await tx.jobs.save_many(jobs)
        assert [j.version for j in jobs] == [1, 1]
        await tx.jobs.save_many(jobs)  # the bumped in-memory versions match the stored ones
        assert [j.version for j in jobs] == [2, 2]
        return jobs

    saved = await store.run(update)

    async def fetch(tx: Transaction) -> list[Job]:
        return await tx.jobs.get_many([one.id, two.id, untouched.id])

    assert by_id(await store.run(fetch)) == by_id([*saved, untouched])
    assert {j.idempotency_key for j in saved} == {"k1", None}  # never rewritten


async def test_tasks_save_many_writes_every_mutable_column(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    started = now - timedelta(seconds=30)
    tasks = [
        new_task(job, "a", now),
        new_task(job, "b", now, status=TaskStatus.PENDING),
        new_task(
            job,
            "c",
            now,
            status=TaskStatus.RUNNING,
            started_at=started,
            current_run_id=uuid4(),
            attempt=1,
            last_error="old",
        ),
    ]
    untouched = new_task(job, "d", now)
    await add(store, job, [*tasks, untouched])
    later = now + timedelta(seconds=7)

    async def update(tx: Transaction) -> list[Task]:
        fresh = {t.id: t for t in await tx.tasks.get_many([t.id for t in tasks])}
        a, b, c = (fresh[t.id] for t in tasks)
        a.status, a.started_at, a.current_run_id = TaskStatus.RUNNING, later, uuid4()
        a.attempt, a.priority, a.max_attempts = 1, "high", 9
        b.status, b.scheduled_at, b.reclaims = TaskStatus.QUEUED, later, 2
        c.status, c.finished_at, c.last_error = TaskStatus.COMPLETED, later, None
        c.current_run_id, c.started_at = None, None
        for t in (a, b, c):
            t.updated_at = later
        batch = [c, a, b]
        await tx.tasks.save_many(batch)
        assert [t.version for t in batch] == [1, 1, 1]
        assert by_id(await tx.tasks.get_many([t.id for t in batch])) == by_id(batch)
        return batch

    saved = await store.run(update)
    stored = await store.run(lambda tx: tx.tasks.get_many([t.id for t in [*tasks, untouched]]))
    assert by_id(stored) == by_id([*saved, untouched])


async def test_task_save_many_is_all_or_nothing(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    tasks = [new_task(job, f"t{i}", now) for i in range(3)]
    await add(store, job, tasks)
    ids = [t.id for t in tasks]

    async def fn(tx: Transaction) -> list[str]:
        fresh = {t.id: t for t in await tx.tasks.get_many(ids)}
        first, stale, last = (fresh[i] for i in ids)
        moved = replace(stale)
        moved.last_error = "moved on by another writer"
        await tx.tasks.save(moved)  # the stored row is now one version ahead of ``stale``
        outcomes = []
        batches = [[first, stale, last], [first, replace(last, id=uuid4())]]  # stale / gone
        for batch in batches:
            for t in batch:
                t.last_error = "batch"
            try:
                await tx.tasks.save_many(batch)
            except ConcurrentUpdate:
                outcomes.append("conflict")
            assert [t.version for t in batch] == [0] * len(batch)  # not bumped
        # nothing of either batch is visible, even in this transaction
        seen = {t.id: t for t in await tx.tasks.get_many(ids)}
        outcomes.append(",".join(f"{seen[i].last_error}@{seen[i].version}" for i in ids))
        return outcomes

    assert await store.run(fn) == [
        "conflict",
        "conflict",
        "None@0,moved on by another writer@1,None@0",
    ]
    # and nothing of them was committed either
    stored = {t.id: t for t in await store.run(lambda tx: tx.tasks.get_many(ids))}
    assert [(stored[i].last_error, stored[i].version) for i in ids] == [
        (None, 0),
        ("moved on by another writer", 1),
        (None, 0),
    ]


async def test_a_stale_save_many_reruns_the_transaction_and_commits_nothing(
    store: Store,
) -> None:
    now = await db_now(store)
    job = new_job(now)
    tasks = [new_task(job, f"t{i}", now) for i in range(3)]
    await add(store, job, tasks)
    calls = 0

    async def always_stale(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        fresh = await tx.tasks.get_many([t.id for t in tasks])
        for t in fresh:
            t.last_error = f"try {calls}"
        fresh[1].version += 1  # as if another transaction had moved that row on
        await tx.tasks.save_many(fresh)

    with pytest.raises(BackendUnavailable):
        await store.run(always_stale)
    assert calls > 1
    stored = await store.run(lambda tx: tx.tasks.get_many([t.id for t in tasks]))
    assert by_id(stored) == by_id(tasks)

    async def stale_once(tx: Transaction) -> list[int]:
        nonlocal calls
        calls += 1
        fresh = await tx.tasks.get_many([t.id for t in tasks])
        for t in fresh:
            t.last_error = "written"
        if calls == 1:
            fresh[0].version += 1
        await tx.tasks.save_many(fresh)
        return [t.version for t in fresh]

    calls = 0
    assert await store.run(stale_once) == [1, 1, 1]
    assert calls == 2
    stored = await store.run(lambda tx: tx.tasks.get_many([t.id for t in tasks]))
    assert {(t.last_error, t.version) for t in stored} == {("written", 1)}


async def test_job_save_many_is_all_or_nothing(store: Store) -> None:
    now = await db_now(store)
    jobs = [new_job(now) for _ in range(3)]
    for job in jobs:
        await add(store, job, [new_task(job, "t", now)])
    ids = [j.id for j in jobs]

    async def fn(tx: Transaction) -> str:
        fresh = {j.id: j for j in await tx.jobs.get_many(ids)}
        batch = [fresh[i] for i in ids]
        for job in batch:
            job.set_status(JobStatus.RUNNING, at=now)
        batch[2].version = 7
        try:
            await tx.jobs.save_many(batch)
        except ConcurrentUpdate:
            assert [j.version for j in batch] == [0, 0, 7]
            return "conflict"
        return "saved"

    assert await store.run(fn) == "conflict"
    stored = await store.run(lambda tx: tx.jobs.get_many(ids))
    assert by_id(stored) == by_id(jobs)


async def test_runs_add_many_get_many_and_guarded_save_many(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    tasks = [new_task(job, f"t{i}", now, status=TaskStatus.RUNNING) for i in range(3)]
    await add(store, job, tasks)
    runs = [new_run(t, now - timedelta(seconds=i), worker=f"w{i}") for i, t in enumerate(tasks)]

    async def insert(tx: Transaction) -> list[TaskRun]:
        await tx.runs.add_many([replace(r) for r in runs])
        return await tx.runs.get_many([r.id for r in runs])

    assert by_id(await store.run(insert)) == by_id(runs)

    async def end_two(tx: Transaction) -> None:
        ok, bad, _ = (replace(r) for r in runs)
        ok._end(RunStatus.SUCCEEDED, at=now)
        bad._end(RunStatus.FAILED, at=now, error="boom ✗")
        await tx.runs.save_many([ok, bad])

    await store.run(end_two)

    async def late(tx: Transaction) -> list[str]:
        outcomes = []
        ended_again = replace(runs[0])
        ended_again._end(RunStatus.DEAD, at=now, error="late reclaim")
        live = replace(runs[2])
        live._end(RunStatus.SUCCEEDED, at=now)
        unknown = replace(live, id=uuid4())
        for batch in ([live, ended_again], [live, unknown]):
            try:
                await tx.runs.save_many(batch)
            except ConcurrentUpdate:
                outcomes.append("conflict")
        return outcomes

    assert await store.run(late) == ["conflict", "conflict"]

    stored = {r.id: r for r in await store.run(lambda tx: tx.runs.get_many([r.id for r in runs]))}
    assert [(stored[r.id].status, stored[r.id].error) for r in runs] == [
        (RunStatus.SUCCEEDED, None),
        (RunStatus.FAILED, "boom ✗"),
        (RunStatus.RUNNING, None),  # the live run of the refused batches was not ended
    ]
    assert stored[runs[2].id].finished_at is None
    assert stored[runs[0].id].finished_at == now


async def test_dependents_many_lists_edges_out_of_every_given_task(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    a = new_task(job, "a", now)
    b, c, d = (new_task(job, n, now, status=TaskStatus.PENDING) for n in "bcd")
    edges = [(b.id, a.id), (c.id, a.id), (d.id, b.id), (d.id, c.id)]

    async def add_and_probe(tx: Transaction) -> list[tuple[UUID, UUID]]:
        await tx.jobs.add(job, [a, b, c, d], edges)
        return await tx.tasks.dependents_many([a.id])  # edges written in this transaction

    assert sorted(await store.run(add_and_probe)) == sorted([(a.id, b.id), (a.id, c.id)])

    async def probe(tx: Transaction) -> tuple[Any, ...]:
        return (
            await tx.tasks.dependents_many([a.id, b.id, uuid4(), a.id]),
            await tx.tasks.dependents_many([d.id]),
            await tx.tasks.dependents_many([b.id, c.id]),
        )

    from_ab, from_d, from_bc = await store.run(probe)
    assert sorted(from_ab) == sorted([(a.id, b.id), (a.id, c.id), (b.id, d.id)])
    assert from_d == []
    assert sorted(from_bc) == sorted([(b.id, d.id), (c.id, d.id)])


async def test_now_after_a_task_read_is_the_transaction_time(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "t", now)
    await add(store, job, [task])

    async def fn(tx: Transaction) -> tuple[datetime, ...]:
        await tx.tasks.get_many([task.id])
        first = await tx.now()
        await tx.tasks.get(task.id)
        conn = getattr(tx, "conn", None)  # the SQL adapter: compare with its own clock
        if conn is not None:
            row = await (await conn.execute("SELECT now()")).fetchone()
            return first, await tx.now(), row[0]
        return first, await tx.now(), first

    first, again, database = await store.run(fn)
    assert first == again == database
    assert first.utcoffset() == timedelta(0)
    assert first >= now


# --- workers ----------------------------------------------------------------------------------


async def test_workers_upsert_and_list_active_most_recent_first(store: Store) -> None:
    now = await db_now(store)
    first = Worker("w-1", "host-a", now - timedelta(seconds=30), {"kinds": ["a"], "n": 1})
    old = Worker("w-old", None, now - timedelta(minutes=10))

    async def register(tx: Transaction) -> None:
        await tx.workers.upsert(first)
        await tx.workers.upsert(old)

    await store.run(register)
    moved = Worker("w-1", "host-b", now - timedelta(seconds=5), {"kinds": ["a", "b"]})
    second = Worker("w-2", "host-c", now - timedelta(seconds=20), {})

    async def heartbeat(tx: Transaction) -> None:
        await tx.workers.upsert(moved)
        await tx.workers.upsert(second)

    await store.run(heartbeat)

    async def active(tx: Transaction, since: datetime) -> list[Worker]:
        return await tx.workers.list_active(since)

    assert await store.run(lambda tx: active(tx, now - timedelta(minutes=1))) == [moved, second]
    assert await store.run(lambda tx: active(tx, now - timedelta(hours=1))) == [moved, second, old]


async def test_a_workers_row_is_read_by_id_and_deleted_once(store: Store) -> None:
    now = await db_now(store)
    row = Worker("w-1", "host-a", now, {"kinds": ["a"]}, redis_key_prefix="{p}:")
    await store.run(lambda tx: tx.workers.upsert(row))

    async def read(tx: Transaction) -> tuple[Worker | None, Worker | None]:
        return await tx.workers.get("w-1"), await tx.workers.get("w-2")

    async def delete_twice(tx: Transaction) -> tuple[bool, bool, Worker | None]:
        first, again = await tx.workers.delete("w-1"), await tx.workers.delete("w-1")
        return first, again, await tx.workers.get("w-1")

    assert await store.run(read) == (row, None)
    assert await store.run(delete_twice) == (True, False, None)
    assert await store.run(read) == (None, None)
    assert await store.run(lambda tx: tx.workers.list_active(now - timedelta(days=1))) == []


# --- transactions -----------------------------------------------------------------------------


async def test_a_domain_error_rolls_back_everything_and_propagates(store: Store) -> None:
    now = await db_now(store)
    kept = new_job(now)
    kept_task = new_task(kept, "t", now)
    await add(store, kept, [kept_task])
    job = new_job(now, key="rolled-back")
    calls = 0

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.jobs.add(job, [new_task(job, "t", now)], [])
        changed = await tx.tasks.get(kept_task.id)
        assert changed is not None
        changed.last_error = "should vanish"
        await tx.tasks.save(changed)
        await tx.workers.upsert(Worker("w", None, now))
        raise TaskNotFound("boom")

    with pytest.raises(TaskNotFound, match="boom"):
        await store.run(fn)
    assert calls == 1

    async def fetch(tx: Transaction) -> tuple[Any, ...]:
        return (
            await tx.jobs.get(job.id),
            await tx.jobs.get_by_idempotency_key("rolled-back"),
            await tx.tasks.get(kept_task.id),
            await tx.workers.list_active(now - timedelta(days=1)),
        )

    assert await store.run(fetch) == (None, None, kept_task, [])


async def test_now_is_aware_utc_and_fixed_within_a_try(store: Store) -> None:
    async def fn(tx: Transaction) -> tuple[datetime, datetime]:
        return await tx.now(), await tx.now()

    first, again = await store.run(fn)
    assert first == again
    assert first.tzinfo is not None
    assert first.utcoffset() == timedelta(0)
    assert abs(first - datetime.now(UTC)) < timedelta(days=3650)


async def test_run_returns_the_function_result(store: Store) -> None:
    async def fn(tx: Transaction) -> dict[str, int]:
        return {"answer": 42}

    assert await store.run(fn) == {"answer": 42}
    await store.ping()


async def test_one_row_batches_keep_the_batch_guards(store: Store) -> None:
    """A batch of one row takes the single-row statement in the SQL adapter: same CAS, same
    errors, same version bump as a batch of many."""
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "only", now, status=TaskStatus.RUNNING)
    await add(store, job, [task])
    run = new_run(task, now)

    async def first(tx: Transaction) -> tuple[int, int]:
        await tx.runs.add_many([replace(run)])
        fresh = (await tx.tasks.get_many([task.id]))[0]
        fresh.last_error = "one"
        await tx.tasks.save_many([fresh])
        jobs = await tx.jobs.get_many([job.id])
        jobs[0].set_status(JobStatus.RUNNING, at=now)
        await tx.jobs.save_many(jobs)
        return fresh.version, jobs[0].version

    assert await store.run(first) == (1, 1)

    async def stale(tx: Transaction) -> list[str]:
        outcomes = []
        old_task = replace(task)  # version 0, the stored row is at 1
        old_task.last_error = "stale"
        old_job = replace(job)
        old_job.set_status(JobStatus.FAILED, at=now)
        ended = replace(run)
        ended._end(RunStatus.SUCCEEDED, at=now)
        for write in (
            lambda: tx.tasks.save_many([old_task]),
            lambda: tx.jobs.save_many([old_job]),
        ):
            try:
                await write()
            except ConcurrentUpdate:
                outcomes.append("conflict")
        await tx.runs.save_many([ended])  # still running: written
        again = replace(run)
        again._end(RunStatus.DEAD, at=now, error="late")
        try:
            await tx.runs.save_many([again])
        except ConcurrentUpdate:
            outcomes.append("conflict")
        return outcomes

    assert await store.run(stale) == ["conflict", "conflict", "conflict"]
    stored_task = (await store.run(lambda tx: tx.tasks.get_many([task.id])))[0]
    stored_run = (await store.run(lambda tx: tx.runs.get_many([run.id])))[0]
    assert (stored_task.last_error, stored_task.version) == ("one", 1)
    assert stored_run.status is RunStatus.SUCCEEDED


# --- results and fan-in (issue 13) ------------------------------------------------------------


async def test_results_are_saved_by_save_and_save_many_and_read_back_equal(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    tasks = [new_task(job, f"t{i}", now) for i in range(len(PAYLOADS))]
    single = new_task(job, "single", now)
    await add(store, job, [*tasks, single])

    async def write(tx: Transaction) -> None:
        fresh = await tx.tasks.get_many([t.id for t in tasks])
        for task in fresh:
            task.result = PAYLOADS[int(task.name[1:])]
        await tx.tasks.save_many(fresh)
        one = await tx.tasks.get(single.id)
        assert one is not None
        one.result = {"only": "me"}
        await tx.tasks.save(one)

    await store.run(write)

    stored = {t.name: t for t in await read(store, lambda tx: tx.tasks.list_by_job(job.id))}
    assert [stored[f"t{i}"].result for i in range(len(PAYLOADS))] == PAYLOADS
    assert stored["single"].result == {"only": "me"}


async def test_a_new_task_has_no_result(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    task = new_task(job, "a", now)
    await add(store, job, [task])
    stored = await get_task(store, task.id)
    assert stored is not None and stored.result is None


async def test_parent_results_name_each_direct_dependency_of_each_task(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    a = new_task(job, "a", now, status=TaskStatus.COMPLETED, result={"x": 1})
    b = new_task(job, "b", now, status=TaskStatus.COMPLETED, result=[1, "two"])
    c = new_task(job, "c", now, status=TaskStatus.RUNNING)
    d = new_task(job, "d", now, status=TaskStatus.PENDING)
    lone = new_task(job, "lone", now)
    await add(store, job, [a, b, c, d, lone], [(c.id, a.id), (c.id, b.id), (d.id, c.id)])

    found = await read(store, lambda tx: tx.tasks.parent_results([c.id, d.id, lone.id, uuid4()]))

    assert found == {c.id: {"a": {"x": 1}, "b": [1, "two"]}, d.id: {"c": None}}
    assert await read(store, lambda tx: tx.tasks.parent_results([])) == {}


async def test_results_page_lists_a_job_in_position_order_after_the_cursor(store: Store) -> None:
    now = await db_now(store)
    job, other = new_job(now), new_job(now)
    tasks = [new_task(job, f"n{9 - i}", now, position=i) for i in range(5)]
    await add(store, job, tasks)
    await add(store, other, [new_task(other, "x", now, position=0)])

    first = await read(store, lambda tx: tx.tasks.results_page(job.id, after=None, limit=2))
    cursor = (first[-1].position, first[-1].id)
    rest = await read(store, lambda tx: tx.tasks.results_page(job.id, after=cursor, limit=10))

    assert [t.name for t in first] == ["n9", "n8"]
    assert [t.name for t in rest] == ["n7", "n6", "n5"]
    assert [t.position for t in rest] == [2, 3, 4]
    none = await read(store, lambda tx: tx.tasks.results_page(uuid4(), after=None, limit=5))
    assert none == []


# --- progress (issue 13 item 5) ---------------------------------------------------------------


async def test_save_progress_writes_only_live_runs_in_one_call_and_keeps_the_version(
    store: Store,
) -> None:
    now = await db_now(store)
    job = new_job(now)
    live_run, other_run = uuid4(), uuid4()
    live = new_task(job, "live", now, status=TaskStatus.RUNNING, current_run_id=live_run)
    moved = new_task(job, "moved", now, status=TaskStatus.RUNNING, current_run_id=other_run)
    done = new_task(job, "done", now, status=TaskStatus.COMPLETED, current_run_id=live_run)
    await add(store, job, [live, moved, done])
    stale_run = uuid4()

    written = await read(
        store,
        lambda tx: tx.tasks.save_progress(
            [
                (live.id, live_run, PAYLOADS[0]),
                (moved.id, stale_run, "stale"),
                (done.id, live_run, "too late"),
                (uuid4(), live_run, "unknown"),
            ]
        ),
    )

    assert written == {live.id}
    stored = {t.name: t for t in await read(store, lambda tx: tx.tasks.list_by_job(job.id))}
    assert stored["live"].progress == PAYLOADS[0]
    assert stored["live"].version == live.version  # not a state change: no version bump
    assert (stored["moved"].progress, stored["done"].progress) == (None, None)
    assert await read(store, lambda tx: tx.tasks.save_progress([])) == set()


async def test_progress_is_saved_by_save_many_and_inserted_with_the_task(store: Store) -> None:
    now = await db_now(store)
    job = new_job(now)
    carried = new_task(job, "carried", now, progress={"chunk": 3})
    plain = new_task(job, "plain", now)
    await add(store, job, [carried, plain])

    async def write(tx: Transaction) -> None:
        fresh = await tx.tasks.get(plain.id)
        assert fresh is not None
        fresh.progress = [1, "two"]
        await tx.tasks.save_many([fresh])

    await store.run(write)

    stored = {t.name: t for t in await read(store, lambda tx: tx.tasks.list_by_job(job.id))}
    assert stored["carried"].progress == {"chunk": 3}
    assert stored["plain"].progress == [1, "two"]
