"""Repairing Redis from the store: enqueue due work, reclaim abandoned runs (spec §2, §5).

Redis is an optimisation, not the system of record: whatever it lost (a push that never happened
after a commit, a flushed ready list, a lease that expired because its worker died) is put back
from the store by these passes. Every step is safe to race with another orchestrator: pushes go
through the pending marker, and reclaims are fenced on the run id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from dtq.application.commands import ExecutionPolicy, ReconcileReport
from dtq.application.fleet import on_queue
from dtq.application.ports import DueTask, Queue, RunningTask, Store, Transaction
from dtq.application.transitions import cascade_failure, mark_job_failed
from dtq.domain.entities import DEFAULT_PRIORITY, Task, TaskRun, Worker
from dtq.domain.errors import StaleRun
from dtq.domain.status import TaskStatus

#: ``task_runs.error`` of a run abandoned because its lease vanished.
LEASE_EXPIRED = "lease expired: worker stopped heartbeating"

#: ``task_runs.error`` of a run started before the queue lost its data whose lease was not
#: re-created within the grace period: reclaimed without charging the crash budget.
LEASE_LOST_WITH_QUEUE = "lease lost with the queue's data and not re-created"


class ReconcileService:
    """The orchestrator's repair passes.

    Each pass handles at most ``limit`` candidates and remembers a keyset cursor, so successive
    passes reach every candidate however many there are (DESIGN §5).

    Args:
        store: the system of record.
        queue: the fast path.
        policy: stale threshold, lease TTL and crash budget.
        worker_alive_within: seconds since its last registry heartbeat within which a worker
            counts as live, for the priorities live workers poll and for the runs held back
            below (default: three times the default ``WORKER_HEARTBEAT_INTERVAL``).
        queue_prefix: the Redis key prefix this orchestrator's queue uses (its hash-tagged
            form). The runs of a live worker whose registry row names another prefix are not
            reclaimed: their leases are under that prefix, where this queue does not look
            (``reclaim_stale``). None reclaims without looking at the registry.
    """

    def __init__(
        self,
        *,
        store: Store,
        queue: Queue,
        policy: ExecutionPolicy,
        worker_alive_within: float = 90.0,
        queue_prefix: str | None = None,
    ) -> None:
        self._store = store
        self._queue = queue
        self._policy = policy
        self._due_cursor: tuple[datetime, UUID] | None = None
        self._stale_cursor: UUID | None = None
        self._epoch_token = uuid4().hex
        self._reclaim_deferred = False  # the last reclaim_stale held back: queue data too young
        self._queue_reset = False  # the last reclaim_stale found the queue's data lost
        self._due_counts: Counter[str] = Counter()  # due queued tasks per priority, this cycle
        self._due_cycle: dict[str, int] | None = None  # the counts of the last complete cycle
        self._worker_alive_within = timedelta(seconds=worker_alive_within)
        self._queue_prefix = queue_prefix
        self._held: Counter[str] = Counter()  # runs held back this pass, by their worker's prefix

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
        self._due_counts.update(task.priority for task in due)
        if self._due_cursor is None:  # the listing reached its end: a complete count
            self._due_cycle, self._due_counts = dict(self._due_counts), Counter()
        # An id whose marker expired while it waited in a long ready list, or in the routed list
        # of its kind (issue 15 item 2: no live worker serves it), is found there and only gets
        # its marker back: a backlog never fills Redis with duplicates.
        return await self._queue.enqueue_unlisted(
            [(task.id, task.priority, task.kind) for task in due]
        )

    async def reclaim_stale(self, limit: int = 500) -> int:
        """Reclaim ``running`` tasks older than ``stale_running_after`` that have no lease.

        Each reclaim (one transaction, fenced on the run id) closes the run as ``dead`` and
        re-queues the task with its attempt rolled back; then the pending marker left by the
        abandoned delivery is released and the id pushed again (spec §5, third release path).
        A task past its crash budget fails instead (DESIGN §3), cascading to its dependents.

        A run without a lease whose worker is live (a registry heartbeat within
        ``worker_alive_within``) and registered with another Redis key prefix than
        ``queue_prefix`` is held back, not reclaimed: its lease is under that prefix (two
        deployments on one database, or a mistyped ``REDIS_KEY_PREFIX``). It is counted by
        that prefix in the pass's ``ReconcileReport.reclaims_held``, and reclaimed once its
        worker's heartbeat is older than that window (the worker died).

        A lease that vanished together with all the queue's data is no sign that its worker
        died. So each call first reads the queue's epoch (``Queue.epoch``): while the queue's
        data set is younger than one lease TTL (it was just lost, or this is its first use),
        nothing is reclaimed, giving live workers a heartbeat to re-create their leases. After
        that, a run that started before the data set began is reclaimed without charging the
        crash budget (``LEASE_LOST_WITH_QUEUE``): its lease may have been lost with the queue,
        not with its worker. Its next run starts after the loss, so the exemption is once per
        task and loss.

        Returns:
            How many runs were reclaimed.

        Raises:
            BackendUnavailable: the database or Redis failed.
        """
        cursor = self._stale_cursor
        stale_after = timedelta(seconds=self._policy.stale_running_after)
        epoch = await self._queue.epoch(self._epoch_token)
        self._queue_reset = epoch.created

        async def read(tx: Transaction) -> tuple[datetime, list[RunningTask]]:
            now = await tx.now()
            before = now - stale_after
            found = await tx.tasks.stale_running(started_before=before, after=cursor, limit=limit)
            return now, found

        now, candidates = await self._store.run(read)
        # When the queue's data set began, on the database's clock (its age is skew-free).
        queue_began = now - timedelta(seconds=epoch.age)
        self._reclaim_deferred = epoch.age < self._policy.lease_ttl
        if self._reclaim_deferred:
            return 0  # the cursor stays: the same candidates are looked at after the grace
        self._stale_cursor = candidates[-1].id if len(candidates) == limit else None
        if not candidates:
            return 0
        leased = await self._queue.leases_present([c.id for c in candidates])
        unleased = [c for c in candidates if c.id not in leased]
        held = await self._leased_elsewhere(unleased) if unleased else {}
        self._held.update(held.values())
        reclaimed = 0
        for candidate in unleased:
            if candidate.run_id in held:
                continue
            lost_with_queue = candidate.started_at < queue_began
            task = await self._reclaim_one(candidate, lost_with_queue=lost_with_queue)
            if task is None:
                continue
            reclaimed += 1
            await self._queue.release_markers([task.id])
            if task.status is TaskStatus.QUEUED:
                await self._queue.enqueue_many([(task.id, task.priority)])
        return reclaimed

    async def _leased_elsewhere(self, candidates: Sequence[RunningTask]) -> dict[UUID, str]:
        """The candidates' runs whose worker is live and registered with another Redis key
        prefix than this queue's, each mapped to that prefix (one read of the runs and the live
        workers; nothing when ``queue_prefix`` is None)."""
        mine = self._queue_prefix
        if mine is None:
            return {}
        alive_within = self._worker_alive_within

        async def read(tx: Transaction) -> tuple[list[TaskRun], list[Worker]]:
            runs = await tx.runs.get_many([c.run_id for c in candidates])
            return runs, await tx.workers.list_active(since=await tx.now() - alive_within)

        runs, workers = await self._store.run(read)
        prefixes = {worker.id: worker.redis_key_prefix for worker in workers}
        held: dict[UUID, str] = {}
        for run in runs:
            prefix = prefixes.get(run.worker_id)
            if prefix is not None and prefix != mine:
                held[run.id] = prefix
        return held

    async def _reclaim_one(self, candidate: RunningTask, *, lost_with_queue: bool) -> Task | None:
        max_reclaims = self._policy.max_reclaims
        reason = LEASE_LOST_WITH_QUEUE if lost_with_queue else LEASE_EXPIRED

        async def tx_fn(tx: Transaction) -> Task | None:
            task = await tx.tasks.get(candidate.id)
            run = await tx.runs.get(candidate.run_id)
            if task is None or run is None:
                return None
            now = await tx.now()
            try:
                requeued = task.reclaim(
                    run,
                    reason=reason,
                    max_reclaims=max_reclaims,
                    at=now,
                    worker_lost=not lost_with_queue,
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

        The report also carries the due tasks no live worker polls (see ``ReconcileReport``)
        and whether reclaims were held back after the queue lost its data.

        Each step pages through its candidates ``limit`` at a time until a page comes back
        short or ``max_pages`` pages were handled, so a large backlog is repaired in one pass
        while the pass stays bounded (the cursor carries on next pass).

        Raises:
            BackendUnavailable: the database or Redis failed mid-pass.
        """
        reclaimed = enqueued = 0
        self._held.clear()
        for _ in range(max_pages):
            reclaimed += await self.reclaim_stale(limit)
            if self._stale_cursor is None or self._reclaim_deferred:
                break
        for _ in range(max_pages):
            enqueued += await self.enqueue_due(limit)
            if self._due_cursor is None:
                break
        promoted = await self.promote_scheduled(limit)
        return ReconcileReport(
            enqueued=enqueued,
            reclaimed=reclaimed,
            promoted=promoted,
            unpolled=await self._unpolled(),
            queue_reset=self._queue_reset,
            reclaim_deferred=self._reclaim_deferred,
            reclaims_held=dict(sorted(self._held.items())),
        )

    async def _unpolled(self) -> dict[str, int] | None:
        """Due ``queued`` tasks per priority that no live worker polls, from the last complete
        count of the due listing (None when no count completed since the last call).

        A worker polls the priorities its registry row lists under ``metadata["priorities"]``;
        a row without that field polls the default tier only (workers older than issue 14 item
        7 recorded it only when they polled something else; workers now always record it); a
        malformed field counts as polling every priority. A worker registered with another
        Redis key prefix polls none of this queue's lists (``fleet.on_queue``).
        """
        counts, self._due_cycle = self._due_cycle, None
        if counts is None:
            return None
        alive_within = self._worker_alive_within

        async def read(tx: Transaction) -> list[Worker]:
            return await tx.workers.list_active(since=await tx.now() - alive_within)

        polled: set[str] = set()
        for worker in on_queue(await self._store.run(read), self._queue_prefix):
            priorities = worker.metadata.get("priorities", [DEFAULT_PRIORITY])
            if not isinstance(priorities, list):
                return {}
            polled.update(str(priority) for priority in priorities)
        return {p: n for p, n in sorted(counts.items()) if n and p not in polled}
