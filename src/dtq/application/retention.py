"""Retention: deleting finished jobs and expired idempotency tombstones (issue 14 item 8), and
expired dashboard sessions (issue 16 item 3).

A job whose tasks are all terminal is deleted, with its tasks, dependency edges and runs (a
task's result lives on its row), once it finished longer ago than its status's retention. A
job created under an ``Idempotency-Key`` leaves a tombstone in the same transaction, so a
replay of the key still answers the original ids for the key's TTL; tombstones past it are
deleted by the same pass. Every delete re-checks its conditions in its own transaction, so
several orchestrators may run the pass at once: a job deleted by one is skipped (and not
counted) by the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from dtq.application.ports import FinishedJob, PrunedJobs, Store, Transaction
from dtq.domain.status import JobStatus


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long finished jobs and idempotency tombstones are kept, in seconds; ``0`` disables.

    Attributes:
        completed: ``RETENTION_COMPLETED``: completed jobs; 0 keeps them for ever.
        failed: ``RETENTION_FAILED``: failed and cancelled jobs; 0 keeps them for ever.
        idempotency_key_ttl: ``IDEMPOTENCY_KEY_TTL``: how long a pruned job's key still
            answers its original ids; 0 writes no tombstone (the key is free once its job is
            pruned) and deletes any tombstone left from before.
    """

    completed: float = 7 * 86400.0
    failed: float = 30 * 86400.0
    idempotency_key_ttl: float = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class PruneReport:
    """Counts of one retention pass.

    Attributes:
        jobs, tasks, runs: rows deleted with their jobs.
        tombstones_written: tombstones left by deleted jobs holding an idempotency key.
        tombstones: expired tombstones deleted.
        sessions: expired dashboard sessions deleted.
        more: the pass stopped at its page bound with candidates left; run the next one soon.
    """

    jobs: int = 0
    tasks: int = 0
    runs: int = 0
    tombstones_written: int = 0
    tombstones: int = 0
    sessions: int = 0
    more: bool = False

    @property
    def pruned(self) -> bool:
        """True when the pass deleted anything."""
        return bool(self.jobs or self.tombstones or self.sessions)


class RetentionService:
    """The retention pass the reconciler runs.

    Each pass pages through the candidates of each terminal status with a keyset cursor on
    ``(updated_at, id)``, so jobs that cannot be deleted yet (a failed job with a task still
    running) never hold back the ones behind them; deleted ones simply vanish from the listing.

    Args:
        store: the system of record.
        policy: the retention periods.
        batch_jobs: most jobs listed per page (and deleted per transaction).
        batch_tasks: most tasks deleted per transaction: a page is split into transactions of
            whole jobs holding at most this many tasks (a single larger job is deleted alone).
        max_pages: most pages per status group and per pass, so a pass stays bounded.

    Raises:
        ValueError: a retention is negative or a batch bound is below 1.
    """

    def __init__(
        self,
        *,
        store: Store,
        policy: RetentionPolicy,
        batch_jobs: int = 100,
        batch_tasks: int = 1000,
        max_pages: int = 10,
    ) -> None:
        if min(policy.completed, policy.failed, policy.idempotency_key_ttl) < 0:
            raise ValueError("retention periods must not be negative")
        if min(batch_jobs, batch_tasks, max_pages) < 1:
            raise ValueError("batch bounds must be at least 1")
        self._store = store
        self._policy = policy
        self._batch_jobs = batch_jobs
        self._batch_tasks = batch_tasks
        self._max_pages = max_pages
        self._cursors: dict[JobStatus, tuple[datetime, UUID] | None] = {}

    async def prune_once(self) -> PruneReport:
        """One pass: completed jobs, then failed, then cancelled ones, then expired tombstones,
        then expired dashboard sessions.

        Returns:
            What was deleted.

        Raises:
            BackendUnavailable: the database failed mid-pass (what was deleted stays deleted).
        """
        totals = PrunedJobs()
        for status, seconds in (
            (JobStatus.COMPLETED, self._policy.completed),
            (JobStatus.FAILED, self._policy.failed),
            (JobStatus.CANCELLED, self._policy.failed),  # cancelled is kept as long as failed
        ):
            if seconds > 0:
                totals = _add(totals, await self._prune_status(status, timedelta(seconds=seconds)))
        tombstones, tombstones_left = await self._prune_tombstones()
        sessions, sessions_left = await self._prune_sessions()
        jobs_left = any(c is not None for c in self._cursors.values())
        return PruneReport(
            jobs=totals.jobs,
            tasks=totals.tasks,
            runs=totals.runs,
            tombstones_written=totals.tombstones_written,
            tombstones=tombstones,
            sessions=sessions,
            more=tombstones_left or sessions_left or jobs_left,
        )

    async def _prune_status(self, status: JobStatus, retention: timedelta) -> PrunedJobs:
        totals = PrunedJobs()
        limit = self._batch_jobs
        for _ in range(self._max_pages):
            cursor = self._cursors.get(status)

            async def read(
                tx: Transaction, cursor: tuple[datetime, UUID] | None = cursor
            ) -> tuple[list[FinishedJob], dict[UUID, int]]:
                found = await tx.retention.finished_jobs(
                    status=status,
                    updated_before=await tx.now() - retention,
                    after=cursor,
                    limit=limit,
                )
                return found, await tx.retention.task_counts([job.id for job in found])

            candidates, counts = await self._store.run(read)
            for chunk in _chunks(candidates, counts, self._batch_tasks):
                totals = _add(totals, await self._delete(chunk, status, retention))
            last = candidates[-1] if len(candidates) == limit else None
            self._cursors[status] = None if last is None else (last.updated_at, last.id)
            if last is None:
                break
        return totals

    async def _delete(
        self, job_ids: list[UUID], status: JobStatus, retention: timedelta
    ) -> PrunedJobs:
        keep_keys = self._policy.idempotency_key_ttl > 0

        async def delete(tx: Transaction) -> PrunedJobs:
            now = await tx.now()
            return await tx.retention.delete_jobs(
                job_ids,
                status=status,
                finished_before=now - retention,
                tombstone_at=now if keep_keys else None,
            )

        return await self._store.run(delete)

    async def _prune_tombstones(self) -> tuple[int, bool]:
        """Delete expired tombstones, a bounded page per transaction.

        Returns:
            How many were deleted, and whether the pass stopped at its bound (more may be left).
        """
        ttl = timedelta(seconds=self._policy.idempotency_key_ttl)
        limit = self._batch_jobs * 10  # a tombstone is one small row
        deleted = 0
        for _ in range(self._max_pages):

            async def delete(tx: Transaction) -> int:
                before = await tx.now() - ttl
                return await tx.retention.delete_tombstones(pruned_before=before, limit=limit)

            count = await self._store.run(delete)
            deleted += count
            if count < limit:
                return deleted, False
        return deleted, True

    async def _prune_sessions(self) -> tuple[int, bool]:
        """Delete expired dashboard sessions, a bounded page per transaction (like tombstones).

        Returns:
            How many were deleted, and whether the pass stopped at its bound.
        """
        limit = self._batch_jobs * 10
        deleted = 0
        for _ in range(self._max_pages):

            async def delete(tx: Transaction) -> int:
                return await tx.sessions.delete_expired(await tx.now(), limit)

            count = await self._store.run(delete)
            deleted += count
            if count < limit:
                return deleted, False
        return deleted, True


def _chunks(
    candidates: Sequence[FinishedJob], counts: dict[UUID, int], max_tasks: int
) -> list[list[UUID]]:
    """Split ``candidates`` into runs of whole jobs holding at most ``max_tasks`` tasks each
    (a job larger than that alone), in order."""
    chunks: list[list[UUID]] = []
    current: list[UUID] = []
    tasks = 0
    for job in candidates:
        size = counts.get(job.id, 0)
        if current and tasks + size > max_tasks:
            chunks.append(current)
            current, tasks = [], 0
        current.append(job.id)
        tasks += size
    if current:
        chunks.append(current)
    return chunks


def _add(a: PrunedJobs, b: PrunedJobs) -> PrunedJobs:
    return PrunedJobs(
        jobs=a.jobs + b.jobs,
        tasks=a.tasks + b.tasks,
        runs=a.runs + b.runs,
        tombstones_written=a.tombstones_written + b.tombstones_written,
    )
