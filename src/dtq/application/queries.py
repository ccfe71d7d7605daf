"""Read side: tasks with their run history, jobs with their tasks, recent workers (spec §7)."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from dtq.application.commands import JobResultsView, JobView, TaskView
from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Worker
from dtq.domain.errors import JobNotFound, TaskNotFound, ValidationError


class QueryService:
    """Reads for the HTTP API. Each read is one short transaction.

    Args:
        store: the system of record.
    """

    def __init__(self, *, store: Store) -> None:
        self._store = store

    async def get_task(self, task_id: UUID) -> TaskView:
        """The task and its runs ordered by ``started_at`` (spec §4: runs keyed by id).

        Raises:
            TaskNotFound: unknown id.
        """

        async def read(tx: Transaction) -> TaskView:
            task = await tx.tasks.get(task_id)
            if task is None:
                raise TaskNotFound(f"task {task_id} not found", field="id")
            return TaskView(task=task, runs=await tx.runs.list_for_task(task_id))

        return await self._store.run(read)

    async def get_job(self, job_id: UUID) -> JobView:
        """The job and all its tasks.

        Raises:
            JobNotFound: unknown id.
        """

        async def read(tx: Transaction) -> JobView:
            job = await tx.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found", field="id")
            return JobView(job=job, tasks=await tx.tasks.list_by_job(job_id))

        return await self._store.run(read)

    async def job_results(
        self, job_id: UUID, *, limit: int, after: tuple[int, UUID] | None = None
    ) -> JobResultsView:
        """One page of the job's task results in submission order, keyset-paged: at most
        ``limit`` tasks strictly after the cursor ``after`` (an index range scan; the cost does
        not grow with the job's size).

        Raises:
            JobNotFound: unknown id.
            ValidationError: ``limit`` below 1.
        """
        if limit < 1:
            raise ValidationError("limit must be at least 1", field="limit")

        async def read(tx: Transaction) -> JobResultsView:
            job = await tx.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found", field="id")
            tasks = await tx.tasks.results_page(job_id, after=after, limit=limit + 1)
            more = len(tasks) > limit
            tasks = tasks[:limit]
            last = tasks[-1] if more else None
            next_after = None if last is None else (last.position, last.id)
            return JobResultsView(job=job, tasks=tasks, next_after=next_after)

        return await self._store.run(read)

    async def list_workers(self, active_within: float) -> list[Worker]:
        """Workers whose registry heartbeat is at most ``active_within`` seconds old (database
        clock), most recent first (spec §7 GET /v1/workers).

        Raises:
            ValidationError: ``active_within`` is not positive.
        """
        if not active_within > 0:
            raise ValidationError("active_since must be a positive duration", field="active_since")

        async def read(tx: Transaction) -> list[Worker]:
            since = await tx.now() - timedelta(seconds=active_within)
            return await tx.workers.list_active(since)

        return await self._store.run(read)
