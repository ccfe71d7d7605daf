"""Operator control of tasks: cancel and manual retry (issue 14 items 1 and 4).

Every use case is the transaction first and Redis after its commit (DESIGN §3). Each task is
fenced on its own: it is read, judged by its entity (``Task.cancel``, ``Task.retry``) and written
with the compare-and-set on the ``version`` read, so a task that changed meanwhile makes the
batch's write conflict and the store re-runs the whole function on fresh reads, where that task
is judged again (and skipped if it may no longer change). The batch forms take at most
``batch_size`` tasks per transaction: a job of 10,000 tasks is cancelled in bounded, short
transactions, never one long one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from dtq.application.ports import Queue, Store, Transaction
from dtq.application.transitions import (
    cascade_cancel,
    reopen_dependents,
    reopen_job,
    settle_jobs,
)
from dtq.domain.entities import Task, TaskRun
from dtq.domain.errors import (
    BackendUnavailable,
    DtqError,
    JobNotFound,
    NotCancellable,
    NotRetryable,
    StaleRun,
    TaskNotFound,
)
from dtq.domain.status import JobStatus, TaskStatus

#: Tasks per transaction of the batch forms.
DEFAULT_BATCH_SIZE = 500
#: Most tasks per transaction of a job's cancel: its page is read with its rows locked, and a
#: shorter page is locked before a fast drain's next commit touches it (ARCHITECTURE.md, "Why
#: the cancel's reads lock").
CANCEL_PAGE_SIZE = 100

_UNFINISHED = (TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING)
_BLOCKING = (TaskStatus.FAILED, TaskStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What a batch cancel or retry did.

    Attributes:
        changed: the ids that changed, in the order given.
        skipped: the ids left as they were: unknown, or in a status the operation does not
            apply to (already cancelled, finished, not failed, blocked by a dependency), judged
            on the state at the time of their own transaction.
        cascaded: how many other tasks changed with them (pending dependents cancelled, or
            failed/cancelled dependents reopened).
    """

    changed: tuple[UUID, ...] = ()
    skipped: tuple[UUID, ...] = ()
    cascaded: int = 0


@dataclass(frozen=True, slots=True)
class JobCancelOutcome:
    """What ``cancel_job`` did.

    Attributes:
        job_id: the job.
        status: the job's status afterwards (``cancelled``; ``failed`` stays ``failed``).
        cancelled: how many of its tasks this call cancelled (0 for a job already cancelled).
    """

    job_id: UUID
    status: JobStatus
    cancelled: int


@dataclass(slots=True)
class _Batch:
    """What one transaction of a batch did, and its Redis follow-up."""

    changed: list[UUID] = field(default_factory=list)
    skipped: list[UUID] = field(default_factory=list)
    refused: dict[UUID, DtqError] = field(default_factory=dict)
    cascaded: int = 0
    release: list[UUID] = field(default_factory=list)  # pending markers to drop
    leases: list[tuple[UUID, UUID]] = field(default_factory=list)  # (task, run) leases to drop
    enqueue: list[tuple[UUID, str]] = field(default_factory=list)  # (task, priority) to push


class ControlService:
    """Cancel and manual retry, one task, a job, or a batch of ids.

    Args:
        store: the system of record.
        queue: ready lists, markers, leases.
        batch_size: most tasks per transaction (>= 1).
    """

    def __init__(self, *, store: Store, queue: Queue, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._store = store
        self._queue = queue
        self._batch_size = batch_size
        self._cancel_page_size = min(batch_size, CANCEL_PAGE_SIZE)

    # -- cancel --------------------------------------------------------------------------------

    async def cancel_task(self, task_id: UUID) -> tuple[TaskStatus, int]:
        """Cancel one task (``POST /v1/tasks/{id}/cancel``).

        ``pending``/``queued``: ``cancelled`` at once. ``running``: ``cancelled`` with its live run
        closed ``cancelled``; after the commit the run's lease is deleted, so the worker's next
        heartbeat answers ``LeaseState.CANCELLED`` and it stops the handler. Its ``pending``
        dependents are cancelled transitively; the job's status is settled.

        Returns:
            ``(TaskStatus.CANCELLED, number of dependents the cascade cancelled)``; an already
            cancelled task is answered the same with 0 (idempotent).

        Raises:
            TaskNotFound: unknown id.
            NotCancellable: the task has ``completed`` or ``failed`` (a success that committed
                first wins).
        """
        batch = await self._cancel([task_id], cascade=True)
        if task_id in batch.refused:
            raise batch.refused[task_id]
        return TaskStatus.CANCELLED, batch.cascaded

    async def cancel_tasks(self, task_ids: Sequence[UUID]) -> BatchOutcome:
        """Cancel each task of ``task_ids`` that may be (the batch form a bulk operation calls),
        ``batch_size`` per transaction, each fenced on its own; their pending dependents are
        cancelled transitively. Unknown, finished and already cancelled ids are skipped.
        """
        ids = list(dict.fromkeys(task_ids))
        changed: list[UUID] = []
        skipped: list[UUID] = []
        cascaded = 0
        for start in range(0, len(ids), self._batch_size):
            batch = await self._cancel(ids[start : start + self._batch_size], cascade=True)
            changed += batch.changed
            skipped += batch.skipped
            cascaded += batch.cascaded
        return BatchOutcome(tuple(changed), tuple(skipped), cascaded)

    async def cancel_job(self, job_id: UUID) -> JobCancelOutcome:
        """Cancel every unfinished task of the job (``POST /v1/jobs/{id}/cancel``).

        The job's tasks are walked in submission order (keyset pages on ``(job_position,
        id)`` of ``batch_size``, at most :data:`CANCEL_PAGE_SIZE`), one transaction per page
        whose read locks the page's rows (so a fast drain's claims and completions wait for the
        cancel rather than win over it every time); no cascade is needed, since every
        task of the job is visited (a dependency never crosses jobs). The job's status is
        settled at the end: ``cancelled``, or ``failed`` if a task of it had failed.

        Returns:
            The job's status and how many tasks this call cancelled; a job already
            ``cancelled`` is answered with 0 (idempotent).

        Raises:
            JobNotFound: unknown id.
            NotCancellable: nothing of the job is unfinished and it is not ``cancelled`` (it
                ``completed`` or ``failed``), also when its last tasks finished while this call
                ran and it cancelled none.
        """

        async def probe(tx: Transaction) -> tuple[JobStatus, bool]:
            job = await tx.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"job {job_id} not found", field="id")
            return job.status, await tx.tasks.job_has_status(job_id, _UNFINISHED)

        status, unfinished = await self._store.run(probe)
        if not unfinished:
            if status is JobStatus.CANCELLED:
                return JobCancelOutcome(job_id, status, 0)
            raise NotCancellable(f"job {job_id} is {status}", field="id")
        cancelled = 0
        after: tuple[int, UUID] | None = None
        while True:
            batch, after = await self._store.run(
                functools.partial(self._cancel_page, job_id=job_id, after=after)
            )
            await self._after(batch)
            cancelled += len(batch.changed)
            if after is None:
                break

        async def settle(tx: Transaction) -> JobStatus:
            await settle_jobs(tx, [job_id], at=await tx.now())
            job = await tx.jobs.get(job_id)
            return status if job is None else job.status

        settled = await self._store.run(settle)
        if cancelled == 0 and settled in (JobStatus.COMPLETED, JobStatus.FAILED):
            # every task finished before this cancel could write one: as if it came after
            raise NotCancellable(f"job {job_id} is {settled}", field="id")
        return JobCancelOutcome(job_id, settled, cancelled)

    async def _cancel_page(
        self, tx: Transaction, *, job_id: UUID, after: tuple[int, UUID] | None
    ) -> tuple[_Batch, tuple[int, UUID] | None]:
        """Cancel the unfinished tasks of one keyset page of the job; the next page's cursor,
        or None after the last page."""
        tasks = await tx.tasks.results_page(
            job_id, after=after, limit=self._cancel_page_size, for_update=True
        )
        batch = await _cancel_tx(tx, [t for t in tasks if not t.status.terminal], cascade=False)
        last = tasks[-1] if len(tasks) == self._cancel_page_size else None
        return batch, None if last is None else (last.position, last.id)

    async def _cancel(self, ids: list[UUID], *, cascade: bool) -> _Batch:
        async def tx_fn(tx: Transaction) -> _Batch:
            locked = await tx.tasks.get_many(ids, for_update=True)
            tasks = {task.id: task for task in locked}
            batch = await _cancel_tx(tx, [tasks[i] for i in ids if i in tasks], cascade=cascade)
            for task_id in ids:
                if task_id not in tasks:
                    batch.skipped.append(task_id)
                    batch.refused[task_id] = TaskNotFound(f"task {task_id} not found", field="id")
            return batch

        batch = await self._store.run(tx_fn)
        await self._after(batch)
        return batch

    # -- retry ---------------------------------------------------------------------------------

    async def retry_task(self, task_id: UUID) -> tuple[TaskStatus, int]:
        """Retry one ``failed`` or ``cancelled`` task now (``POST /v1/tasks/{id}/retry``).

        The task goes back to ``queued`` (or ``pending`` while a dependency is unfinished) with
        a fresh attempt budget, its run history kept; its dependents that ended while waiting
        for it go back to ``pending``, transitively; its job's status is derived again (it
        leaves ``failed``/``cancelled`` unless another task of it still failed). After the
        commit the task is pushed to its ready list.

        Returns:
            The task's new status and how many dependents were reopened.

        Raises:
            TaskNotFound: unknown id.
            NotRetryable: the task is not ``failed`` or ``cancelled``, or a dependency of it is
                (retry that one first).
        """
        batch = await self._retry([task_id])
        if task_id in batch.refused:
            raise batch.refused[task_id]
        status = TaskStatus.QUEUED if batch.enqueue else TaskStatus.PENDING
        return status, batch.cascaded

    async def retry_tasks(self, task_ids: Sequence[UUID]) -> BatchOutcome:
        """Retry each ``failed`` or ``cancelled`` task of ``task_ids`` (the batch form a bulk
        operation calls), ``batch_size`` per transaction, each fenced on its own; ids in any
        other status (or blocked by a failed or cancelled dependency) are skipped. An id that
        the retry of an earlier id reopened counts as changed.
        """
        ids = list(dict.fromkeys(task_ids))
        changed: list[UUID] = []
        skipped: list[UUID] = []
        cascaded = 0
        for start in range(0, len(ids), self._batch_size):
            batch = await self._retry(ids[start : start + self._batch_size])
            changed += batch.changed
            skipped += batch.skipped
            cascaded += batch.cascaded
        return BatchOutcome(tuple(changed), tuple(skipped), cascaded)

    async def _retry(self, ids: list[UUID]) -> _Batch:
        batch = await self._store.run(lambda tx: _retry_tx(tx, ids))
        await self._after(batch)
        return batch

    # -- after the commit ----------------------------------------------------------------------

    async def _after(self, batch: _Batch) -> None:
        """The Redis side of a committed batch. A Redis failure here does not undo the commit
        and is not raised: a cancelled task's marker expires and its Redis entries are refused
        at claim; a retried task is pushed by the reconciler within one interval; a running
        task whose lease could not be deleted runs on and its report is refused (STALE)."""
        with contextlib.suppress(BackendUnavailable):
            if batch.release:
                await self._queue.release_markers(batch.release)
        with contextlib.suppress(BackendUnavailable):
            if batch.leases:
                await self._queue.delete_leases(batch.leases)
        with contextlib.suppress(BackendUnavailable):
            if batch.enqueue:
                await self._queue.enqueue_many(batch.enqueue)


async def _cancel_tx(tx: Transaction, tasks: Sequence[Task], *, cascade: bool) -> _Batch:
    """Cancel ``tasks`` (just read in ``tx``): one read of their live runs, one write of the
    tasks and one of the runs (compare-and-set, all or nothing), then the cascade and the job
    statuses. Returns a fresh batch (the function may be re-run)."""
    batch = _Batch()
    now = await tx.now()
    run_ids = [t.current_run_id for t in tasks if t.status is TaskStatus.RUNNING]
    live = [run_id for run_id in run_ids if run_id is not None]
    runs: dict[UUID, TaskRun] = (
        {run.id: run for run in await tx.runs.get_many(live)} if live else {}
    )
    changed: list[Task] = []
    ended: list[TaskRun] = []
    for task in tasks:
        run = runs.get(task.current_run_id) if task.current_run_id is not None else None
        was = task.status
        try:
            if not task.cancel(at=now, run=run):
                batch.skipped.append(task.id)  # already cancelled: nothing to do
                continue
        except (NotCancellable, StaleRun) as refused:
            batch.skipped.append(task.id)
            batch.refused[task.id] = (
                refused
                if isinstance(refused, NotCancellable)
                else NotCancellable(f"task {task.id} is {task.status}", field="id")
            )
            continue
        changed.append(task)
        batch.changed.append(task.id)
        if was is TaskStatus.QUEUED:
            batch.release.append(task.id)
        if run is not None:
            ended.append(run)
            batch.leases.append((task.id, run.id))
    if not changed:
        return batch
    await tx.tasks.save_many(changed)
    if ended:
        await tx.runs.save_many(ended)
    if cascade:
        batch.cascaded = len(await cascade_cancel(tx, changed, at=now))
    await settle_jobs(tx, (task.job_id for task in changed), at=now)
    return batch


async def _retry_tx(tx: Transaction, ids: list[UUID]) -> _Batch:
    """Retry each id in order; each retried task is saved (compare-and-set) and its cascade
    reopened before the next id is judged, so a later id sees the earlier ones' effects. An id
    reopened by another id's cascade counts as changed (also one judged before it and refused
    then, as depending on a failed task); ``cascaded`` counts the reopened tasks not among
    ``ids``, as a cancel's does."""
    batch = _Batch()
    now = await tx.now()
    tasks = {task.id: task for task in await tx.tasks.get_many(ids)}
    reopened: set[UUID] = set()
    jobs: dict[UUID, bool] = {}  # job id -> some retried task of it had started
    for task_id in ids:
        task = tasks.get(task_id)
        if task_id in reopened:
            batch.changed.append(task_id)
            continue
        if task is None:
            batch.skipped.append(task_id)
            batch.refused[task_id] = TaskNotFound(f"task {task_id} not found", field="id")
            continue
        refusal = await _retry_refusal(tx, task)
        if refusal is not None:
            batch.skipped.append(task_id)
            batch.refused[task_id] = refusal
            continue
        task.retry(at=now, dependencies_completed=await tx.tasks.dependencies_completed(task.id))
        await tx.tasks.save(task)
        batch.changed.append(task_id)
        if task.status is TaskStatus.QUEUED:
            batch.enqueue.append((task.id, task.priority))
        children = await reopen_dependents(tx, [task], at=now)
        reopened.update(child.id for child in children)
        jobs[task.job_id] = jobs.get(task.job_id, False) or task.started_at is not None
    for task_id in [i for i in batch.skipped if i in reopened]:  # refused, then reopened
        batch.skipped.remove(task_id)
        del batch.refused[task_id]
        batch.changed.append(task_id)
    batch.cascaded = len(reopened - set(ids))
    for job_id, started in jobs.items():
        await reopen_job(tx, job_id, at=now, started=started)
    return batch


async def _retry_refusal(tx: Transaction, task: Task) -> DtqError | None:
    """Why ``task`` cannot be retried now, or None."""
    if task.status not in _BLOCKING:
        return NotRetryable(f"task {task.id} is {task.status}, not failed or cancelled", field="id")
    if await tx.tasks.dependency_has_status(task.id, _BLOCKING):
        return NotRetryable(
            f"task {task.id} depends on a failed or cancelled task: retry that one first",
            field="id",
        )
    return None
