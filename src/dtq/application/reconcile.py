"""Repairing Redis from the store: enqueue due work, reclaim abandoned runs (spec §2, §5).

Redis is an optimisation, not the system of record: whatever it lost (a push that never happened
after a commit, a flushed ready list, a lease that expired because its worker died) is put back
from the store by these passes. Every step is safe to race with another orchestrator: pushes go
through the pending marker, and reclaims are fenced on the run id.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from dtq.application.commands import ExecutionPolicy, ReconcileReport
from dtq.application.ports import DueTask, Queue, RunningTask, Store, Transaction
from dtq.application.transitions import cascade_failure, mark_job_failed
from dtq.domain.entities import Task
from dtq.domain.errors import StaleRun
from dtq.domain.status import TaskStatus

#: ``task_runs.error`` of a run abandoned because its lease vanished.
LEASE_EXPIRED = "lease expired: worker stopped heartbeating"


class ReconcileService:
    """The orchestrator's repair passes.

    Each pass handles at most ``limit`` candidates and remembers a keyset cursor, so successive
    passes reach every candidate however many there are (DESIGN §5).

    Args:
        store: the system of record.
        queue: the fast path.
        policy: stale threshold and crash budget.
    """

    def __init__(self, *, store: Store, queue: Queue, policy: ExecutionPolicy) -> None:
        self._store = store
        self._queue = queue
        self._policy = policy
        self._due_cursor: tuple[datetime, UUID] | None = None
        self._stale_cursor: UUID | None = None

    async def enqueue_due(self, limit: int = 500) -> int:
        """Push ``queued`` tasks with ``scheduled_at <= now`` behind the pending marker.

        Returns:
            How many ids were pushed (tasks whose marker is set are skipped: in flight; a
            task still waiting in its ready list is not pushed twice).

        Raises:
            BackendUnavailable: the database or Redis failed.
        """
        cursor = self._due_cursor

        async def read(tx: Transaction) -> list[DueTask]:
            return await tx.tasks.due_queued(now=await tx.now(), after=cursor, limit=limit)

        due = await self._store.run(read)
        self._due_cursor = (due[-1].scheduled_at, due[-1].id) if len(due) == limit else None
        # An id whose marker expired while it waited in a long ready list is found there and
        # only gets its marker back: a backlog never fills Redis with duplicates.
        return await self._queue.enqueue_unlisted([(task.id, task.priority) for task in due])

    async def reclaim_stale(self, limit: int = 500) -> int:
        """Reclaim ``running`` tasks older than ``stale_running_after`` that have no lease.

        Each reclaim (one transaction, fenced on the run id) closes the run as ``dead`` and
        re-queues the task with its attempt rolled back; then the pending marker left by the
        abandoned delivery is released and the id pushed again (spec §5, third release path).
        A task past its crash budget fails instead (DESIGN §3), cascading to its dependents.

        Returns:
            How many runs were reclaimed.

        Raises:
            BackendUnavailable: the database or Redis failed.
        """
        cursor = self._stale_cursor
        stale_after = timedelta(seconds=self._policy.stale_running_after)

        async def read(tx: Transaction) -> list[RunningTask]:
            before = await tx.now() - stale_after
            return await tx.tasks.stale_running(started_before=before, after=cursor, limit=limit)

        candidates = await self._store.run(read)
        self._stale_cursor = candidates[-1].id if len(candidates) == limit else None
        if not candidates:
            return 0
        leased = await self._queue.leases_present([c.id for c in candidates])
        reclaimed = 0
        for candidate in candidates:
            if candidate.id in leased:
                continue
            task = await self._reclaim_one(candidate)
            if task is None:
                continue
            reclaimed += 1
            await self._queue.release_marker(task.id)
            if task.status is TaskStatus.QUEUED:
                await self._queue.enqueue(task.id, task.priority)
        return reclaimed

    async def _reclaim_one(self, candidate: RunningTask) -> Task | None:
        max_reclaims = self._policy.max_reclaims

        async def tx_fn(tx: Transaction) -> Task | None:
            task = await tx.tasks.get(candidate.id)
            run = await tx.runs.get(candidate.run_id)
            if task is None or run is None:
                return None
            now = await tx.now()
            try:
                requeued = task.reclaim(
                    run, reason=LEASE_EXPIRED, max_reclaims=max_reclaims, at=now
                )
            except StaleRun:
                return None  # the run ended or was reclaimed since we listed it
            await tx.tasks.save(task)
            await tx.runs.save(run)
            if not requeued:
                await cascade_failure(tx, task, at=now)
                await mark_job_failed(tx, task.job_id, at=now)
            return task

        return await self._store.run(tx_fn)

    async def promote_scheduled(self, limit: int = 1000) -> int:
        """Move due entries of the scheduled set to their ready lists (retry backoff, delays).

        Returns:
            How many ids were pushed.
        """
        return await self._queue.promote_due(limit)

    async def reconcile_once(self, limit: int = 500, *, max_pages: int = 10) -> ReconcileReport:
        """One full pass: reclaim stale runs, then enqueue due tasks, then promote scheduled.

        Each step pages through its candidates ``limit`` at a time until a page comes back
        short or ``max_pages`` pages were handled, so a large backlog is repaired in one pass
        while the pass stays bounded (the cursor carries on next pass).

        Raises:
            BackendUnavailable: the database or Redis failed mid-pass.
        """
        reclaimed = enqueued = 0
        for _ in range(max_pages):
            reclaimed += await self.reclaim_stale(limit)
            if self._stale_cursor is None:
                break
        for _ in range(max_pages):
            enqueued += await self.enqueue_due(limit)
            if self._due_cursor is None:
                break
        promoted = await self.promote_scheduled(limit)
        return ReconcileReport(enqueued=enqueued, reclaimed=reclaimed, promoted=promoted)
