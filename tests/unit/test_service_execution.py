"""The worker-side use cases (spec §5 claim flow and marker table, §6 semantics; DESIGN §2-§3)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast
from uuid import UUID, uuid4

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import Claim, ReportOutcome, SubmitJob, TaskSpec
from dtq.application.execution import ExecutionService
from dtq.application.ports import Lease, LeaseState, Store, Transaction
from dtq.application.submit import SubmitService
from dtq.domain.errors import BackendUnavailable
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from tests.single import claim_one, complete_one, enqueue_one, pop_one
from tests.unit.conftest import POLICY, App

T = TypeVar("T")


async def pop_claim(app: App, worker: str = "w1") -> Claim:
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None, "nothing on the ready list"
    claim = await claim_one(app.execution, task_id, worker)
    assert claim is not None, "claim refused"
    return claim


async def status_of(app: App, task_id: UUID) -> TaskStatus:
    return (await app.queries.get_task(task_id)).task.status


# --- claim ------------------------------------------------------------------------------------


async def test_claim_releases_the_marker_and_sets_a_lease(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    assert claim.task.attempt == claim.run.attempt_number == 1
    assert not app.queue.has_marker(claim.task.id)
    lease = app.queue.get_lease(claim.task.id)
    assert lease is not None and (lease.worker_id, lease.run_id) == ("w1", claim.run.id)
    view = await app.queries.get_job(result.job_id)
    assert view.job.status is JobStatus.RUNNING


async def test_popped_but_refused_claim_releases_the_marker(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    await pop_claim(app)
    # a duplicate id on the ready list, behind a fresh marker (e.g. the reconciler raced us)
    await enqueue_one(app.queue, task_id, "default")
    popped = await pop_one(app.queue, ["default"], timeout=0)
    assert await claim_one(app.execution, popped, "w2") is None  # type: ignore[arg-type]
    assert not app.queue.has_marker(task_id)
    assert len((await app.queries.get_task(task_id)).runs) == 1


async def test_second_claimer_of_one_task_loses_cleanly(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    first = await claim_one(app.execution, task_id, "w1")
    second = await claim_one(app.execution, task_id, "w2")
    assert first is not None and second is None
    lease = app.queue.get_lease(task_id)
    assert lease is not None and lease.worker_id == "w1"


async def test_claim_failure_in_the_store_still_releases_the_marker(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id == result.task_ids["a"]
    app.store.available = False
    with pytest.raises(BackendUnavailable):
        await claim_one(app.execution, task_id, "w1")
    assert not app.queue.has_marker(task_id)


async def test_stale_duplicate_popped_early_is_refused_and_rescheduled(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    claim = await pop_claim(app)
    await app.execution.fail(claim, "boom")  # retry due in 5 s, on the scheduled set
    await enqueue_one(app.queue, task_id, "default")  # a stale duplicate reaches the ready list
    popped = await pop_one(app.queue, ["default"], timeout=0)
    assert await claim_one(app.execution, popped, "w2") is None  # type: ignore[arg-type]
    assert await status_of(app, task_id) is TaskStatus.QUEUED
    assert task_id in app.queue.scheduled_ids()
    app.clock.advance(POLICY.retry_backoff)
    assert await app.reconcile.promote_scheduled() == 1
    retry = await pop_claim(app)
    assert retry.run.attempt_number == 2


async def test_claim_retried_after_a_conflict_counts_one_attempt(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    app.store.inject_conflicts(3)
    claim = await pop_claim(app)
    assert app.store.retries == 3
    view = await app.queries.get_task(claim.task.id)
    assert view.task.attempt == 1 and len(view.runs) == 1


async def test_ambiguous_claim_commit_is_recognised_by_its_run_id(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    app.store.inject_ambiguous_commits(1)
    claim = await pop_claim(app)
    assert (await status_of(app, claim.task.id)) is TaskStatus.RUNNING
    assert app.queue.get_lease(claim.task.id) is not None


class _GatedLeases:
    """The app's queue whose ``set_leases`` waits at ``gate`` (a slow lease write); records the
    order in which lease writes return and lease deletes begin."""

    def __init__(self, inner: InMemoryQueue) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.calls: list[str] = []

    async def set_leases(self, leases: Any, ttl: float, *, release: Any = ()) -> None:
        await self.gate.wait()
        await self.inner.set_leases(leases, ttl, release=release)
        self.calls.append("leases set")

    async def delete_leases(self, leases: Any) -> None:
        self.calls.append("leases deleted")
        await self.inner.delete_leases(leases)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def _gated(app: App) -> tuple[ExecutionService, _GatedLeases]:
    queue = _GatedLeases(app.queue)
    service = ExecutionService(store=app.store, queue=queue, policy=POLICY, clock=app.clock)
    return service, queue


async def _claimed_in_flight(
    app: App, service: ExecutionService
) -> tuple[Claim, asyncio.Future[list[Claim]]]:
    """Submit, pop and claim one task with ``on_commit``; return once ``on_commit`` has the
    claim (its lease write is held by the gate): the claim and the ``claim_many`` call."""
    await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None
    handed: list[list[Claim]] = []
    claiming = asyncio.ensure_future(service.claim_many([task_id], "w1", on_commit=handed.append))
    while not handed:
        await asyncio.sleep(0)
    [[claim]] = handed
    assert claim.task.id == task_id
    return claim, claiming


async def test_on_commit_gets_the_claims_before_their_lease_write_returns(app: App) -> None:
    service, queue = _gated(app)
    claim, claiming = await _claimed_in_flight(app, service)
    task_id = claim.task.id
    assert await status_of(app, task_id) is TaskStatus.RUNNING  # committed
    assert app.queue.get_lease(task_id) is None  # the lease write is still in flight
    assert not claiming.done()
    queue.gate.set()
    assert await claiming == [claim]
    lease = app.queue.get_lease(task_id)
    assert lease is not None and lease.run_id == claim.run.id
    assert not app.queue.has_marker(task_id)


@pytest.mark.parametrize("report", ["complete", "fail", "hand back"])
async def test_a_report_deletes_the_lease_only_after_its_claims_lease_write_returned(
    app: App, report: str
) -> None:
    service, queue = _gated(app)
    claim, claiming = await _claimed_in_flight(app, service)
    task_id = claim.task.id
    reporting = asyncio.ensure_future(
        service.complete_many([claim])
        if report == "complete"
        else service.fail(claim, "boom", permanent=True)
        if report == "fail"
        else service.hand_back(claim, "shutting down")
    )
    for _ in range(20):  # the report commits and then waits for the lease write
        await asyncio.sleep(0)
    assert await status_of(app, task_id) is not TaskStatus.RUNNING
    assert queue.calls == []
    assert not reporting.done()
    queue.gate.set()
    await asyncio.gather(claiming, reporting)
    assert queue.calls == ["leases set", "leases deleted"]
    assert app.queue.get_lease(task_id) is None


class _SentLeases:
    """The app's queue; records in ``steps`` when a lease write is sent (its call begins)."""

    def __init__(self, inner: InMemoryQueue, steps: list[str]) -> None:
        self.inner = inner
        self.steps = steps

    async def set_leases(self, leases: Any, ttl: float, *, release: Any = ()) -> None:
        self.steps.append("lease write sent")
        await self.inner.set_leases(leases, ttl, release=release)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


async def _order_of_first_steps(app: App, tasks: int) -> list[str]:
    """Claim ``tasks`` popped ids in one ``claim_many`` whose ``on_commit`` starts an asyncio
    task per claim (as the worker's session does); the order of the handlers' first steps and
    the lease write's send."""
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(tasks)))
    ids = await app.queue.pop_many(["default"], timeout=0, max_count=tasks)
    assert len(ids) == tasks
    steps: list[str] = []
    service = ExecutionService(
        store=app.store, queue=_SentLeases(app.queue, steps), policy=POLICY, clock=app.clock
    )
    started: list[asyncio.Task[None]] = []

    async def handler() -> None:
        steps.append("handler started")

    def on_commit(claims: list[Claim]) -> None:
        started.extend(asyncio.create_task(handler()) for _ in claims)

    claims = await service.claim_many(ids, "w1", on_commit=on_commit)
    await asyncio.gather(*started)
    assert len(claims) == tasks
    assert all(app.queue.get_lease(task_id) is not None for task_id in ids)
    return steps


async def test_a_lone_claims_handler_starts_before_its_lease_write_is_sent(app: App) -> None:
    # the idle path: the lease write's client-side work is not before the handler's start
    assert await _order_of_first_steps(app, 1) == ["handler started", "lease write sent"]


async def test_a_batch_claims_lease_write_is_sent_before_its_handlers_start(app: App) -> None:
    # a batch's handlers' first steps, up to a whole batch of them, do not delay its leases
    assert await _order_of_first_steps(app, 3) == ["lease write sent"] + ["handler started"] * 3


async def test_a_claim_without_on_commit_returns_with_its_lease_written(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    service, queue = _gated(app)
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None
    claiming = asyncio.ensure_future(service.claim_many([task_id], "w1"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not claiming.done()  # waits for the lease write
    queue.gate.set()
    [claim] = await claiming
    assert app.queue.get_lease(task_id) is not None
    assert queue.calls == ["leases set"]
    assert claim.task.id == task_id


# --- outcomes ---------------------------------------------------------------------------------


async def test_success_completes_task_and_job_and_deletes_the_lease(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    assert await complete_one(app.execution, claim) is ReportOutcome.RECORDED
    view = await app.queries.get_task(claim.task.id)
    assert view.task.status is TaskStatus.COMPLETED
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert app.queue.get_lease(claim.task.id) is None
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.COMPLETED


async def test_same_success_twice_is_a_noop_not_an_error(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    await complete_one(app.execution, claim)
    assert await complete_one(app.execution, claim) is ReportOutcome.DUPLICATE


async def test_success_promotes_dependents_only_when_all_dependencies_completed(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo"),
        TaskSpec("c", "echo", depends_on=("a", "b")),
    )
    first, second = await pop_claim(app), await pop_claim(app)
    await complete_one(app.execution, first)
    assert await status_of(app, result.task_ids["c"]) is TaskStatus.PENDING
    await complete_one(app.execution, second)
    assert await status_of(app, result.task_ids["c"]) is TaskStatus.QUEUED
    assert app.queue.ready_ids("default") == [result.task_ids["c"]]


async def test_failure_retries_through_the_scheduled_set(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo", max_attempts=3))
    task_id = result.task_ids["a"]
    claim = await pop_claim(app)
    assert (await app.execution.fail(claim, "ValueError: boom")).outcome is ReportOutcome.RECORDED
    view = await app.queries.get_task(task_id)
    assert view.task.status is TaskStatus.QUEUED
    assert view.task.last_error == "ValueError: boom"
    assert view.runs[0].error == "ValueError: boom"
    assert app.queue.scheduled_ids() == [task_id]
    assert await app.reconcile.promote_scheduled() == 0  # not due yet
    app.clock.advance(POLICY.retry_backoff)
    assert await app.reconcile.promote_scheduled() == 1
    assert (await pop_claim(app)).task.attempt == 2


async def test_exhausted_attempts_fail_task_cascade_transitively_and_fail_job(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=2),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("c", "echo", depends_on=("b",)),
        TaskSpec("side", "echo"),
    )
    ids = result.task_ids
    side = None
    for attempt in range(2):
        claim = await pop_claim(app)
        if claim.task.name == "side":
            side, claim = claim, await pop_claim(app)
        await app.execution.fail(claim, f"boom {attempt}")
        app.clock.advance(POLICY.retry_backoff)
        await app.reconcile.promote_scheduled()
    statuses = {name: await status_of(app, i) for name, i in ids.items()}
    assert statuses["a"] is statuses["b"] is statuses["c"] is TaskStatus.FAILED
    assert (await app.queries.get_task(ids["c"])).task.last_error == "dependency 'b' failed"
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.FAILED
    assert side is not None
    assert await complete_one(app.execution, side) is ReportOutcome.RECORDED
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.FAILED


async def test_unknown_kind_fails_permanently_in_one_run(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "no.such.kind", max_attempts=5))
    claim = await pop_claim(app)
    await app.execution.fail(claim, "unknown kind 'no.such.kind'", permanent=True)
    view = await app.queries.get_task(result.task_ids["a"])
    assert view.task.status is TaskStatus.FAILED
    assert len(view.runs) == 1
    assert app.queue.scheduled_ids() == []


async def test_report_from_a_reclaimed_run_is_refused_and_changes_nothing(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    stale = await pop_claim(app, "w1")
    await app.queue.delete_leases([(task_id, stale.run.id)])  # the worker stopped heartbeating
    app.clock.advance(POLICY.stale_running_after + 1)
    assert await app.reconcile.reclaim_stale() == 1
    fresh = await pop_claim(app, "w2")
    assert await complete_one(app.execution, stale) is ReportOutcome.STALE
    assert (await app.execution.fail(stale, "late")).outcome is ReportOutcome.STALE
    view = await app.queries.get_task(task_id)
    assert view.task.status is TaskStatus.RUNNING
    assert view.task.current_run_id == fresh.run.id
    lease = app.queue.get_lease(task_id)
    assert lease is not None and lease.run_id == fresh.run.id


class _ReadCountingStore:
    """Wraps a store; counts the task and run reads made inside its transactions."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: list[str] = []

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        outer = self

        class _Repo:
            def __init__(self, repo: Any, name: str) -> None:
                self._repo, self._name = repo, name

            def __getattr__(self, attr: str) -> Any:
                if attr in ("get", "get_many"):
                    outer.reads.append(f"{self._name}.{attr}")
                if attr == "get_finished":
                    return self._finished
                return getattr(self._repo, attr)

            async def _finished(self, *args: Any) -> Any:
                # a job row is read only for the jobs that come back
                found = await self._repo.get_finished(*args)
                outer.reads.extend(f"{self._name}.get_finished" for _ in found)
                return found

        class _Tx:
            def __init__(self, tx: Transaction) -> None:
                self._tx = tx
                self.tasks = _Repo(tx.tasks, "tasks")
                self.runs = _Repo(tx.runs, "runs")
                self.jobs = _Repo(tx.jobs, "jobs")

            def __getattr__(self, attr: str) -> Any:
                return getattr(self._tx, attr)

        return await self.inner.run(lambda tx: fn(cast(Transaction, _Tx(tx))))

    async def ping(self) -> None:
        await self.inner.ping()


async def test_batch_success_is_written_from_the_claims_without_reading_them(app: App) -> None:
    result = await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(3)))
    claims = [await pop_claim(app) for _ in range(3)]
    counting = _ReadCountingStore(app.store)
    execution = ExecutionService(store=counting, queue=app.queue, policy=POLICY)
    outcomes = await execution.complete_many(claims)
    assert outcomes == [ReportOutcome.RECORDED] * 3
    # written by compare-and-set on the claim-time versions; only the finished job is read
    assert counting.reads == ["jobs.get_finished"]
    for claim in claims:
        view = await app.queries.get_task(claim.task.id)
        assert view.task.status is TaskStatus.COMPLETED
        assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.COMPLETED
    assert all(c.task.status is TaskStatus.RUNNING for c in claims)  # the claims are untouched


async def test_success_that_leaves_work_in_the_job_does_not_read_the_job_row(app: App) -> None:
    result = await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(3)))
    claims = [await pop_claim(app) for _ in range(2)]
    counting = _ReadCountingStore(app.store)
    execution = ExecutionService(store=counting, queue=app.queue, policy=POLICY)
    assert await execution.complete_many(claims) == [ReportOutcome.RECORDED] * 2
    assert not [r for r in counting.reads if r.startswith("jobs.")]  # one task still queued
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.RUNNING
    last = await pop_claim(app)
    assert await complete_one(execution, last) is ReportOutcome.RECORDED
    assert "jobs.get_finished" in counting.reads  # nothing left: read and settled
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.COMPLETED


async def test_batch_with_a_reclaimed_claim_judges_each_claim_on_its_own(app: App) -> None:
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(3)))
    claims = [await pop_claim(app) for _ in range(3)]
    stale = claims[1]
    await app.queue.delete_leases([(stale.task.id, stale.run.id)])
    app.clock.advance(POLICY.stale_running_after + 1)
    await app.queue.set_leases(
        [app.execution._lease(c) for c in (claims[0], claims[2])], POLICY.lease_ttl
    )
    assert await app.reconcile.reclaim_stale() == 1
    counting = _ReadCountingStore(app.store)
    execution = ExecutionService(store=counting, queue=app.queue, policy=POLICY)
    outcomes = await execution.complete_many(claims)
    assert outcomes == [ReportOutcome.RECORDED, ReportOutcome.STALE, ReportOutcome.RECORDED]
    assert "tasks.get_many" in counting.reads  # the claim-time CAS failed: checked path
    assert await status_of(app, claims[0].task.id) is TaskStatus.COMPLETED
    assert await status_of(app, stale.task.id) is TaskStatus.QUEUED
    assert await status_of(app, claims[2].task.id) is TaskStatus.COMPLETED


async def test_a_success_batch_rerun_after_a_conflict_trusts_the_claims_again(app: App) -> None:
    """A serialization failure commits nothing, so the re-run may write from the claims again
    (its compare-and-set still guards every task): no reads of tasks and runs on either try."""
    await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(3)))
    claims = [await pop_claim(app) for _ in range(3)]
    assert isinstance(app.store, InMemoryStore)
    app.store.inject_conflicts(1)
    counting = _ReadCountingStore(app.store)
    execution = ExecutionService(store=counting, queue=app.queue, policy=POLICY)

    assert await execution.complete_many(claims) == [ReportOutcome.RECORDED] * 3

    assert app.store.retries == 1  # the first try was re-run
    assert "tasks.get_many" not in counting.reads
    assert "runs.get_many" not in counting.reads
    for claim in claims:
        assert await status_of(app, claim.task.id) is TaskStatus.COMPLETED


async def test_job_row_is_written_only_when_its_status_changes(app: App) -> None:
    result = await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(5)))
    claims = [await pop_claim(app) for _ in range(5)]
    for claim in claims:
        await complete_one(app.execution, claim)
    job = (await app.queries.get_job(result.job_id)).job
    assert job.status is JobStatus.COMPLETED
    assert job.version == 2  # pending -> running -> completed: two writes for five tasks


# --- lease heartbeat --------------------------------------------------------------------------


async def test_heartbeat_extends_our_lease(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    app.clock.advance(POLICY.lease_ttl - 1)
    assert await app.execution.heartbeat(claim) is LeaseState.EXTENDED
    app.clock.advance(POLICY.lease_ttl - 1)
    assert app.queue.get_lease(claim.task.id) is not None


async def test_heartbeat_recreates_a_lease_redis_lost_while_the_run_is_live(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    app.queue.flush()
    assert await app.execution.heartbeat(claim) is LeaseState.EXTENDED
    lease = app.queue.get_lease(claim.task.id)
    assert lease is not None and lease.run_id == claim.run.id


async def test_heartbeat_reports_lost_when_another_run_owns_the_task(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    other = Lease(task_id=claim.task.id, worker_id="w9", run_id=claim.task.job_id, deadline_ms=0)
    await app.queue.set_leases([other], 30)
    assert await app.execution.heartbeat(claim) is LeaseState.LOST
    lease = app.queue.get_lease(claim.task.id)
    assert lease is not None and lease.worker_id == "w9"


async def test_heartbeat_of_a_reclaimed_run_reports_lost(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    await app.queue.delete_leases([(claim.task.id, claim.run.id)])
    app.clock.advance(POLICY.stale_running_after + 1)
    await app.reconcile.reclaim_stale()
    assert await app.execution.heartbeat(claim) is LeaseState.LOST
    assert app.queue.get_lease(claim.task.id) is None


class _LeaseRaceQueue:
    """Stages bug 1 of issue 12: right after A's ``extend_leases`` answers MISSING, the task is
    reclaimed and claimed by worker B, whose lease is written before A re-creates its own."""

    def __init__(self, inner: Any, rival: Lease) -> None:
        self.inner = inner
        self.rival = rival

    async def extend_leases(self, leases: Sequence[Lease], ttl: float) -> list[LeaseState]:
        states: list[LeaseState] = await self.inner.extend_leases(leases, ttl)
        if LeaseState.MISSING in states:
            await self.inner.set_leases([self.rival], ttl)  # B's claim lands in between
        return states

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


async def test_heartbeat_does_not_overwrite_a_lease_written_after_its_missing_answer(
    app: App,
) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    app.queue.flush()  # Redis lost A's lease; the store still shows A's run live
    rival = Lease(task_id=claim.task.id, worker_id="w-b", run_id=uuid4(), deadline_ms=1)
    racing = ExecutionService(
        store=app.store, queue=_LeaseRaceQueue(app.queue, rival), policy=POLICY, clock=app.clock
    )
    assert await racing.heartbeat(claim) is LeaseState.LOST
    assert app.queue.get_lease(claim.task.id) == rival


async def test_heartbeat_moves_the_lease_deadline_with_each_extension(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    for _ in range(3):
        app.clock.advance(POLICY.lease_duration / 3)
        assert await app.execution.heartbeat(claim) is LeaseState.EXTENDED
        lease = app.queue.get_lease(claim.task.id)
        expected = app.clock.now().timestamp() + POLICY.lease_duration
        assert lease is not None and lease.deadline_ms == int(expected * 1000)


async def test_heartbeat_recreating_a_lost_lease_writes_the_current_deadline(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    app.clock.advance(POLICY.lease_duration / 2)
    app.queue.flush()
    assert await app.execution.heartbeat(claim) is LeaseState.EXTENDED
    lease = app.queue.get_lease(claim.task.id)
    expected = app.clock.now().timestamp() + POLICY.lease_duration
    assert lease is not None and lease.deadline_ms == int(expected * 1000)


# --- hand back --------------------------------------------------------------------------------


async def test_hand_back_requeues_at_once_without_charging_any_budget(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = result.task_ids["a"]
    claim = await pop_claim(app)
    assert await app.execution.hand_back(claim, "worker shutting down") is ReportOutcome.RECORDED
    view = await app.queries.get_task(task_id)
    assert view.task.status is TaskStatus.QUEUED
    assert view.task.attempt == 0 and view.task.reclaims == 0
    assert [r.status for r in view.runs] == [RunStatus.DEAD]
    assert app.queue.ready_ids("default") == [task_id]
    assert app.queue.get_lease(task_id) is None
    again = await pop_claim(app, "w2")
    assert again.run.attempt_number == 1


async def test_hand_back_past_a_lowered_crash_budget_fails_and_cascades() -> None:
    from dtq.application.commands import ExecutionPolicy
    from dtq.application.execution import ExecutionService
    from tests.unit.conftest import build_app

    app = build_app()
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    claim = await pop_claim(app)
    claim.task.reclaims = 0
    strict = ExecutionService(
        store=app.store, queue=app.queue, policy=ExecutionPolicy(max_reclaims=-1)
    )
    assert await strict.hand_back(claim, "worker shutting down") is ReportOutcome.RECORDED
    assert await status_of(app, result.task_ids["a"]) is TaskStatus.FAILED
    assert await status_of(app, result.task_ids["b"]) is TaskStatus.FAILED
    assert (await app.queries.get_job(result.job_id)).job.status is JobStatus.FAILED
    assert app.queue.ready_ids("default") == []


async def test_put_back_releases_the_marker_and_repushes_without_a_run(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo", priority="high"))
    task_id = result.task_ids["a"]
    assert await pop_one(app.queue, ["high"], timeout=0) == task_id
    assert await app.execution.put_back(task_id) is True
    assert app.queue.ready_ids("high") == [task_id]
    assert (await app.queries.get_task(task_id)).runs == []


async def test_put_back_of_a_task_no_longer_queued_only_releases_the_marker(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    await enqueue_one(app.queue, claim.task.id, "default")  # a duplicate delivery
    await pop_one(app.queue, ["default"], timeout=0)
    assert await app.execution.put_back(claim.task.id) is False
    assert not app.queue.has_marker(claim.task.id)
    assert app.queue.ready_ids("default") == []


# --- clock skew between the queue and the database (issue 12 bug 7) ---------------------------


class _LaggingClock:
    """The database's clock: ``behind`` seconds behind the queue server's (the FakeClock)."""

    def __init__(self, clock: FakeClock, behind: float) -> None:
        self._clock = clock
        self._behind = timedelta(seconds=behind)

    def now(self) -> datetime:
        return self._clock.now() - self._behind

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)


class _CountingStore:
    """Counts the transactions run through it (claims are the only ones in the loop below)."""

    def __init__(self, inner: InMemoryStore) -> None:
        self.inner = inner
        self.transactions = 0

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        self.transactions += 1
        return await self.inner.run(fn)

    async def ping(self) -> None:
        await self.inner.ping()


async def test_a_queue_clock_ahead_of_the_database_costs_one_wasted_claim_not_twenty() -> None:
    clock = FakeClock()
    memory = InMemoryStore(_LaggingClock(clock, behind=0.5))
    queue = InMemoryQueue(clock)
    store = _CountingStore(memory)
    execution = ExecutionService(store=store, queue=queue, policy=POLICY)
    submit = SubmitService(store=memory, queue=queue)
    await submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "echo"),)))
    first = await claim_one(execution, await pop_one(queue, ["default"], 0), "w1")  # type: ignore[arg-type]
    assert first is not None
    await execution.fail(first, "boom")  # retry due in 5 s by the database's clock
    clock.advance(POLICY.retry_backoff - 1.0)
    store.transactions = 0
    retry = None
    for _ in range(200):  # the promoter's loop, every 25 ms
        clock.advance(0.025)
        if not await queue.promote_due(100):
            continue
        retry = await claim_one(execution, await pop_one(queue, ["default"], 0), "w1")  # type: ignore[arg-type]
        if retry is not None:
            break
    assert retry is not None and retry.run.attempt_number == 2
    wasted = store.transactions - 1
    assert wasted <= 1, f"{wasted} claim transactions refused as not yet due"


# --- Redis fails after the commit -----------------------------------------------------------


class _RedisDownAfterCommit:
    """The memory queue whose post-commit calls (lease deletes, schedules, pushes, marker
    releases) raise ``BackendUnavailable`` once ``down`` is set, as Redis does in an outage."""

    FAILING = ("delete_leases", "schedule", "enqueue_many", "release_markers")

    def __init__(self, inner: InMemoryQueue) -> None:
        self.inner = inner
        self.down = False
        self.calls: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        method = getattr(self.inner, attr)
        if attr not in self.FAILING:
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.calls.append(attr)
                raise BackendUnavailable(f"redis {attr} failed: ConnectionError")
            return await method(*args, **kwargs)

        return call


@pytest.fixture
def redis_down(app: App) -> tuple[ExecutionService, _RedisDownAfterCommit]:
    queue = _RedisDownAfterCommit(app.queue)
    service = ExecutionService(
        store=app.store, queue=cast(Any, queue), policy=POLICY, clock=app.clock
    )
    return service, queue


async def test_a_success_committed_before_redis_failed_is_reported_recorded(
    app: App, redis_down: tuple[ExecutionService, _RedisDownAfterCommit]
) -> None:
    """The lease delete after the commit fails: the success is RECORDED, not raised as a
    backend failure that the worker would report again and finally log as not recorded."""
    service, queue = redis_down
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    claim = await pop_claim(app)
    queue.down = True

    outcomes = await service.complete_many([claim], ["done"])

    assert outcomes == [ReportOutcome.RECORDED]
    assert queue.calls == ["delete_leases", "enqueue_many"]
    assert await status_of(app, result.task_ids["a"]) is TaskStatus.COMPLETED
    assert await status_of(app, result.task_ids["b"]) is TaskStatus.QUEUED  # promoted


async def test_a_failure_committed_before_redis_failed_is_reported_recorded(
    app: App, redis_down: tuple[ExecutionService, _RedisDownAfterCommit]
) -> None:
    service, queue = redis_down
    result = await app.submit_tasks(TaskSpec("a", "echo", max_attempts=3))
    claim = await pop_claim(app)
    queue.down = True

    failed = await service.fail(claim, "boom")

    assert failed.outcome is ReportOutcome.RECORDED and failed.retry_at is not None
    assert queue.calls == ["delete_leases", "schedule"]
    view = await app.queries.get_task(result.task_ids["a"])
    assert (view.task.status, view.task.last_error) == (TaskStatus.QUEUED, "boom")


async def test_a_hand_back_committed_before_redis_failed_is_reported_recorded(
    app: App, redis_down: tuple[ExecutionService, _RedisDownAfterCommit]
) -> None:
    service, queue = redis_down
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    queue.down = True

    outcome = await service.hand_back(claim, "worker shutting down")

    assert outcome is ReportOutcome.RECORDED
    assert queue.calls == ["delete_leases", "release_markers"]
    assert await status_of(app, result.task_ids["a"]) is TaskStatus.QUEUED
