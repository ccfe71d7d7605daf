"""Reconcile and reclaim (spec §2 invariant, §5 pending marker; DESIGN §3, §5)."""

from __future__ import annotations

from dtq.application.commands import ExecutionPolicy, TaskSpec
from dtq.application.ports import QueueEpoch
from dtq.application.reconcile import (
    LEASE_EXPIRED,
    LEASE_LOST_WITH_QUEUE,
    ReconcileService,
)
from dtq.application.registry import WorkerRegistryService
from dtq.domain.entities import WORKER_LOST
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from tests.single import claim_one, complete_one, enqueue_one, pop_one
from tests.unit.conftest import POLICY, App, build_app
from tests.unit.test_service_execution import pop_claim, status_of


async def test_reconcile_pushes_due_queued_tasks_redis_lost(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    app.queue.flush()  # Redis lost its lists and markers after the commit
    assert await app.reconcile.enqueue_due() == 2
    assert sorted(app.queue.ready_ids("default")) == sorted(result.task_ids.values())


async def test_reconcile_skips_tasks_whose_marker_is_set(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    assert await app.reconcile.enqueue_due() == 0
    assert len(app.queue.ready_ids("default")) == 1


async def test_a_leaked_marker_stalls_a_task_until_its_ttl() -> None:
    app = build_app(marker_ttl=20.0)
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    # the id is popped and the popper dies before claiming: the marker leaks
    assert await pop_one(app.queue, ["default"], timeout=0) == task_id
    assert await app.reconcile.enqueue_due() == 0
    assert app.queue.ready_ids("default") == []
    app.clock.advance(19)
    assert await app.reconcile.enqueue_due() == 0
    app.clock.advance(1)
    assert await app.reconcile.enqueue_due() == 1
    assert app.queue.ready_ids("default") == [task_id]


async def test_a_released_marker_does_not_stall_the_task(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    claim = await pop_claim(app)
    await app.execution.hand_back(claim, "shutdown")  # released on the way out, re-pushed
    assert app.queue.ready_ids("default") == [task_id]
    await pop_one(app.queue, ["default"], timeout=0)
    assert await claim_one(app.execution, task_id, "w2") is not None


async def test_reclaim_kills_a_run_with_no_lease_and_repushes_the_task(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    dead = await pop_claim(app, "w1")
    await app.queue.delete_leases([(task_id, dead.run.id)])  # worker died: heartbeats stopped
    await enqueue_one(app.queue, task_id, "default")  # a marker left by an abandoned delivery
    await pop_one(app.queue, ["default"], timeout=0)
    app.clock.advance(POLICY.stale_running_after + 1)
    assert await app.reconcile.reclaim_stale() == 1
    assert app.queue.ready_ids("default") == [task_id]
    successor = await pop_claim(app, "w2")
    await complete_one(app.execution, successor)
    view = await app.queries.get_task(task_id)
    assert [r.status for r in view.runs] == [RunStatus.DEAD, RunStatus.SUCCEEDED]
    assert [r.attempt_number for r in view.runs] == [1, 1]
    assert view.runs[0].error == LEASE_EXPIRED
    assert view.runs[0].started_at < view.runs[1].started_at
    assert view.task.attempt == 1


async def test_reclaim_leaves_young_runs_and_leased_runs_alone(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    young = await pop_claim(app)
    leased = await pop_claim(app)
    await app.queue.delete_leases([(young.task.id, young.run.id)])
    app.clock.advance(POLICY.stale_running_after - 1)
    assert await app.reconcile.reclaim_stale() == 0
    app.clock.advance(2)
    assert await app.execution.heartbeat(leased) is not None  # keeps its lease alive
    assert await app.reconcile.reclaim_stale() == 1
    assert await status_of(app, leased.task.id) is TaskStatus.RUNNING
    assert await status_of(app, young.task.id) is TaskStatus.QUEUED


async def test_crash_budget_ends_a_task_that_keeps_killing_its_worker() -> None:
    app = build_app(ExecutionPolicy(stale_running_after=10, max_reclaims=2))
    result = await app.submit_tasks(
        TaskSpec("poison", "echo", max_attempts=10),
        TaskSpec("after", "echo", depends_on=("poison",)),
    )
    for _ in range(3):
        claim = await pop_claim(app)
        await app.queue.delete_leases([(claim.task.id, claim.run.id)])
        app.clock.advance(11)
        await app.reconcile.reclaim_stale()
    view = await app.queries.get_task(result.task_ids["poison"])
    assert view.task.status is TaskStatus.FAILED
    assert view.task.last_error is not None and view.task.last_error.startswith(WORKER_LOST)
    assert [r.status for r in view.runs] == [RunStatus.DEAD] * 3
    assert await status_of(app, result.task_ids["after"]) is TaskStatus.FAILED
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.FAILED
    assert app.queue.ready_ids("default") == []


async def test_reclaim_passes_reach_every_candidate_past_many_healthy_long_tasks() -> None:
    app = build_app(ExecutionPolicy(stale_running_after=10))
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(25)))
    claims = [await pop_claim(app) for _ in range(25)]
    orphans = claims[::6]  # scattered among healthy leased runs
    for claim in orphans:
        await app.queue.delete_leases([(claim.task.id, claim.run.id)])
    app.clock.advance(11)
    for claim in claims:
        if claim not in orphans:
            await app.execution.heartbeat(claim)
    reclaimed = 0
    for _ in range(6):  # batches of 5: each pass moves the cursor on
        reclaimed += await app.reconcile.reclaim_stale(limit=5)
    assert reclaimed == len(orphans)


async def test_enqueue_due_pages_through_a_large_backlog(app: App) -> None:
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(12)))
    app.queue.flush()
    pushed = [await app.reconcile.enqueue_due(limit=5) for _ in range(3)]
    assert pushed == [5, 5, 2]
    assert len(app.queue.ready_ids("default")) == 12


async def test_flush_in_the_middle_of_a_run_is_repaired_with_no_task_lost(app: App) -> None:
    result = await app.submit_tasks(
        *(TaskSpec(f"t{i}", "echo") for i in range(6)),
        TaskSpec("last", "echo", depends_on=("t0", "t1")),
    )
    running = [await pop_claim(app) for _ in range(2)]
    app.queue.flush()  # ready list, markers and leases are gone
    assert await app.reconcile.reclaim_stale() == 0  # the next pass notices the loss
    await complete_one(app.execution, running[0])
    app.clock.advance(POLICY.stale_running_after + 1)
    report = await app.reconcile.reconcile_once()
    assert report.reclaimed == 1 and report.enqueued >= 4
    for _ in range(20):
        task_id = await pop_one(app.queue, ["default"], timeout=0)
        if task_id is None:
            break
        claim = await claim_one(app.execution, task_id, "w2")
        if claim is not None:
            await complete_one(app.execution, claim)
    job = await app.queries.get_job(result.job_id)
    assert {t.status for t in job.tasks} == {TaskStatus.COMPLETED}
    assert job.job.status is JobStatus.COMPLETED


async def test_worker_registry_lists_recent_heartbeats(app: App) -> None:
    await app.registry.heartbeat("old", "h1", {"kinds": ["echo"]})
    app.clock.advance(300)
    await app.registry.heartbeat("new", "h2", {"concurrency": 4})
    workers = await app.queries.list_workers(active_within=120)
    assert [(w.id, w.hostname, w.metadata) for w in workers] == [("new", "h2", {"concurrency": 4})]
    assert workers[0].redis_key_prefix == "{dto}:"  # the default REDIS_KEY_PREFIX's hash tag
    assert {w.id for w in await app.queries.list_workers(active_within=600)} == {"old", "new"}


async def test_one_reconcile_pass_repairs_a_backlog_larger_than_a_page(app: App) -> None:
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(23)))
    app.queue.flush()
    report = await app.reconcile.reconcile_once(limit=5)
    assert report.enqueued == 23
    assert len(app.queue.ready_ids("default")) == 23


async def test_a_pass_stops_after_max_pages_and_the_next_one_carries_on(app: App) -> None:
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(12)))
    app.queue.flush()
    first = await app.reconcile.reconcile_once(limit=5, max_pages=1)
    second = await app.reconcile.reconcile_once(limit=5, max_pages=1)
    assert (first.enqueued, second.enqueued) == (5, 5)


async def test_a_backlog_older_than_the_marker_ttl_is_not_pushed_twice() -> None:
    app = build_app(marker_ttl=60.0)
    result = await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(10)))
    app.clock.advance(61)  # the ids still wait in the ready list; their markers expired
    assert await app.reconcile.enqueue_due() == 0
    assert sorted(app.queue.ready_ids("default")) == sorted(result.task_ids.values())
    assert all(app.queue.has_marker(i) for i in result.task_ids.values())


# --- losing the queue's data (issue 12 bug 3) --------------------------------------------------


async def test_losing_the_queue_reclaims_no_healthy_long_run_however_often_it_happens() -> None:
    app = build_app()  # lease 30 s (TTL 35 s), stale after 60 s, crash budget 2
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(3)))
    claims = [await pop_claim(app) for _ in range(3)]
    for _ in range(POLICY.max_reclaims + 2):  # more losses than the crash budget allows
        app.clock.advance(POLICY.stale_running_after + 1)  # long runs, heartbeating
        for claim in claims:
            await app.execution.heartbeat(claim)
        app.queue.flush()  # Redis restarted without persistence
        report = await app.reconcile.reconcile_once()  # the pass run at once on start
        assert report.reclaimed == 0 and report.queue_reset and report.reclaim_deferred
        app.clock.advance(10)  # the workers' next heartbeat re-creates their leases
        for claim in claims:
            await app.execution.heartbeat(claim)
        app.clock.advance(POLICY.lease_ttl - 10)  # the grace is over; the leases are back
        report = await app.reconcile.reconcile_once()
        assert report.reclaimed == 0 and not report.reclaim_deferred
    for claim in claims:
        view = await app.queries.get_task(claim.task.id)
        assert view.task.status is TaskStatus.RUNNING and view.task.reclaims == 0
        assert [r.status for r in view.runs] == [RunStatus.RUNNING]


async def test_a_run_whose_lease_is_not_recreated_after_the_loss_is_reclaimed_free() -> None:
    app = build_app()
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    await pop_claim(app)  # its worker dies at about the time Redis is lost
    app.clock.advance(POLICY.stale_running_after + 1)
    app.queue.flush()
    assert await app.reconcile.reclaim_stale() == 0  # held back for one lease TTL
    app.clock.advance(POLICY.lease_ttl - 1)
    assert await app.reconcile.reclaim_stale() == 0
    app.clock.advance(1)
    assert await app.reconcile.reclaim_stale() == 1
    view = await app.queries.get_task(task_id)
    assert view.task.status is TaskStatus.QUEUED and view.task.reclaims == 0
    assert view.runs[0].status is RunStatus.DEAD and view.runs[0].error == LEASE_LOST_WITH_QUEUE
    assert app.queue.ready_ids("default") == [task_id]


async def test_a_run_started_after_the_loss_is_charged_as_usual() -> None:
    app = build_app()
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    app.queue.flush()
    await app.reconcile.reconcile_once()  # notices the loss; re-pushes the queued task
    app.clock.advance(1)
    claim = await pop_claim(app)
    await app.queue.delete_leases([(claim.task.id, claim.run.id)])  # this worker really dies
    app.clock.advance(POLICY.stale_running_after + 1)
    assert await app.reconcile.reclaim_stale() == 1
    view = await app.queries.get_task(result.task_ids["a"])
    assert view.task.reclaims == 1 and view.runs[0].error == LEASE_EXPIRED


# --- due tasks of a priority no live worker polls (issue 12) -----------------------------------


async def test_a_pass_reports_due_tasks_of_priorities_no_live_worker_polls(app: App) -> None:
    await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("h1", "echo", priority="high"),
        TaskSpec("h2", "echo", priority="high"),
        TaskSpec("b", "echo", priority="batch"),
    )
    assert (await app.reconcile.reconcile_once()).unpolled == {
        "batch": 1,
        "default": 1,
        "high": 2,
    }  # no live worker at all
    await app.registry.heartbeat("w-old", "h", {"priorities": ["batch"]})
    app.clock.advance(300)  # w-old is no longer live
    await app.registry.heartbeat("w-default", "h", {"kinds": ["echo"]})  # the default tier
    await app.registry.heartbeat("w-high", "h", {"priorities": ["high", "default"]})
    assert (await app.reconcile.reconcile_once()).unpolled == {"batch": 1}
    # a worker with a mistyped REDIS_KEY_PREFIX pops other lists: it polls nothing here
    typo = WorkerRegistryService(store=app.store, queue_prefix="{typo}:")
    await typo.heartbeat("w-typo", "h", {"priorities": ["batch"]})
    assert (await app.reconcile.reconcile_once()).unpolled == {"batch": 1}


async def test_unpolled_counts_are_reported_once_the_due_listing_is_complete(app: App) -> None:
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo", priority="high") for i in range(7)))
    first = await app.reconcile.reconcile_once(limit=5, max_pages=1)
    second = await app.reconcile.reconcile_once(limit=5, max_pages=1)
    assert first.unpolled is None  # the listing stopped after one page of five
    assert second.unpolled == {"high": 7}


async def test_a_deferred_pass_reads_the_queue_epoch_once_not_once_per_page() -> None:
    app = build_app(ExecutionPolicy(stale_running_after=10))
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(6)))
    for _ in range(6):
        await pop_claim(app)
    app.clock.advance(11)
    await app.reconcile.reclaim_stale(limit=5)  # a full page: the cursor is mid-listing
    app.queue.flush()
    reads = 0
    epoch = app.queue.epoch

    async def counted(token: str) -> QueueEpoch:
        nonlocal reads
        reads += 1
        return await epoch(token)

    app.queue.epoch = counted  # type: ignore[method-assign]
    report = await app.reconcile.reconcile_once(limit=5)
    assert report.reclaim_deferred and reads == 1


async def test_runs_of_a_live_worker_on_another_prefix_are_held_until_it_stops_heartbeating(
    app: App,
) -> None:
    """A reconciler whose queue has another Redis key prefix than a worker's registry row finds
    none of that worker's leases: it leaves the runs while the worker is live, and reports them
    by prefix; a row without the prefix (an older worker) and a stale row are reclaimed."""
    other = ReconcileService(
        store=app.store, queue=app.queue, policy=POLICY, queue_prefix="{typo}:"
    )
    await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    live, old = await pop_claim(app, "w-live"), await pop_claim(app, "w-old")
    await app.registry.heartbeat("w-live", "h1", {})  # stamped with this deployment's prefix
    await WorkerRegistryService(store=app.store).heartbeat("w-old", "h2", {})  # no prefix
    await app.queue.delete_leases([(live.task.id, live.run.id), (old.task.id, old.run.id)])
    app.clock.advance(POLICY.stale_running_after + 1)
    report = await other.reconcile_once()
    assert (report.reclaimed, report.reclaims_held) == (1, {"{dto}:": 1})
    assert await status_of(app, live.task.id) is TaskStatus.RUNNING
    assert await status_of(app, old.task.id) is TaskStatus.QUEUED
    app.clock.advance(91)  # past worker_alive_within: w-live stopped heartbeating
    report = await other.reconcile_once()
    assert (report.reclaimed, report.reclaims_held) == (1, {})
    assert await status_of(app, live.task.id) is TaskStatus.QUEUED


async def test_its_own_prefix_does_not_hold_a_live_workers_lost_lease(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app, "w1")
    await app.registry.heartbeat("w1", "h1", {})
    await app.queue.delete_leases([(claim.task.id, claim.run.id)])
    app.clock.advance(POLICY.stale_running_after + 1)
    report = await app.reconcile.reconcile_once()
    assert (report.reclaimed, report.reclaims_held) == (1, {})
