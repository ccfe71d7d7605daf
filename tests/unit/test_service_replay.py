"""Reports replayed after a COMMIT whose outcome was unknown (issue 12 bug 6, CRDB.md 40003).

The memory store's ``inject_ambiguous_commits`` applies the next commit and then raises
``CommitOutcomeUnknown``: the service replays the report, finds its own commit landed, and must
still do that commit's Redis side and answer so the runtime counts it.
"""

from __future__ import annotations

from dtq.application.commands import ReportOutcome, TaskSpec
from dtq.domain.status import RunStatus, TaskStatus
from tests.single import complete_one, pop_one
from tests.unit.conftest import POLICY, App
from tests.unit.test_service_execution import pop_claim, status_of


async def test_replayed_success_that_landed_pushes_the_promoted_dependent(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    claim = await pop_claim(app)
    app.store.inject_ambiguous_commits(1)
    assert await complete_one(app.execution, claim) is ReportOutcome.RECORDED
    assert await status_of(app, result.task_ids["a"]) is TaskStatus.COMPLETED
    assert app.queue.ready_ids("default") == [result.task_ids["b"]]
    assert app.queue.get_lease(claim.task.id) is None


async def test_replayed_batch_success_answers_recorded_for_each_landed_claim(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo"),
        TaskSpec("c", "echo", depends_on=("a", "b")),
    )
    claims = [await pop_claim(app), await pop_claim(app)]
    app.store.inject_ambiguous_commits(1)
    outcomes = await app.execution.complete_many(claims)
    assert outcomes == [ReportOutcome.RECORDED, ReportOutcome.RECORDED]
    assert app.queue.ready_ids("default") == [result.task_ids["c"]]


async def test_replayed_failure_that_landed_puts_the_retry_on_the_scheduled_set(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo", max_attempts=3))
    task_id = result.task_ids["a"]
    claim = await pop_claim(app)
    app.store.inject_ambiguous_commits(1)
    failed = await app.execution.fail(claim, "ValueError: boom")
    assert failed.outcome is ReportOutcome.RECORDED
    assert failed.retried  # the replay still tells the runtime a retry was scheduled
    assert app.queue.scheduled_ids() == [task_id]
    app.clock.advance(POLICY.retry_backoff)
    assert await app.reconcile.promote_scheduled() == 1
    assert (await pop_claim(app)).run.attempt_number == 2


async def test_replayed_final_failure_that_landed_is_recorded_with_nothing_scheduled(
    app: App,
) -> None:
    await app.submit_tasks(TaskSpec("a", "echo", max_attempts=1))
    claim = await pop_claim(app)
    app.store.inject_ambiguous_commits(1)
    assert (await app.execution.fail(claim, "ValueError: boom")).outcome is ReportOutcome.RECORDED
    assert await status_of(app, claim.task.id) is TaskStatus.FAILED
    assert app.queue.scheduled_ids() == []


async def test_replayed_hand_back_that_landed_repushes_the_task(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    claim = await pop_claim(app)
    app.store.inject_ambiguous_commits(1)
    assert await app.execution.hand_back(claim, "worker shutting down") is ReportOutcome.RECORDED
    view = await app.queries.get_task(task_id)
    assert view.task.status is TaskStatus.QUEUED and view.task.reclaims == 0
    assert [r.status for r in view.runs] == [RunStatus.DEAD]
    assert app.queue.ready_ids("default") == [task_id]
    assert (await pop_claim(app, "w2")).run.attempt_number == 1


async def test_replayed_hand_back_of_a_run_reclaimed_meanwhile_stays_stale(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    await app.queue.delete_leases([(claim.task.id, claim.run.id)])
    app.clock.advance(POLICY.stale_running_after + 1)
    assert await app.reconcile.reclaim_stale() == 1
    await pop_one(app.queue, ["default"], timeout=0)  # the reclaim's push, taken by someone
    app.store.inject_ambiguous_commits(1)
    assert await app.execution.hand_back(claim, "worker shutting down") is ReportOutcome.STALE
