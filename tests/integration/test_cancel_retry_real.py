"""Cancel and manual retry racing the worker's and the reconciler's writes, on PostgreSQL with
SERIALIZABLE and Redis (issue 14, "Bad input and races"): cancel vs completion, cancel vs claim,
cancel vs reclaim, retry vs a late report of the old run.

After each race: nothing is lost (the task ends in one of the allowed states), a terminal state
changes only through the explicit retry, and every run is accounted for: it ended exactly once
(no run is left ``running`` unless it is the task's live run) and the outcome its report got
agrees with the status it ended in.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import KeyLayout, RedisQueue
from dtq.application.commands import ExecutionPolicy, ReportOutcome, SubmitJob, TaskSpec, TaskView
from dtq.application.ports import LeaseState
from dtq.domain.errors import NotCancellable
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready, services_on

pytestmark = pytest.mark.integration

POLICY = ExecutionPolicy(lease_duration=5.0, retry_backoff=0.1, stale_running_after=0.3)
ROUNDS = 6


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    await redis_client.set(KeyLayout(redis_prefix).epoch, "fixture|0")
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix), policy=POLICY)


async def submit(services: Services, n: int, **spec: Any) -> list[UUID]:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo", **spec) for i in range(n)))
    )
    return [result.task_ids[f"t{i}"] for i in range(n)]


async def view(services: Services, task_id: UUID) -> TaskView:
    return await services.api.queries.get_task(task_id)


def assert_runs_ended_once(task_view: TaskView) -> None:
    """No run is still ``running`` except the task's live one."""
    task = task_view.task
    for run in task_view.runs:
        if run.status is RunStatus.RUNNING:
            assert task.status is TaskStatus.RUNNING and task.current_run_id == run.id
        else:
            assert run.finished_at is not None


async def test_cancel_vs_completion(services: Services) -> None:
    ids = await submit(services, ROUNDS)
    claims = await claim_ready(services)
    assert len(claims) == ROUNDS
    control, execution = services.api.control, services.worker.execution

    async def cancel(task_id: UUID) -> str:
        try:
            await control.cancel_task(task_id)
        except NotCancellable:
            return "refused"
        return "cancelled"

    results = await asyncio.gather(
        *(cancel(c.task.id) for c in claims),
        *(execution.complete_many([c]) for c in claims),
    )
    cancels, completions = results[:ROUNDS], [r[0] for r in results[ROUNDS:]]

    for claim, cancelled, completion in zip(claims, cancels, completions, strict=True):
        task_view = await view(services, claim.task.id)
        [run] = task_view.runs
        assert_runs_ended_once(task_view)
        if completion is ReportOutcome.RECORDED:  # the success committed first and won
            assert cancelled == "refused"
            assert (task_view.task.status, run.status) == (
                TaskStatus.COMPLETED,
                RunStatus.SUCCEEDED,
            )
        else:  # the cancel committed first: the report was fenced
            assert (cancelled, completion) == ("cancelled", ReportOutcome.STALE)
            assert (task_view.task.status, run.status) == (
                TaskStatus.CANCELLED,
                RunStatus.CANCELLED,
            )
    job = (await services.api.queries.get_job(claims[0].task.job_id)).job
    expected = JobStatus.COMPLETED if "cancelled" not in cancels else JobStatus.CANCELLED
    assert job.status is expected
    assert sorted(ids) == sorted(c.task.id for c in claims)


async def test_cancel_vs_claim(services: Services) -> None:
    ids = await submit(services, ROUNDS)
    control, execution = services.api.control, services.worker.execution

    async def claim() -> list[Any]:
        popped = await services.queue.pop_many(["default"], timeout=0.2, max_count=ROUNDS)
        return await execution.claim_many(popped, "w1")

    results = await asyncio.gather(claim(), *(control.cancel_task(i) for i in ids))
    claims = results[0]

    assert all(status is TaskStatus.CANCELLED for status, _ in results[1:])
    for task_id in ids:
        task_view = await view(services, task_id)
        assert task_view.task.status is TaskStatus.CANCELLED
        assert_runs_ended_once(task_view)
        assert all(run.status is RunStatus.CANCELLED for run in task_view.runs)
        assert len(task_view.runs) <= 1
    for c in claims:  # a claim that won its race was cancelled after: its report is fenced
        assert (await execution.complete_many([c]))[0] is ReportOutcome.STALE
        assert await execution.heartbeat(c) in (LeaseState.CANCELLED, LeaseState.EXTENDED)


async def test_cancel_vs_reclaim(services: Services, redis_client: Redis) -> None:
    ids = await submit(services, ROUNDS)
    claims = await claim_ready(services)
    assert len(claims) == ROUNDS
    # the worker died: its leases are gone and its runs grow stale
    await services.queue.delete_leases([(c.task.id, c.run.id) for c in claims])
    await asyncio.sleep(POLICY.stale_running_after + 0.2)
    control, reconcile = services.api.control, services.reconciler.reconcile

    async def cancel(task_id: UUID) -> TaskStatus:
        status, _ = await control.cancel_task(task_id)
        return status

    results = await asyncio.gather(reconcile.reclaim_stale(), *(cancel(i) for i in ids))

    assert all(status is TaskStatus.CANCELLED for status in results[1:])
    for claim in claims:
        task_view = await view(services, claim.task.id)
        assert task_view.task.status is TaskStatus.CANCELLED
        assert_runs_ended_once(task_view)
        [run] = task_view.runs  # a reclaimed task was cancelled before a second run
        assert run.status in (RunStatus.DEAD, RunStatus.CANCELLED)
        assert (await services.worker.execution.complete_many([claim]))[0] is ReportOutcome.STALE
    # a re-pushed delivery of a reclaimed, then cancelled task is refused at claim
    assert await claim_ready(services) == []


async def test_retry_vs_a_late_report_of_the_old_run(services: Services) -> None:
    ids = await submit(services, ROUNDS, max_attempts=1)
    claims = await claim_ready(services)
    execution, control = services.worker.execution, services.api.control
    half = ROUNDS // 2
    for c in claims[:half]:  # these failed for good...
        assert (await execution.fail(c, "boom", permanent=True)).outcome is ReportOutcome.RECORDED
    for c in claims[half:]:  # ...these were cancelled while they ran
        await control.cancel_task(c.task.id)

    results = await asyncio.gather(
        *(control.retry_task(c.task.id) for c in claims),
        *(execution.complete_many([c]) for c in claims),
    )

    assert all(status is TaskStatus.QUEUED for status, _ in results[:ROUNDS])
    assert all(r[0] is ReportOutcome.STALE for r in results[ROUNDS:])
    for i, claim in enumerate(claims):
        task_view = await view(services, claim.task.id)
        assert (task_view.task.status, task_view.task.attempt) == (TaskStatus.QUEUED, 0)
        [run] = task_view.runs
        assert run.status is (RunStatus.FAILED if i < half else RunStatus.CANCELLED)
    job = (await services.api.queries.get_job(claims[0].task.job_id)).job
    assert job.status is JobStatus.RUNNING

    # the retried tasks run again and complete: the job completes, every earlier run kept
    again = await claim_ready(services, "w2")
    assert sorted(c.task.id for c in again) == sorted(ids)
    assert set(await execution.complete_many(again)) == {ReportOutcome.RECORDED}
    job = (await services.api.queries.get_job(claims[0].task.job_id)).job
    assert job.status is JobStatus.COMPLETED
    for claim in claims:
        statuses = [run.status for run in (await view(services, claim.task.id)).runs]
        assert statuses[-1] is RunStatus.SUCCEEDED and len(statuses) == 2
