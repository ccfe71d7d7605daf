"""Retention on the memory adapters (issue 14 item 8): finished jobs are deleted after their
status's retention, never while a task is unfinished; an Idempotency-Key of a pruned job keeps
answering its original ids through a tombstone until the key's TTL."""

from __future__ import annotations

import asyncio
from uuid import UUID

import pytest
from prometheus_client import CollectorRegistry

from dtq.adapters.memory.retention import MemoryRetention
from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import PrunedJobs, Transaction
from dtq.application.retention import PruneReport, RetentionPolicy, RetentionService
from dtq.application.transitions import settle_jobs
from dtq.domain.errors import IdempotencyConflict, JobNotFound
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.metrics import OrchestratorMetrics
from dtq.entrypoints.reconciler import Reconciler
from tests.single import complete_one
from tests.unit.conftest import App
from tests.unit.test_reconciler_loop import RecordingLog
from tests.unit.test_service_execution import pop_claim

DAY = 86400.0
POLICY = RetentionPolicy(completed=7 * DAY, failed=30 * DAY, idempotency_key_ttl=7 * DAY)


def retention(app: App, policy: RetentionPolicy = POLICY, **bounds: int) -> RetentionService:
    return RetentionService(store=app.store, policy=policy, **bounds)


async def run_all(app: App, count: int) -> None:
    """Claim and complete ``count`` tasks, one at a time, as a worker would."""
    for _ in range(count):
        await complete_one(app.execution, await pop_claim(app))


async def completed_job(app: App, *, key: str | None = None, body: str = "h1") -> SubmitResult:
    """A job a -> b run to completion now (on the fake clock)."""
    result = await app.submit.submit_job(job_cmd(key=key, body=body))
    await run_all(app, 2)
    return result


def job_cmd(*, key: str | None = None, body: str = "h1") -> SubmitJob:
    return SubmitJob(
        tasks=(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",))),
        idempotency_key=key,
        request_hash=body if key else None,
    )


async def job_exists(app: App, job_id: UUID) -> bool:
    try:
        await app.queries.get_job(job_id)
    except JobNotFound:
        return False
    return True


async def cancel_all(app: App, job_id: UUID) -> None:
    """Cancel every task of the job (they must be pending or queued) and settle the job."""

    async def cancel(tx: Transaction) -> None:
        now = await tx.now()
        for task in await tx.tasks.list_by_job(job_id):
            task.cancel(at=now)
            await tx.tasks.save(task)
        await settle_jobs(tx, [job_id], at=now)

    await app.store.run(cancel)


# --- by age, per status -----------------------------------------------------------------------


async def test_a_completed_job_is_pruned_with_its_tasks_and_runs_once_its_retention_passed(
    app: App,
) -> None:
    result = await completed_job(app)
    service = retention(app)

    app.clock.advance(7 * DAY - 1)
    assert await service.prune_once() == PruneReport()
    assert await job_exists(app, result.job_id)

    app.clock.advance(2)
    assert await service.prune_once() == PruneReport(jobs=1, tasks=2, runs=2)
    assert not await job_exists(app, result.job_id)
    tables = app.store._tables
    assert not tables.tasks and not tables.runs and not tables.jobs
    assert not any(tables.dependents.values()) and not any(tables.dependencies.values())


async def test_failed_and_cancelled_jobs_are_kept_for_the_failed_retention(app: App) -> None:
    failed = await app.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "echo", max_attempts=1),)))
    await app.execution.fail(await pop_claim(app), "ValueError: boom")
    cancelled = await app.submit.submit_job(SubmitJob(tasks=(TaskSpec("c", "echo"),)))
    await cancel_all(app, cancelled.job_id)
    assert (await app.queries.get_job(cancelled.job_id)).job.status is JobStatus.CANCELLED
    service = retention(app)

    app.clock.advance(29 * DAY)
    assert (await service.prune_once()).jobs == 0

    app.clock.advance(DAY + 1)
    assert await service.prune_once() == PruneReport(jobs=2, tasks=2, runs=1)
    assert not await job_exists(app, failed.job_id)
    assert not await job_exists(app, cancelled.job_id)


async def test_a_failed_job_is_kept_while_a_task_runs_and_then_for_its_retention(app: App) -> None:
    result = await app.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "echo")))
    )
    first, second = await pop_claim(app), await pop_claim(app)
    doomed, survivor = (first, second) if first.task.name == "a" else (second, first)
    await app.execution.fail(doomed, "ValueError: boom")  # the job is failed from now on
    service = retention(app)

    app.clock.advance(31 * DAY)
    assert (await service.prune_once()).jobs == 0  # b is still running

    await complete_one(app.execution, survivor)  # the job's last task ends 31 days late
    app.clock.advance(29 * DAY)
    assert (await service.prune_once()).jobs == 0  # finished 29 days ago: kept
    app.clock.advance(DAY + 1)
    assert (await service.prune_once()).jobs == 1
    assert not await job_exists(app, result.job_id)


async def test_a_running_job_is_never_pruned(app: App) -> None:
    result = await app.submit.submit_job(job_cmd())
    await run_all(app, 1)  # a completed, b queued
    app.clock.advance(365 * DAY)
    assert await retention(app).prune_once() == PruneReport()
    assert await job_exists(app, result.job_id)


async def test_zero_disables_each_retention(app: App) -> None:
    done = await completed_job(app)
    failed = await app.submit.submit_job(SubmitJob(tasks=(TaskSpec("f", "echo", max_attempts=1),)))
    await app.execution.fail(await pop_claim(app), "ValueError: boom")
    app.clock.advance(3650 * DAY)

    keep_completed = RetentionPolicy(completed=0, failed=DAY, idempotency_key_ttl=DAY)
    assert (await retention(app, keep_completed).prune_once()).jobs == 1
    assert await job_exists(app, done.job_id)
    assert not await job_exists(app, failed.job_id)

    keep_all = RetentionPolicy(completed=0, failed=0, idempotency_key_ttl=DAY)
    assert await retention(app, keep_all).prune_once() == PruneReport()
    assert await job_exists(app, done.job_id)


def test_negative_retentions_and_empty_batches_are_refused(app: App) -> None:
    with pytest.raises(ValueError, match="negative"):
        retention(app, RetentionPolicy(completed=-1))
    with pytest.raises(ValueError, match="at least 1"):
        retention(app, batch_jobs=0)


# --- idempotency tombstones -------------------------------------------------------------------


async def test_a_pruned_jobs_key_replays_its_original_ids_and_creates_nothing(app: App) -> None:
    original = await completed_job(app, key="order-1")
    app.clock.advance(7 * DAY + 1)
    assert await retention(app).prune_once() == PruneReport(
        jobs=1, tasks=2, runs=2, tombstones_written=1
    )

    replay = await app.submit.submit_job(job_cmd(key="order-1"))

    assert (replay.job_id, replay.task_ids, replay.created) == (
        original.job_id,
        original.task_ids,
        False,
    )
    assert not app.store._tables.jobs and not app.store._tables.tasks
    assert app.queue.ready_ids("default") == []


async def test_a_pruned_jobs_key_with_a_different_body_is_a_conflict(app: App) -> None:
    await completed_job(app, key="order-1", body="h1")
    app.clock.advance(7 * DAY + 1)
    await retention(app).prune_once()

    with pytest.raises(IdempotencyConflict) as caught:
        await app.submit.submit_job(job_cmd(key="order-1", body="h2"))

    assert caught.value.field == "Idempotency-Key"
    assert not app.store._tables.jobs


async def test_a_tombstone_expires_after_the_key_ttl_and_the_key_is_free_again(app: App) -> None:
    original = await completed_job(app, key="order-1")
    app.clock.advance(7 * DAY + 1)
    service = retention(app)
    await service.prune_once()

    app.clock.advance(7 * DAY - 2)
    assert (await service.prune_once()).tombstones == 0
    assert not (await app.submit.submit_job(job_cmd(key="order-1"))).created

    app.clock.advance(3)
    assert await service.prune_once() == PruneReport(tombstones=1)
    fresh = await app.submit.submit_job(job_cmd(key="order-1"))
    assert fresh.created and fresh.job_id != original.job_id


async def test_a_zero_key_ttl_writes_no_tombstone(app: App) -> None:
    original = await completed_job(app, key="order-1")
    app.clock.advance(7 * DAY + 1)
    no_keys = RetentionPolicy(completed=7 * DAY, failed=30 * DAY, idempotency_key_ttl=0)
    assert (await retention(app, no_keys).prune_once()).tombstones_written == 0

    again = await app.submit.submit_job(job_cmd(key="order-1"))
    assert again.created and again.job_id != original.job_id


# --- bounds and cursors -----------------------------------------------------------------------


async def test_jobs_that_cannot_go_yet_do_not_hold_back_those_behind_them(app: App) -> None:
    """Failed jobs with a task still queued sit first in (updated_at, id) order; the keyset
    cursor moves past them, so the deletable job behind them is reached on the next pass."""
    blocked = []
    for _ in range(2):
        job = await app.submit.submit_job(
            SubmitJob(tasks=(TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "slow")))
        )
        blocked.append(job.job_id)
        claim = await pop_claim(app)
        await app.execution.fail(claim, "ValueError: boom")
        await pop_claim(app)  # b of this job is running and stays so
        app.clock.advance(1)
    done = await app.submit.submit_job(SubmitJob(tasks=(TaskSpec("x", "echo", max_attempts=1),)))
    await app.execution.fail(await pop_claim(app), "ValueError: boom")
    app.clock.advance(31 * DAY)
    assert [(await app.queries.get_job(j)).job.status for j in blocked] == [JobStatus.FAILED] * 2
    service = retention(app, batch_jobs=2, max_pages=1)

    assert (await service.prune_once()).jobs == 0  # the page held the two blocked jobs
    assert (await service.prune_once()).jobs == 1
    assert not await job_exists(app, done.job_id)
    assert all([await job_exists(app, job_id) for job_id in blocked])


async def test_a_page_is_deleted_in_transactions_of_at_most_batch_tasks_whole_jobs(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(5):
        await completed_job(app)  # two tasks each
    app.clock.advance(7 * DAY + 1)
    calls: list[int] = []
    original = MemoryRetention.delete_jobs

    async def recording(self: MemoryRetention, job_ids: list[UUID], **kw: object) -> PrunedJobs:
        result = await original(self, job_ids, **kw)  # type: ignore[arg-type]
        calls.append(result.tasks)
        return result

    monkeypatch.setattr(MemoryRetention, "delete_jobs", recording)

    report = await retention(app, batch_jobs=4, batch_tasks=5, max_pages=1).prune_once()

    assert report.jobs == 4  # one page of four jobs per pass
    assert calls == [4, 4]  # two jobs (four tasks) per transaction: a third would make six
    assert (await retention(app).prune_once()).jobs == 1


# --- the reconciler loop: metric and log ------------------------------------------------------


async def test_the_reconciler_counts_what_it_pruned_and_logs_the_pass(app: App) -> None:
    await completed_job(app, key="k")
    app.clock.advance(7 * DAY + 1)
    registry, log = CollectorRegistry(), RecordingLog()
    reconciler = Reconciler(
        app.reconcile,
        interval=1,
        promote_interval=1,
        batch=10,
        metrics=OrchestratorMetrics(registry),
        logger=log,
        retention=retention(app),
    )

    report = await reconciler.prune_pass()
    assert report is not None and report.jobs == 1
    assert await reconciler.prune_pass() == PruneReport()  # nothing left: no second line

    def pruned(what: str) -> float | None:
        return registry.get_sample_value("orchestrator_pruned_total", {"what": what})

    assert (pruned("jobs"), pruned("tasks"), pruned("runs")) == (1, 2, 2)
    lines = [fields for level, event, fields in log.records if event == "retention pass"]
    assert len(lines) == 1 and lines[0]["jobs"] == 1 and lines[0]["tombstones_written"] == 1


async def test_a_failing_retention_pass_is_logged_and_the_loop_goes_on(app: App) -> None:
    registry, log = CollectorRegistry(), RecordingLog()
    reconciler = Reconciler(
        app.reconcile,
        interval=1,
        promote_interval=1,
        batch=10,
        metrics=OrchestratorMetrics(registry),
        logger=log,
        retention=retention(app),
    )
    app.store.available = False
    assert await reconciler.prune_pass() is None
    assert any("retention pass failed" in event for event, _ in log.warnings())
    assert registry.get_sample_value("orchestrator_reconcile_errors_total") == 1
    app.store.available = True
    assert await reconciler.prune_pass() == PruneReport()


async def test_the_status_of_a_pruned_jobs_task_is_gone(app: App) -> None:
    result = await completed_job(app)
    app.clock.advance(7 * DAY + 1)
    await retention(app).prune_once()

    async def read(tx: Transaction) -> list[TaskStatus]:
        found = await tx.tasks.get_many(list(result.task_ids.values()))
        return [task.status for task in found]

    assert await app.store.run(read) == []


async def test_the_container_wires_the_retention_settings_into_the_reconcilers_bundle() -> None:
    """``dtq dev`` and ``dtq orchestrator`` get the pass from the container, on the store the
    API writes to, with the settings' periods (here 1 ms for completed jobs, failed kept)."""
    settings = Settings(retention_completed=0.001, retention_failed=0)
    async with open_services(settings, backend="memory") as services:
        done = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "echo"),)))
        ids = await services.queue.pop_many(["default"], 0, 1)
        claims = await services.worker.execution.claim_many(ids, "w1")
        await services.worker.execution.complete_many(claims)
        await asyncio.sleep(0.01)

        report = await services.reconciler.retention.prune_once()

        assert (report.jobs, report.tasks, report.runs) == (1, 1, 1)
        with pytest.raises(JobNotFound):
            await services.api.queries.get_job(done.job_id)


async def test_the_retention_loop_drains_a_backlog_without_waiting_an_interval(app: App) -> None:
    """Passes bounded to two jobs each: the loop runs the next pass at once while the last one
    stopped at its bound, so ten jobs go long before a second interval (an hour) is due."""
    for _ in range(10):
        await completed_job(app)
    app.clock.advance(7 * DAY + 1)
    reconciler = Reconciler(
        app.reconcile,
        interval=3600,
        promote_interval=3600,
        batch=10,
        logger=RecordingLog(),
        retention=retention(app, batch_jobs=2, max_pages=1),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(reconciler.run(stop))
    async with asyncio.timeout(5):
        while app.store._tables.jobs:
            await asyncio.sleep(0.01)
    stop.set()
    await task
    assert not app.store._tables.tasks


async def test_a_pass_that_stopped_at_its_bound_says_more_is_left(app: App) -> None:
    for _ in range(3):
        await completed_job(app)
    app.clock.advance(7 * DAY + 1)
    service = retention(app, batch_jobs=2, max_pages=1)

    first, second = await service.prune_once(), await service.prune_once()

    assert (first.jobs, first.more) == (2, True)
    assert (second.jobs, second.more) == (1, False)
