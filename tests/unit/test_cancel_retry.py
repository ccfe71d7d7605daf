"""Cancel and manual retry on the memory adapters (issue 14 items 1 and 4): the transitions,
their cascades, idempotence, the 409s and 404s, the heartbeat's CANCELLED and the fences that
refuse a late report."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest

from dtq.application.commands import Claim, ReportOutcome, TaskSpec
from dtq.application.control import CANCEL_PAGE_SIZE, ControlService
from dtq.application.ports import LeaseState
from dtq.domain.entities import CANCELLED_ERROR
from dtq.domain.errors import JobNotFound, NotCancellable, NotRetryable, TaskNotFound
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from tests.single import claim_one, complete_one, pop_one
from tests.unit.conftest import App


def control(app: App, batch_size: int = 500) -> ControlService:
    return ControlService(store=app.store, queue=app.queue, batch_size=batch_size)


def count_transactions(app: App) -> list[int]:
    """From now on, count ``app.store``'s transactions in the returned list's one item."""
    count = [0]
    real_run = app.store.run

    async def counting_run(fn: Any) -> Any:
        count[0] += 1
        return await real_run(fn)

    app.store.run = counting_run  # type: ignore[method-assign]
    return count


async def pop_claim(app: App, worker: str = "w1") -> Claim:
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None, "nothing on the ready list"
    claim = await claim_one(app.execution, task_id, worker)
    assert claim is not None, "claim refused"
    return claim


async def status_of(app: App, task_id: UUID) -> TaskStatus:
    return (await app.queries.get_task(task_id)).task.status


async def job_status(app: App, job_id: UUID) -> JobStatus:
    return (await app.queries.get_job(job_id)).job.status


async def fail_for_good(app: App, claim: Claim) -> None:
    outcome = await app.execution.fail(claim, "boom", permanent=True)
    assert outcome.outcome is ReportOutcome.RECORDED and not outcome.retried


# --- cancel -----------------------------------------------------------------------------------


async def test_cancel_of_a_queued_task_is_immediate_and_releases_its_marker(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    assert app.queue.has_marker(task_id)

    assert await control(app).cancel_task(task_id) == (TaskStatus.CANCELLED, 0)

    view = await app.queries.get_task(task_id)
    assert view.task.status is TaskStatus.CANCELLED and view.task.finished_at is not None
    assert view.runs == []
    assert not app.queue.has_marker(task_id)
    assert await job_status(app, result.job_id) is JobStatus.CANCELLED
    # its Redis delivery is harmless: refused at claim
    popped = await pop_one(app.queue, ["default"], timeout=0)
    assert popped == task_id
    assert await claim_one(app.execution, task_id, "w1") is None
    assert (await app.queries.get_task(task_id)).runs == []


async def test_cancel_cascades_to_pending_dependents_transitively(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("c", "echo", depends_on=("b",)),
        TaskSpec("x", "echo"),  # independent: untouched
    )
    ids = result.task_ids

    assert await control(app).cancel_task(ids["a"]) == (TaskStatus.CANCELLED, 2)

    for name in ("a", "b", "c"):
        assert await status_of(app, ids[name]) is TaskStatus.CANCELLED
    assert (await app.queries.get_task(ids["c"])).task.last_error == "dependency 'b' cancelled"
    assert await status_of(app, ids["x"]) is TaskStatus.QUEUED
    assert await job_status(app, result.job_id) is JobStatus.PENDING  # x is still unfinished


async def test_cancel_of_a_running_task_closes_its_run_and_the_heartbeat_says_cancelled(
    app: App,
) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    assert await app.execution.heartbeat(claim) is LeaseState.EXTENDED

    await control(app).cancel_task(claim.task.id)

    view = await app.queries.get_task(claim.task.id)
    assert view.task.status is TaskStatus.CANCELLED and view.task.current_run_id is None
    [run] = view.runs
    assert (run.id, run.status, run.error) == (claim.run.id, RunStatus.CANCELLED, CANCELLED_ERROR)
    assert run.finished_at is not None
    assert app.queue.get_lease(claim.task.id) is None  # deleted after the commit
    assert await app.execution.heartbeat(claim) is LeaseState.CANCELLED
    assert await job_status(app, result.job_id) is JobStatus.CANCELLED
    # a report after the cancel is fenced: nothing changes
    assert await complete_one(app.execution, claim) is ReportOutcome.STALE
    assert (await app.execution.fail(claim, "late")).outcome is ReportOutcome.STALE
    view = await app.queries.get_task(claim.task.id)
    assert view.task.status is TaskStatus.CANCELLED
    assert [r.status for r in view.runs] == [RunStatus.CANCELLED]


async def test_a_success_that_committed_first_wins_over_the_cancel(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    assert await complete_one(app.execution, claim) is ReportOutcome.RECORDED

    with pytest.raises(NotCancellable) as refused:
        await control(app).cancel_task(claim.task.id)

    assert refused.value.code == "not_cancellable"
    assert await status_of(app, claim.task.id) is TaskStatus.COMPLETED


async def test_cancel_of_a_failed_task_is_not_cancellable(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo", max_attempts=1))
    claim = await pop_claim(app)
    await fail_for_good(app, claim)
    with pytest.raises(NotCancellable):
        await control(app).cancel_task(claim.task.id)
    assert await status_of(app, claim.task.id) is TaskStatus.FAILED


async def test_cancelling_a_cancelled_task_again_changes_nothing(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    await control(app).cancel_task(task_id)
    before = (await app.queries.get_task(task_id)).task

    assert await control(app).cancel_task(task_id) == (TaskStatus.CANCELLED, 0)

    after = (await app.queries.get_task(task_id)).task
    assert (after.version, after.updated_at) == (before.version, before.updated_at)


async def test_cancel_and_retry_of_an_unknown_task_are_not_found(app: App) -> None:
    with pytest.raises(TaskNotFound):
        await control(app).cancel_task(uuid4())
    with pytest.raises(TaskNotFound):
        await control(app).retry_task(uuid4())
    with pytest.raises(JobNotFound):
        await control(app).cancel_job(uuid4())


async def test_cancel_tasks_reports_what_changed_and_what_was_skipped(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    a, b = result.task_ids["a"], result.task_ids["b"]
    done = await pop_claim(app)
    assert await complete_one(app.execution, done) is ReportOutcome.RECORDED
    other = b if done.task.id == a else a
    unknown = uuid4()

    outcome = await control(app, batch_size=1).cancel_tasks([done.task.id, other, unknown, other])

    assert outcome.changed == (other,)
    assert outcome.skipped == (done.task.id, unknown)
    assert await job_status(app, result.job_id) is JobStatus.CANCELLED


# --- cancel a job -----------------------------------------------------------------------------


async def test_cancel_job_walks_every_task_in_bounded_batches(app: App) -> None:
    specs = [TaskSpec(f"t{i}", "echo") for i in range(7)]
    specs.append(TaskSpec("d", "echo", depends_on=("t0", "t1")))
    result = await app.submit_tasks(*specs)
    running = await pop_claim(app)
    finished = await pop_claim(app)
    assert await complete_one(app.execution, finished) is ReportOutcome.RECORDED
    service = control(app, batch_size=3)
    transactions = count_transactions(app)

    outcome = await service.cancel_job(result.job_id)

    assert (outcome.status, outcome.cancelled) == (JobStatus.CANCELLED, 7)
    assert transactions[0] == 1 + 3 + 1  # probe, ceil(8 / 3) pages, settle
    view = await app.queries.get_job(result.job_id)
    statuses = {t.id: t.status for t in view.tasks}
    assert statuses.pop(finished.task.id) is TaskStatus.COMPLETED
    assert set(statuses.values()) == {TaskStatus.CANCELLED}
    assert view.job.status is JobStatus.CANCELLED
    assert await app.execution.heartbeat(running) is LeaseState.CANCELLED

    again = await service.cancel_job(result.job_id)
    assert (again.status, again.cancelled) == (JobStatus.CANCELLED, 0)


async def test_cancel_of_a_finished_job_is_not_cancellable(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    assert await complete_one(app.execution, await pop_claim(app)) is ReportOutcome.RECORDED
    with pytest.raises(NotCancellable):
        await control(app).cancel_job(result.job_id)
    assert await job_status(app, result.job_id) is JobStatus.COMPLETED


async def test_cancel_of_a_job_with_a_failed_task_stays_failed(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "echo"))
    claim = await pop_claim(app)
    await fail_for_good(app, claim)

    outcome = await control(app).cancel_job(result.job_id)

    assert (outcome.status, outcome.cancelled) == (JobStatus.FAILED, 1)


# --- manual retry -----------------------------------------------------------------------------


async def test_retry_of_a_failed_task_reopens_it_its_cascade_and_its_job(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=1),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("c", "echo", depends_on=("b",)),
    )
    ids = result.task_ids
    first = await pop_claim(app)
    await fail_for_good(app, first)
    assert await status_of(app, ids["c"]) is TaskStatus.FAILED
    assert await job_status(app, result.job_id) is JobStatus.FAILED

    app.clock.advance(1)  # the runs are listed by started_at
    assert await control(app).retry_task(ids["a"]) == (TaskStatus.QUEUED, 2)

    task = (await app.queries.get_task(ids["a"])).task
    assert (task.status, task.attempt, task.reclaims, task.finished_at) == (
        TaskStatus.QUEUED,
        0,
        0,
        None,
    )
    assert await status_of(app, ids["b"]) is TaskStatus.PENDING
    assert await status_of(app, ids["c"]) is TaskStatus.PENDING
    assert await job_status(app, result.job_id) is JobStatus.RUNNING
    assert app.queue.has_marker(ids["a"])  # enqueued after the commit

    # it runs again with a fresh budget; its dependents follow; the job completes
    second = await pop_claim(app)
    assert second.task.id == ids["a"] and second.run.attempt_number == 1
    for _ in range(3):
        assert await complete_one(app.execution, second) is ReportOutcome.RECORDED
        if await status_of(app, ids["c"]) is TaskStatus.COMPLETED:
            break
        second = await pop_claim(app)
    assert await job_status(app, result.job_id) is JobStatus.COMPLETED
    runs = (await app.queries.get_task(ids["a"])).runs
    assert [(r.id, r.status) for r in runs] == [
        (first.run.id, RunStatus.FAILED),
        (runs[1].id, RunStatus.SUCCEEDED),
    ]


async def test_retry_of_a_cancelled_task_requeues_it(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    ids = result.task_ids
    claim = await pop_claim(app)
    await control(app).cancel_task(ids["a"])
    assert await job_status(app, result.job_id) is JobStatus.CANCELLED

    assert await control(app).retry_task(ids["a"]) == (TaskStatus.QUEUED, 1)

    assert await status_of(app, ids["b"]) is TaskStatus.PENDING
    assert await job_status(app, result.job_id) is JobStatus.RUNNING
    # the old run's late report is fenced: the retried task stays queued
    assert await complete_one(app.execution, claim) is ReportOutcome.STALE
    assert await status_of(app, ids["a"]) is TaskStatus.QUEUED


async def test_retry_of_a_never_started_task_in_a_job_whose_other_task_completed_is_running(
    app: App,
) -> None:
    """The job's status after a retry is re-derived as ever: ``running`` once some task of it
    started, here a completed one (a newcomer saw ``pending`` after cancel and retry of b)."""
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    ids = result.task_ids
    assert await complete_one(app.execution, await pop_claim(app)) is ReportOutcome.RECORDED
    await control(app).cancel_task(ids["b"])
    assert await job_status(app, result.job_id) is JobStatus.CANCELLED

    assert await control(app).retry_task(ids["b"]) == (TaskStatus.QUEUED, 0)

    assert await job_status(app, result.job_id) is JobStatus.RUNNING


async def test_retry_in_a_cancelled_job_where_nothing_started_leaves_it_pending(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    await control(app).cancel_job(result.job_id)

    assert await control(app).retry_task(result.task_ids["b"]) == (TaskStatus.QUEUED, 0)

    assert await job_status(app, result.job_id) is JobStatus.PENDING


async def test_a_late_report_of_the_old_run_after_a_retry_is_stale(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo", max_attempts=1))
    old = await pop_claim(app)
    await fail_for_good(app, old)
    app.clock.advance(1)  # the runs are listed by started_at
    await control(app).retry_task(old.task.id)
    new = await pop_claim(app)

    # the old run's failure replayed is the no-op of DESIGN §2; its success is refused
    assert (await app.execution.fail(old, "late")).outcome is ReportOutcome.DUPLICATE
    assert await complete_one(app.execution, old) is ReportOutcome.STALE
    lease = app.queue.get_lease(old.task.id)
    assert lease is not None and lease.run_id == new.run.id
    assert await app.execution.heartbeat(old) is LeaseState.LOST

    view = await app.queries.get_task(old.task.id)
    assert (view.task.status, view.task.current_run_id) == (TaskStatus.RUNNING, new.run.id)
    assert [r.status for r in view.runs] == [RunStatus.FAILED, RunStatus.RUNNING]


@pytest.mark.parametrize("state", ["pending", "queued", "running", "completed"])
async def test_retry_of_a_task_that_is_not_failed_or_cancelled_is_refused(
    app: App, state: str
) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    target = result.task_ids["b" if state == "pending" else "a"]
    if state in ("running", "completed"):
        claim = await pop_claim(app)
        if state == "completed":
            await complete_one(app.execution, claim)
    before = (await app.queries.get_task(target)).task

    with pytest.raises(NotRetryable) as refused:
        await control(app).retry_task(target)

    assert refused.value.code == "not_retryable"
    assert (await app.queries.get_task(target)).task == before


async def test_retry_of_a_dependent_whose_dependency_failed_is_refused(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "echo", depends_on=("a",))
    )
    await fail_for_good(app, await pop_claim(app))
    with pytest.raises(NotRetryable, match="retry that one first"):
        await control(app).retry_task(result.task_ids["b"])


async def test_a_dependent_still_blocked_by_another_failure_is_not_reopened(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=1),
        TaskSpec("b", "echo", max_attempts=1),
        TaskSpec("c", "echo", depends_on=("a", "b")),
    )
    ids = result.task_ids
    await fail_for_good(app, await pop_claim(app))
    await fail_for_good(app, await pop_claim(app))

    assert await control(app).retry_task(ids["a"]) == (TaskStatus.QUEUED, 0)

    assert await status_of(app, ids["c"]) is TaskStatus.FAILED
    assert await job_status(app, result.job_id) is JobStatus.FAILED  # b is still failed
    assert await control(app).retry_task(ids["b"]) == (TaskStatus.QUEUED, 1)
    assert await status_of(app, ids["c"]) is TaskStatus.PENDING
    assert await job_status(app, result.job_id) is JobStatus.RUNNING


async def test_retry_of_a_task_cancelled_while_its_dependency_runs_waits_pending(
    app: App,
) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    ids = result.task_ids
    await pop_claim(app)  # a runs
    await control(app).cancel_task(ids["b"])

    assert await control(app).retry_task(ids["b"]) == (TaskStatus.PENDING, 0)
    assert not app.queue.has_marker(ids["b"])


async def test_retry_tasks_counts_a_task_reopened_by_an_earlier_id_as_changed(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=1),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("q", "echo", depends_on=("a",)),
    )
    ids = result.task_ids
    await fail_for_good(app, await pop_claim(app))
    unknown = uuid4()

    outcome = await control(app).retry_tasks([ids["a"], ids["b"], unknown])

    assert outcome.changed == (ids["a"], ids["b"])
    assert outcome.skipped == (unknown,)
    assert outcome.cascaded == 1  # q; b was retried by its own id, as a cancel counts it
    assert await status_of(app, ids["q"]) is TaskStatus.PENDING


async def test_retry_tasks_counts_a_dependent_listed_before_its_parent_as_changed(
    app: App,
) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "echo", depends_on=("a",))
    )
    ids = result.task_ids
    await fail_for_good(app, await pop_claim(app))  # b failed with a

    outcome = await control(app).retry_tasks([ids["b"], ids["a"]])

    # b was judged first (its parent still failed), then a's retry reopened it
    assert outcome.changed == (ids["a"], ids["b"])
    assert (outcome.skipped, outcome.cascaded) == ((), 0)
    assert await status_of(app, ids["b"]) is TaskStatus.PENDING


async def test_cancel_cascades_through_a_diamond_once_per_task(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("c", "echo", depends_on=("a",)),
        TaskSpec("d", "echo", depends_on=("b", "c")),
    )
    ids = result.task_ids

    outcome = await control(app).cancel_tasks([ids["a"], ids["c"]])

    assert outcome.changed == (ids["a"], ids["c"])
    assert outcome.cascaded == 2  # b and d; c was cancelled by its own id
    view = await app.queries.get_job(result.job_id)
    assert {t.name: t.status for t in view.tasks} == dict.fromkeys("abcd", TaskStatus.CANCELLED)
    assert view.job.status is JobStatus.CANCELLED
    d = next(t for t in view.tasks if t.name == "d")
    assert d.version == 1  # written once


async def test_cancel_job_pages_a_large_job_by_the_cancel_page_size(app: App) -> None:
    specs = [TaskSpec(f"t{i}", "echo") for i in range(CANCEL_PAGE_SIZE * 2 + 50)]
    result = await app.submit_tasks(*specs)
    service = control(app)  # batch_size 500: the cancel's pages are still CANCEL_PAGE_SIZE
    transactions = count_transactions(app)

    outcome = await service.cancel_job(result.job_id)

    assert (outcome.status, outcome.cancelled) == (JobStatus.CANCELLED, len(specs))
    assert transactions[0] == 1 + 3 + 1  # probe, three pages, settle


async def test_a_cancel_whose_job_finished_while_it_ran_is_not_cancellable(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    real_run = app.store.run
    calls = 0

    async def finishing_after_the_probe(fn: Any) -> Any:
        nonlocal calls
        calls += 1
        out = await real_run(fn)
        if calls == 1:  # the probe saw the task running; it completes before the first page
            assert await complete_one(app.execution, claim) is ReportOutcome.RECORDED
        return out

    app.store.run = finishing_after_the_probe  # type: ignore[method-assign]

    with pytest.raises(NotCancellable):
        await control(app).cancel_job(result.job_id)
    assert await job_status(app, result.job_id) is JobStatus.COMPLETED
