"""``Job.trace_context`` (issue 16 item 5) survives the store: every job read returns what the
submit stored, and no job write changes it. Runs on the memory fake and on PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import uuid4

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.filters import JobFilter
from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Job, Task
from dtq.domain.status import JobStatus
from tests.single import queued_task

TRACE_CONTEXT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> Store:
    """The in-memory fake, then ``CockroachStore`` on PostgreSQL."""
    if request.param == "memory":
        return InMemoryStore(FakeClock())
    result: Store = request.getfixturevalue("pg_store")
    return result


def job_at(now: datetime, trace_context: str | None, *, key: str | None = None) -> Job:
    return Job(
        id=uuid4(),
        name="traced",
        status=JobStatus.PENDING,
        created_at=now,
        updated_at=now,
        idempotency_key=key,
        request_hash="hash" if key else None,
        trace_context=trace_context,
    )


def task_of(job: Job, now: datetime) -> Task:
    return queued_task(job.id, now, name="t")


async def test_every_job_read_returns_the_stored_trace_context_and_writes_keep_it(
    store: Store,
) -> None:
    now = await store.run(lambda tx: tx.now())
    traced = job_at(now, TRACE_CONTEXT, key=f"trace-{uuid4()}")
    untraced = job_at(now, None)
    for job in (traced, untraced):

        async def add(tx: Transaction, job: Job = job) -> None:
            await tx.jobs.add(job, [task_of(job, now)], [])

        await store.run(add)

    async def read(tx: Transaction) -> list[str | None]:
        got = await tx.jobs.get(traced.id)
        by_key = await tx.jobs.get_by_idempotency_key(traced.idempotency_key or "")
        many = {job.id: job for job in await tx.jobs.get_many([traced.id, untraced.id])}
        listed = {job.id: job for job in await tx.jobs.list_page(JobFilter(), after=None, limit=10)}
        assert got is not None and by_key is not None
        return [
            got.trace_context,
            by_key.trace_context,
            many[traced.id].trace_context,
            many[untraced.id].trace_context,
            listed[traced.id].trace_context,
            listed[untraced.id].trace_context,
        ]

    assert await store.run(read) == [TRACE_CONTEXT] * 3 + [None, TRACE_CONTEXT, None]

    async def finish(tx: Transaction) -> None:
        [single] = await tx.jobs.get_many([traced.id])
        single.set_status(JobStatus.RUNNING, at=now + timedelta(seconds=1))
        await tx.jobs.save(single)
        single.set_status(JobStatus.COMPLETED, at=now + timedelta(seconds=2))
        await tx.jobs.save_many([single])

    await store.run(finish)
    after = await store.run(lambda tx: tx.jobs.get(traced.id))
    assert after is not None
    assert (after.status, after.trace_context) == (JobStatus.COMPLETED, TRACE_CONTEXT)
