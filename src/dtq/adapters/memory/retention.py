"""``RetentionRepository`` of the in-memory store (issue 14 item 8).

Deletions and tombstones are staged on the transaction and applied by its commit, like every
other write of the fake; transactions are serialised, so two passes deleting the same job never
overlap: the second finds it gone and counts nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING
from uuid import UUID

from dtq.application.ports import FinishedJob, PrunedJobs, Tombstone
from dtq.domain.status import JobStatus

if TYPE_CHECKING:
    from dtq.adapters.memory.store import _MemoryTransaction


class MemoryRetention:
    """``RetentionRepository`` over one memory transaction."""

    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    def _jobs(self) -> list[tuple[datetime, UUID, JobStatus]]:
        tx = self._tx
        ids = set(tx.tables.jobs) | {job.id for job, _, _ in tx.new_jobs}
        found = (tx.job(job_id) for job_id in ids)
        return [(j.updated_at, j.id, j.status) for j in found if j is not None]

    async def finished_jobs(
        self,
        *,
        status: JobStatus,
        updated_before: datetime,
        after: tuple[datetime, UUID] | None,
        limit: int,
    ) -> list[FinishedJob]:
        rows = sorted(
            (at, job_id)
            for at, job_id, stored in self._jobs()
            if stored is status and at < updated_before and (after is None or (at, job_id) > after)
        )
        return [FinishedJob(id=job_id, updated_at=at) for at, job_id in rows[:limit]]

    async def task_counts(self, job_ids: Sequence[UUID]) -> dict[UUID, int]:
        counts = {job_id: len(self._tx.job_task_ids(job_id)) for job_id in dict.fromkeys(job_ids)}
        return {job_id: n for job_id, n in counts.items() if n}

    async def delete_jobs(
        self,
        job_ids: Sequence[UUID],
        *,
        status: JobStatus,
        finished_before: datetime,
        tombstone_at: datetime | None,
    ) -> PrunedJobs:
        tx = self._tx
        jobs = tasks = runs = written = 0
        for job_id in dict.fromkeys(job_ids):
            job = tx.job(job_id)
            if job is None or job.status is not status or job.updated_at >= finished_before:
                continue
            found = [tx.task(task_id) for task_id in tx.job_task_ids(job_id)]
            job_tasks = [task for task in found if task is not None]
            if any(
                not task.status.terminal or (task.finished_at or task.updated_at) >= finished_before
                for task in job_tasks
            ):
                continue
            tx.deleted_jobs.add(job_id)
            jobs += 1
            tasks += len(job_tasks)
            runs += sum(len(tx.run_ids(task.id)) for task in job_tasks)
            if tombstone_at is not None and job.idempotency_key is not None:
                tx.tombstones[job.idempotency_key] = Tombstone(
                    idempotency_key=job.idempotency_key,
                    request_hash=job.request_hash,
                    job_id=job_id,
                    task_ids={task.name: task.id for task in job_tasks},
                    pruned_at=tombstone_at,
                )
                written += 1
        return PrunedJobs(jobs=jobs, tasks=tasks, runs=runs, tombstones_written=written)

    async def get_tombstone(self, key: str) -> Tombstone | None:
        tx = self._tx
        if key in tx.tombstones:
            return tx.tombstones[key]
        return tx.tables.tombstones.get(key)

    async def delete_tombstones(self, *, pruned_before: datetime, limit: int) -> int:
        tx = self._tx
        merged: dict[str, Tombstone | None] = dict(tx.tables.tombstones)
        merged.update(tx.tombstones)
        expired = sorted(
            (t.pruned_at, key)
            for key, t in merged.items()
            if t is not None and t.pruned_at < pruned_before
        )[:limit]
        for _, key in expired:
            tx.tombstones[key] = None
        return len(expired)
