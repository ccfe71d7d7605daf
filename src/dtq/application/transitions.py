"""Follow-up work inside a transaction after a task changes state (DESIGN §2).

These run inside ``Store.run`` functions. Costs grow with a task's direct neighbourhood (its
dependents, their dependencies) and never with the size of the job: job status is settled with
index probes, and the job row is written only when its status changes (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from uuid import UUID

from dtq.application.ports import Transaction
from dtq.domain.entities import Job, Task
from dtq.domain.errors import ConcurrentUpdate
from dtq.domain.policy import derive_job_status
from dtq.domain.status import JobStatus, TaskStatus

_UNFINISHED = (TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING)
#: A dependency in one of these never completes (until it is retried itself).
_BLOCKING = (TaskStatus.FAILED, TaskStatus.CANCELLED)


async def promote_dependents(
    tx: Transaction, completed: Sequence[Task], *, at: datetime
) -> list[Task]:
    """Queue every ``pending`` dependent of ``completed`` whose dependencies all completed.

    One statement lists the edges out of every completed task and one loads the dependents;
    each candidate then costs one index probe of its own dependencies.

    Args:
        tx: the open transaction.
        completed: tasks that have just become ``completed`` (already saved in ``tx``).
        at: transaction time.

    Returns:
        The promoted tasks (now ``queued``, due ``at``); the caller enqueues them after commit.
    """
    if not completed:
        return []
    edges = await tx.tasks.dependents_many([task.id for task in completed])
    if not edges:
        return []
    children = await tx.tasks.get_many(list(dict.fromkeys(child for _, child in edges)))
    promoted: list[Task] = []
    for child in children:
        if child.status is TaskStatus.PENDING and await tx.tasks.dependencies_completed(child.id):
            child.promote(at=at)
            promoted.append(child)
    if promoted:
        await tx.tasks.save_many(promoted)
    return promoted


async def cascade_failure(tx: Transaction, task: Task, *, at: datetime) -> list[Task]:
    """Fail every ``pending`` task downstream of ``task``, transitively (breadth first).

    Args:
        tx: the open transaction.
        task: a task that has just become ``failed``.
        at: transaction time.

    Returns:
        The tasks failed by the cascade.
    """
    failed: list[Task] = []
    frontier: list[Task] = [task]
    while frontier:
        next_frontier: list[Task] = []
        for parent in frontier:
            dependent_ids = await tx.tasks.dependents(parent.id)
            if not dependent_ids:
                continue
            for child in await tx.tasks.get_many(dependent_ids):
                if child.status is TaskStatus.PENDING:
                    child.cascade_fail(failed_dependency=parent.name, at=at)
                    await tx.tasks.save(child)
                    failed.append(child)
                    next_frontier.append(child)
        frontier = next_frontier
    return failed


async def cascade_cancel(tx: Transaction, tasks: Sequence[Task], *, at: datetime) -> list[Task]:
    """Cancel every ``pending`` task downstream of ``tasks``, transitively, like
    :func:`cascade_failure` fails them (issue 14 item 1: never left waiting), but one level of
    the graph at a time: per level one ``dependents_many``, one ``get_many`` and one
    ``save_many``, so a batch of cancels costs statements per depth, not per task.

    Args:
        tx: the open transaction.
        tasks: tasks that have just become ``cancelled`` (already saved in ``tx``).
        at: transaction time.

    Returns:
        The tasks cancelled by the cascade (saved).
    """
    cancelled: list[Task] = []
    frontier = list(tasks)
    while frontier:
        names = {task.id: task.name for task in frontier}
        edges = await tx.tasks.dependents_many(list(names))
        if not edges:
            break
        parent_of: dict[UUID, UUID] = {}
        for parent_id, child_id in edges:
            parent_of.setdefault(child_id, parent_id)
        frontier = []
        for child in await tx.tasks.get_many(list(parent_of)):
            if child.status is TaskStatus.PENDING:
                child.cascade_cancel(cancelled_dependency=names[parent_of[child.id]], at=at)
                frontier.append(child)
        if frontier:
            await tx.tasks.save_many(frontier)
            cancelled.extend(frontier)
    return cancelled


async def reopen_dependents(tx: Transaction, tasks: Sequence[Task], *, at: datetime) -> list[Task]:
    """Reopen the dependents of manually retried ``tasks`` that ended while they waited for
    them (failed or cancelled by the cascade, never started), transitively: each goes back to
    ``pending`` with a fresh attempt budget (issue 14 item 4). A dependent that another
    ``failed`` or ``cancelled`` dependency still blocks is left as it is (reopened, it would
    wait forever); the retry of that dependency reopens it.

    Args:
        tx: the open transaction.
        tasks: tasks that have just been retried (now ``queued`` or ``pending``, saved).
        at: transaction time.

    Returns:
        The reopened dependents (saved, ``pending``).
    """
    reopened: list[Task] = []
    frontier = list(tasks)
    while frontier:
        next_frontier: list[Task] = []
        for parent in frontier:
            dependent_ids = await tx.tasks.dependents(parent.id)
            if not dependent_ids:
                continue
            for child in await tx.tasks.get_many(dependent_ids):
                if not child.ended_while_pending or await tx.tasks.dependency_has_status(
                    child.id, _BLOCKING
                ):
                    continue
                child.retry(at=at, dependencies_completed=False)
                await tx.tasks.save(child)
                reopened.append(child)
                next_frontier.append(child)
        frontier = next_frontier
    return reopened


async def reopen_job(tx: Transaction, job_id: UUID, *, at: datetime, started: bool) -> None:
    """Re-derive the job's status after a manual retry made some of its tasks unfinished
    (issue 14 item 4): it leaves ``failed`` or ``cancelled`` unless another task of it is still
    ``failed`` (one index probe); the row is written only when the status changes.

    Whether the job is ``running`` or ``pending`` again follows from ``started``, its status
    (``running``, ``failed`` and ``completed`` jobs had started), or for a ``cancelled`` one a
    task of it that completed (one more index probe).

    Args:
        started: some retried task of the job had started before.
    """
    job = await tx.jobs.get(job_id)
    if job is None:
        return
    started = (
        started
        or job.status in (JobStatus.RUNNING, JobStatus.FAILED, JobStatus.COMPLETED)
        or await tx.tasks.job_has_status(job_id, (TaskStatus.COMPLETED, TaskStatus.RUNNING))
    )
    status = derive_job_status(
        any_failed=await tx.tasks.job_has_status(job_id, (TaskStatus.FAILED,)),
        any_unfinished=True,
        any_cancelled=False,
        any_started=started,
    )
    if job.reopen(status, at=at):
        await tx.jobs.save(job)


async def mark_jobs_started(tx: Transaction, jobs: Iterable[Job], *, at: datetime) -> list[Job]:
    """Move the ``pending`` jobs among ``jobs`` (read in this transaction, e.g. with their
    tasks by ``TaskRepository.get_many_with_jobs``) to ``running``: a task of each was claimed.

    The job rows are written only when a status changes, in one statement.

    Returns:
        ``jobs`` (each once), as written.
    """
    read = list({job.id: job for job in jobs}.values())
    started = [
        job
        for job in read
        if job.status is JobStatus.PENDING and job.set_status(JobStatus.RUNNING, at=at)
    ]
    if started:
        await tx.jobs.save_many(started)
    return read


async def mark_job_failed(tx: Transaction, job_id: UUID, *, at: datetime) -> None:
    """Move the job to ``failed`` (a task of it failed permanently); no-op if already failed."""
    job = await tx.jobs.get(job_id)
    if job is not None and job.set_status(JobStatus.FAILED, at=at):
        await tx.jobs.save(job)


async def settle_jobs(
    tx: Transaction,
    job_ids: Iterable[UUID],
    *,
    at: datetime,
    completed_alone: Sequence[Job] = (),
) -> None:
    """Re-derive the status of each job in ``job_ids`` after tasks of it finished (spec §4
    RefreshJobStatus).

    For callers where a task of each job has started (its claim moved the job out of
    ``pending`` in an earlier, committed transaction). One statement
    (``JobRepository.get_finished``) probes the indexes for anything left in every job; a job
    with work left is ``running`` and already says so (or is terminal, which never changes),
    so its row is not read. The jobs that have nothing unfinished come back with whether some
    task failed or was cancelled, and the rows whose status changes are written by one
    statement (DESIGN §3). A batch's jobs cost two statements at most, however many.

    ``completed_alone`` are jobs among ``job_ids`` whose only task just completed, each as the
    transaction that claimed that task left it (a copy the caller owns): they are settled from
    that copy, with no read. Their write compares the version they carry, and a lone one is
    first confirmed whole in the same request (``JobRepository.confirm``): a job changed since
    the claim raises ``ConcurrentUpdate`` from that request (or at once, in memory, where such
    a job is read instead); one that cannot be checked without a read is read.
    """
    ids = list(dict.fromkeys(job_ids))
    alone = {job.id: job for job in completed_alone}
    if len(alone) == 1:
        (only,) = alone.values()
        try:
            tx.jobs.confirm(only)
        except ConcurrentUpdate:
            alone = {}
    read = [job_id for job_id in ids if job_id not in alone]
    found = await tx.jobs.get_finished(read, _UNFINISHED) if read else []
    changed = []
    for job, any_failed, any_cancelled in [*((j, False, False) for j in alone.values()), *found]:
        if job.status.terminal:
            continue
        status = derive_job_status(
            any_failed=any_failed,
            any_unfinished=False,
            any_cancelled=any_cancelled and not any_failed,
            any_started=True,
        )
        if job.set_status(status, at=at):
            changed.append(job)
    if changed:
        order = {job_id: i for i, job_id in enumerate(ids)}  # events in the callers' order
        await tx.jobs.save_many(sorted(changed, key=lambda job: order[job.id]))
