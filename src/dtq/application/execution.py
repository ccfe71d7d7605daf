"""What a worker does with a popped task id: claim, report, heartbeat, hand back (spec §5, §6).

Every method follows one rule: the transaction first, Redis after its commit (DESIGN §3). Every
write that ends a run is fenced on the run still being the task's live run, so a worker whose
run was reclaimed changes nothing (``ReportOutcome.STALE``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from dtq.application.commands import Claim, ExecutionPolicy, ReportOutcome
from dtq.application.ports import Lease, LeaseState, Queue, Store, Transaction
from dtq.application.transitions import (
    cascade_failure,
    mark_job_failed,
    mark_job_started,
    promote_dependents,
    settle_job,
)
from dtq.domain.entities import Task, TaskRun
from dtq.domain.errors import CommitOutcomeUnknown, StaleRun, TaskNotClaimable
from dtq.domain.status import TaskStatus


@dataclass(frozen=True, slots=True)
class _Followup:
    """Redis work to do after a commit."""

    outcome: ReportOutcome
    enqueue: tuple[Task, ...] = ()
    schedule_at: datetime | None = None


_TxFn = Callable[[Transaction], Awaitable[_Followup]]


class ExecutionService:
    """The worker-side use cases.

    Args:
        store: the system of record.
        queue: ready lists, markers, leases, scheduled set.
        policy: lease duration, retry backoff, crash budget (seconds).
    """

    def __init__(self, *, store: Store, queue: Queue, policy: ExecutionPolicy) -> None:
        self._store = store
        self._queue = queue
        self._policy = policy

    @property
    def policy(self) -> ExecutionPolicy:
        """The execution policy in force."""
        return self._policy

    # -- claim ---------------------------------------------------------------------------------

    async def claim(self, task_id: UUID, worker_id: str) -> Claim | None:
        """Claim a task id popped from a ready list (spec §5 claim flow).

        ``queued -> running`` with a new run, in one transaction; then, whatever happened, the
        pending marker is released (this worker owns the delivery since BRPOP removed the id);
        then the lease hash is set. A task that is queued but not yet due (a stale duplicate
        popped early) is refused and put back on the scheduled set for its due time.

        Args:
            task_id: the popped id.
            worker_id: this worker's identity.

        Returns:
            The claim, or None when the task was not claimable (already claimed by another
            worker, finished, unknown, or not yet due).

        Raises:
            BackendUnavailable: the database or Redis failed (the marker release was still
                attempted).
        """
        run_id = uuid4()
        claim: Claim | None = None
        try:
            claim = await self._store.run(lambda tx: _claim_tx(tx, task_id, run_id, worker_id))
        except TaskNotClaimable as refused:
            if refused.not_before is not None and refused.priority is not None:
                await self._queue.schedule(task_id, refused.priority, refused.not_before)
        except CommitOutcomeUnknown:
            claim = await self._store.run(
                lambda tx: _claim_recovered(tx, task_id, run_id, worker_id)
            )
        finally:
            await self._queue.release_marker(task_id)
        if claim is not None:
            await self._queue.set_lease(self._lease(claim), self._policy.lease_ttl)
        return claim

    async def put_back(self, task_id: UUID) -> bool:
        """Return a popped id this worker will not claim (it is shutting down).

        The delivery ends unclaimed, so its pending marker is released (spec §5, second release
        path) and, if the task is still ``queued``, the id is pushed again behind a new marker so
        another worker takes it at once instead of after a reconcile interval. No run is created.

        Returns:
            True when the id was pushed again.

        Raises:
            BackendUnavailable: the database or Redis failed (the marker release was attempted).
        """

        async def read(tx: Transaction) -> Task | None:
            return await tx.tasks.get(task_id)

        try:
            task = await self._store.run(read)
        finally:
            await self._queue.release_marker(task_id)
        if task is None or task.status is not TaskStatus.QUEUED:
            return False
        return await self._queue.enqueue(task_id, task.priority)

    # -- outcomes ------------------------------------------------------------------------------

    async def complete(self, claim: Claim) -> ReportOutcome:
        """Record the handler's success (spec §6 Success).

        Task ``completed``, run ``succeeded``, dependents whose dependencies are all complete
        promoted to ``queued``; after commit the lease is deleted and promoted tasks pushed.
        Reporting the same success twice is a no-op (``DUPLICATE``).

        Returns:
            RECORDED, DUPLICATE, or STALE when the run was reclaimed (nothing changed).
        """

        async def tx_fn(tx: Transaction) -> _Followup:
            task, run = await _load_run(tx, claim)
            now = await tx.now()
            if not task.succeed(run, at=now):
                return _Followup(ReportOutcome.DUPLICATE)
            await tx.tasks.save(task)
            await tx.runs.save(run)
            promoted = await promote_dependents(tx, task, at=now)
            await settle_job(tx, task.job_id, at=now)
            return _Followup(ReportOutcome.RECORDED, enqueue=tuple(promoted))

        return await self._report(claim, tx_fn)

    async def fail(self, claim: Claim, error: str, *, permanent: bool = False) -> ReportOutcome:
        """Record the handler's failure (spec §6 Failure, Unknown kind).

        The run becomes ``failed`` with ``error``; the task is retried after
        ``policy.retry_backoff`` seconds through the scheduled set while attempts remain and
        the error is not ``permanent``, else it fails and its pending dependents are failed
        transitively, and the job fails.

        Returns:
            RECORDED, DUPLICATE (this failure was already recorded), or STALE.
        """
        backoff = timedelta(seconds=self._policy.retry_backoff)

        async def tx_fn(tx: Transaction) -> _Followup:
            task, run = await _load_run(tx, claim)
            now = await tx.now()
            decision = task.fail(run, error=error, permanent=permanent, backoff=backoff, at=now)
            if decision is None:
                return _Followup(ReportOutcome.DUPLICATE)
            await tx.tasks.save(task)
            await tx.runs.save(run)
            if decision.retry:
                return _Followup(ReportOutcome.RECORDED, schedule_at=decision.next_attempt_at)
            await cascade_failure(tx, task, at=now)
            await mark_job_failed(tx, task.job_id, at=now)
            return _Followup(ReportOutcome.RECORDED)

        return await self._report(claim, tx_fn)

    async def hand_back(self, claim: Claim, reason: str) -> ReportOutcome:
        """Give an unfinished task back at once (graceful shutdown, spec §6).

        Like a reclaim — run ``dead``, task ``queued`` due now, attempt rolled back — but the
        crash budget is not charged. After commit the marker is released and the id re-pushed.

        Returns:
            RECORDED, or STALE when the run is no longer live.
        """

        async def tx_fn(tx: Transaction) -> _Followup:
            task, run = await _load_run(tx, claim)
            now = await tx.now()
            requeued = task.reclaim(
                run,
                reason=reason,
                max_reclaims=self._policy.max_reclaims,
                at=now,
                worker_lost=False,
            )
            await tx.tasks.save(task)
            await tx.runs.save(run)
            if requeued:
                return _Followup(ReportOutcome.RECORDED, enqueue=(task,))
            # already past a crash budget lowered since: it fails like a reclaim past budget
            await cascade_failure(tx, task, at=now)
            await mark_job_failed(tx, task.job_id, at=now)
            return _Followup(ReportOutcome.RECORDED)

        return await self._report(claim, tx_fn, release_marker=True)

    async def _report(
        self,
        claim: Claim,
        tx_fn: _TxFn,
        *,
        release_marker: bool = False,
    ) -> ReportOutcome:
        try:
            try:
                followup = await self._store.run(tx_fn)
            except CommitOutcomeUnknown:
                # Every report is idempotent (a replay is DUPLICATE): run it again to learn.
                followup = await self._store.run(tx_fn)
        except StaleRun:
            return ReportOutcome.STALE
        await self._queue.delete_lease(claim.task.id, claim.run.id)
        if followup.schedule_at is not None:
            await self._queue.schedule(claim.task.id, claim.task.priority, followup.schedule_at)
        for task in followup.enqueue:
            if release_marker:
                await self._queue.release_marker(task.id)
            await self._queue.enqueue(task.id, task.priority)
        return followup.outcome

    # -- lease ---------------------------------------------------------------------------------

    async def heartbeat(self, claim: Claim) -> LeaseState:
        """Extend the claim's lease (spec §6 Lease / heartbeat, DESIGN §3 lease ownership).

        If Redis lost the lease while the store still shows this run live, the lease is
        re-created. Returns LOST when another run owns the task now (cancel the handler and
        report nothing).

        Returns:
            ``LeaseState.EXTENDED`` or ``LeaseState.LOST`` (never MISSING).

        Raises:
            BackendUnavailable: Redis or the database failed.
        """
        lease = self._lease(claim)
        state = await self._queue.extend_lease(lease, self._policy.lease_ttl)
        if state is not LeaseState.MISSING:
            return state

        async def live(tx: Transaction) -> bool:
            task = await tx.tasks.get(claim.task.id)
            return (
                task is not None
                and task.status is TaskStatus.RUNNING
                and task.current_run_id == claim.run.id
            )

        if not await self._store.run(live):
            return LeaseState.LOST
        await self._queue.set_lease(lease, self._policy.lease_ttl)
        return LeaseState.EXTENDED

    def _lease(self, claim: Claim) -> Lease:
        deadline = claim.run.started_at.timestamp() + self._policy.lease_duration
        return Lease(
            task_id=claim.task.id,
            worker_id=claim.worker_id,
            run_id=claim.run.id,
            deadline_ms=int(deadline * 1000),
        )


async def _claim_tx(tx: Transaction, task_id: UUID, run_id: UUID, worker_id: str) -> Claim:
    task = await tx.tasks.get(task_id)
    if task is None:
        raise TaskNotClaimable(f"task {task_id} does not exist")
    now = await tx.now()
    run = task.claim(run_id=run_id, worker_id=worker_id, at=now)
    await tx.tasks.save(task)
    await tx.runs.add(run)
    await mark_job_started(tx, task.job_id, at=now)
    return Claim(task=task, run=run, worker_id=worker_id)


async def _claim_recovered(
    tx: Transaction, task_id: UUID, run_id: UUID, worker_id: str
) -> Claim | None:
    """After an ambiguous commit: the claim stuck exactly when our run is the live one."""
    task = await tx.tasks.get(task_id)
    run = await tx.runs.get(run_id)
    if task is None or run is None or task.current_run_id != run_id:
        return None
    return Claim(task=task, run=run, worker_id=worker_id)


async def _load_run(tx: Transaction, claim: Claim) -> tuple[Task, TaskRun]:
    task = await tx.tasks.get(claim.task.id)
    run = await tx.runs.get(claim.run.id)
    if task is None or run is None:
        raise StaleRun(f"run {claim.run.id} of task {claim.task.id} no longer exists")
    return task, run
