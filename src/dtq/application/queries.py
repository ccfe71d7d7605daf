"""Read side: tasks with their run history, jobs with their tasks and counts, the task and job
listings (issue 14 item 5), recent workers (spec §7)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from dtq.application.commands import JobPage, JobResultsView, JobView, TaskPage, TaskView
from dtq.application.filters import (
    JobFilter,
    JobKeyset,
    TaskFilter,
    TaskKeyset,
    check_limit,
    job_keyset,
    task_keyset,
)
from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Job, Task, Worker
from dtq.domain.errors import JobNotFound, TaskNotFound, ValidationError
from dtq.domain.status import TaskStatus


@dataclass(frozen=True, slots=True)
class JobGraph:
    """A job's dependency graph for drawing (the dashboard's job page, issue 16 item 3).

    Attributes:
        job: the job.
        counts: its tasks per status (every status, 0 when none).
        tasks: every task in submission order; None when the job has more than the
            ``max_tasks`` asked for (the graph is then not read at all).
        edges: ``(depends_on_task_id, task_id)`` pairs among ``tasks``; empty when ``tasks``
            is None.
        at: the read's time by the database clock (where a stream of the job's events that
            must miss nothing after this read starts: ``EventService.horizon``).
    """

    job: Job
    counts: dict[TaskStatus, int]
    tasks: list[Task] | None
    edges: list[tuple[UUID, UUID]]
    at: datetime


@dataclass(frozen=True, slots=True)
class JobCounts:
    """A job and its tasks per status, read together (the dashboard's live job page).

    Attributes:
        job: the job.
        counts: its tasks per status (every status, 0 when none).
        at: the read's time by the database clock.
        statuses: every task's status, when asked for and the job is small enough; else None.
    """

    job: Job
    counts: dict[TaskStatus, int]
    at: datetime
    statuses: dict[UUID, TaskStatus] | None = None

    @property
    def finished(self) -> bool:
        """The job is terminal and none of its tasks is unfinished (a job turns failed at
        its first failure while other tasks may still run)."""
        unfinished = (s for s in TaskStatus if not s.terminal)
        return self.job.status.terminal and not any(self.counts[s] for s in unfinished)


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

    async def get_job(
        self, job_id: UUID, *, limit: int | None = None, after: tuple[int, UUID] | None = None
    ) -> JobView:
        """The job, its task counts per status (every status, 0 when none) and its tasks: all
        of them when ``limit`` is None (spec §7), else one keyset page of at most ``limit`` in
        submission order strictly after ``after`` (``(position, id)``, the results cursor).

        Raises:
            JobNotFound: unknown id.
            ValidationError: ``limit`` below 1.
        """
        if limit is not None and limit < 1:
            raise ValidationError("limit must be at least 1", field="limit")

        async def read(tx: Transaction) -> JobView:
            job = await tx.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found", field="id")
            found = await tx.tasks.count_by_status(job_id)
            counts = {status: found.get(status, 0) for status in TaskStatus}
            if limit is None:
                return JobView(job=job, tasks=await tx.tasks.list_by_job(job_id), counts=counts)
            tasks = await tx.tasks.results_page(job_id, after=after, limit=limit + 1)
            more = len(tasks) > limit
            tasks = tasks[:limit]
            next_after = (tasks[-1].position, tasks[-1].id) if more else None
            return JobView(job=job, tasks=tasks, counts=counts, next_after=next_after)

        return await self._store.run(read)

    async def job_graph(self, job_id: UUID, *, max_tasks: int) -> JobGraph:
        """The job, its counts per status and, when it has at most ``max_tasks`` tasks, every
        task and every dependency edge between them (one transaction: a count by status on the
        job's index, then one range read of its tasks and one statement for the edges). A
        larger job reads only the counts, so the cost stays bounded by ``max_tasks``.

        Raises:
            JobNotFound: unknown id.
            ValidationError: ``max_tasks`` below 1 (field ``max_tasks``).
        """
        if max_tasks < 1:
            raise ValidationError("max_tasks must be at least 1", field="max_tasks")

        async def read(tx: Transaction) -> JobGraph:
            job = await tx.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found", field="id")
            found = await tx.tasks.count_by_status(job_id)
            counts = {status: found.get(status, 0) for status in TaskStatus}
            at = await tx.now()
            if sum(counts.values()) > max_tasks:
                return JobGraph(job=job, counts=counts, tasks=None, edges=[], at=at)
            tasks = await tx.tasks.list_by_job(job_id)
            edges = await tx.tasks.dependents_many([t.id for t in tasks]) if tasks else []
            return JobGraph(job=job, counts=counts, tasks=tasks, edges=edges, at=at)

        return await self._store.run(read)

    async def job_counts(self, job_id: UUID, *, max_tasks: int = 0) -> JobCounts:
        """The job and its tasks per status, and every task's status when the job has at most
        ``max_tasks`` tasks (one transaction: the job row, one count by status on the job's
        index, and only for such a small job one range read of its tasks).

        Raises:
            JobNotFound: unknown id.
        """

        async def read(tx: Transaction) -> JobCounts:
            job = await tx.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found", field="id")
            found = await tx.tasks.count_by_status(job_id)
            counts = {status: found.get(status, 0) for status in TaskStatus}
            statuses = None
            if sum(counts.values()) <= max_tasks:
                statuses = {t.id: t.status for t in await tx.tasks.list_by_job(job_id)}
            return JobCounts(job=job, counts=counts, at=await tx.now(), statuses=statuses)

        return await self._store.run(read)

    async def list_tasks(
        self, where: TaskFilter, *, limit: int, after: TaskKeyset | None = None
    ) -> TaskPage:
        """One page of the tasks matching ``where``, newest first, strictly after the keyset
        ``after`` (issue 14 item 5). Index range scans only; no OFFSET.

        Raises:
            ValidationError: ``limit`` outside ``1..MAX_LIST_LIMIT`` (field ``limit``).
        """
        check_limit(limit)

        async def read(tx: Transaction) -> TaskPage:
            tasks = await tx.tasks.list_page(where, after=after, limit=limit + 1)
            more = len(tasks) > limit
            tasks = tasks[:limit]
            return TaskPage(tasks=tasks, next_after=task_keyset(tasks[-1]) if more else None)

        return await self._store.run(read)

    async def matching_task_ids(
        self, where: TaskFilter, *, limit: int, after: TaskKeyset | None = None
    ) -> list[TaskKeyset]:
        """The next batch of at most ``limit`` matching tasks' keysets ``(created_at, position,
        id)`` after ``after``, in the listing's order: a bulk operation walks its filter with
        these batches, passing the last keyset back (empty: done). One short transaction.

        Raises:
            ValidationError: ``limit`` outside ``1..MAX_LIST_LIMIT`` (field ``limit``).
        """
        check_limit(limit)

        async def read(tx: Transaction) -> list[TaskKeyset]:
            return await tx.tasks.matching_task_ids(where, after=after, limit=limit)

        return await self._store.run(read)

    async def list_jobs(
        self, where: JobFilter, *, limit: int, after: JobKeyset | None = None
    ) -> JobPage:
        """One page of the jobs matching ``where``, newest first, strictly after the keyset
        ``after`` (issue 14 item 5). Index range scans only; no OFFSET.

        Raises:
            ValidationError: ``limit`` outside ``1..MAX_LIST_LIMIT`` (field ``limit``).
        """
        check_limit(limit)

        async def read(tx: Transaction) -> JobPage:
            jobs = await tx.jobs.list_page(where, after=after, limit=limit + 1)
            more = len(jobs) > limit
            jobs = jobs[:limit]
            return JobPage(jobs=jobs, next_after=job_keyset(jobs[-1]) if more else None)

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
