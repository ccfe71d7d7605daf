"""Submitting jobs (spec §7 POST /v1/jobs and /v1/tasks; spec §4 one transaction per job)."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import Queue, Store, Transaction
from dtq.domain.dag import TaskNode, validate_dag
from dtq.domain.entities import Job, Task
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    DuplicateIdempotencyKey,
    IdempotencyConflict,
    ValidationError,
)
from dtq.domain.payload import check_storable
from dtq.domain.status import JobStatus, TaskStatus


class SubmitService:
    """Creates jobs with their tasks and dependency edges, then pushes the runnable ones.

    Args:
        store: the system of record.
        queue: the fast path; written only after the job's transaction committed.
    """

    def __init__(self, *, store: Store, queue: Queue) -> None:
        self._store = store
        self._queue = queue

    async def submit_job(self, cmd: SubmitJob) -> SubmitResult:
        """Validate and create a job in one transaction; enqueue its root tasks after commit.

        Tasks without dependencies start ``queued``, due now or at their ``run_at``/``delay``
        (a root due later goes onto the scheduled set after the commit, not a ready list);
        the others start ``pending`` and are promoted when their dependencies complete (and
        then wait for their own due time, if later). If Redis fails after the commit, the
        job is still created (and the call succeeds): the reconciler pushes its due tasks. With
        an idempotency key, a replay of the same request returns the original ids
        (``created=False``) and writes nothing, also when two such requests race.

        Args:
            cmd: the job to create.

        Returns:
            The job id and a name -> task id map.

        Raises:
            ValidationError: no tasks, bad ``max_attempts``, or a payload the database cannot
                store (``InvalidPayload``); DAG errors (``DagError`` subclasses) name the tasks.
            IdempotencyConflict: the key was used before with a different request.
            BackendUnavailable: the database failed.
        """
        _validate(cmd)
        job_id = uuid4()
        task_ids = {spec.name: uuid4() for spec in cmd.tasks}
        #: due time of each root, as the latest transaction attempt computed it
        due: dict[UUID, datetime] = {}
        later: set[UUID] = set()

        async def create(tx: Transaction) -> SubmitResult:
            if cmd.idempotency_key is not None:
                existing = await _replay(tx, cmd)
                if existing is not None:
                    return existing
            now = await tx.now()
            job = Job(
                id=job_id,
                name=cmd.name,
                status=JobStatus.PENDING,
                created_at=now,
                updated_at=now,
                metadata=cmd.metadata,
                idempotency_key=cmd.idempotency_key,
                request_hash=cmd.request_hash,
                trace_context=cmd.trace_context,
            )
            tasks = [
                _new_task(spec, job_id, task_ids[spec.name], now, position=i)
                for i, spec in enumerate(cmd.tasks)
            ]
            edges = [
                (task_ids[spec.name], task_ids[dep])
                for spec in cmd.tasks
                for dep in dict.fromkeys(spec.depends_on)
            ]
            await tx.jobs.add(job, tasks, edges)
            due.clear()
            later.clear()
            for task in tasks:
                due[task.id] = task.scheduled_at
                if task.scheduled_at > now:
                    later.add(task.id)
            return SubmitResult(job_id=job_id, task_ids=dict(task_ids), created=True)

        try:
            result = await self._store.run(create)
        except DuplicateIdempotencyKey:
            result = await self._store.run(lambda tx: _replay_required(tx, cmd))
        except CommitOutcomeUnknown:
            result = await self._store.run(lambda tx: _recover(tx, job_id, task_ids))
        if result.created:
            roots = [(task_ids[s.name], s.priority) for s in cmd.tasks if not s.depends_on]
            # The job is committed: if Redis fails now, the reconciler pushes its due tasks once
            # Redis is back. Failing the request would invite a client to submit it again.
            with contextlib.suppress(BackendUnavailable):
                await self._queue.enqueue_many([r for r in roots if r[0] not in later])
                for task_id, priority in roots:
                    if task_id in later:  # due later: the promoter pushes it on time
                        await self._queue.schedule(task_id, priority, due[task_id])
        return result


def _validate(cmd: SubmitJob) -> None:
    if not cmd.tasks:
        raise ValidationError("a job needs at least one task", field="tasks")
    for i, spec in enumerate(cmd.tasks):
        if spec.max_attempts < 1:
            raise ValidationError(
                "max_attempts must be at least 1", field=f"tasks[{i}].max_attempts"
            )
        if spec.run_at is not None and spec.delay is not None:
            raise ValidationError("give run_at or delay, not both", field=f"tasks[{i}].delay")
        if spec.run_at is not None and spec.run_at.utcoffset() is None:
            raise ValidationError("run_at must be an aware time", field=f"tasks[{i}].run_at")
        if spec.delay is not None and spec.delay < timedelta(0):
            raise ValidationError("delay must not be negative", field=f"tasks[{i}].delay")
        if not spec.kind:
            raise ValidationError("kind must not be empty", field=f"tasks[{i}].kind")
        check_storable(spec.payload, field=f"tasks[{i}].payload")
    check_storable(cmd.metadata, field="metadata")
    validate_dag([TaskNode(spec.name, tuple(spec.depends_on)) for spec in cmd.tasks])


def _due(spec: TaskSpec, now: datetime) -> datetime:
    """The task's due time (issue 14 item 2): ``run_at`` (a past one is now), ``now + delay``,
    or now."""
    if spec.run_at is not None:
        return max(spec.run_at, now)
    if spec.delay is not None:
        return now + spec.delay
    return now


def _new_task(spec: TaskSpec, job_id: UUID, task_id: UUID, now: datetime, *, position: int) -> Task:
    return Task(
        id=task_id,
        job_id=job_id,
        name=spec.name,
        kind=spec.kind,
        payload=spec.payload,
        status=TaskStatus.PENDING if spec.depends_on else TaskStatus.QUEUED,
        scheduled_at=_due(spec, now),
        created_at=now,
        updated_at=now,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        position=position,
        retry_policy=spec.retry_policy,
        timeout=spec.timeout,
    )


async def _replay(tx: Transaction, cmd: SubmitJob) -> SubmitResult | None:
    """The original answer to the key: from the live job holding it, else from the tombstone
    its pruned job left (issue 14 item 8); None when the key is unused (or its tombstone
    expired). Read in the submit's own transaction, so a concurrent prune is either before it
    (the tombstone answers) or after it (the job answers), never neither."""
    key = cmd.idempotency_key
    assert key is not None
    job = await tx.jobs.get_by_idempotency_key(key)
    if job is not None:
        _check_same_request(key, job.request_hash, cmd)
        tasks = await tx.tasks.list_by_job(job.id)
        return SubmitResult(job_id=job.id, task_ids={t.name: t.id for t in tasks}, created=False)
    tombstone = await tx.retention.get_tombstone(key)
    if tombstone is None:
        return None
    _check_same_request(key, tombstone.request_hash, cmd)
    return SubmitResult(job_id=tombstone.job_id, task_ids=dict(tombstone.task_ids), created=False)


def _check_same_request(key: str, request_hash: str | None, cmd: SubmitJob) -> None:
    if request_hash != cmd.request_hash:
        raise IdempotencyConflict(
            f"Idempotency-Key {key!r} was already used with a different request",
            field="Idempotency-Key",
        )


async def _replay_required(tx: Transaction, cmd: SubmitJob) -> SubmitResult:
    result = await _replay(tx, cmd)
    if result is None:  # the racing job vanished again (deleted): report the race plainly
        raise IdempotencyConflict("a concurrent request with this Idempotency-Key did not persist")
    return result


async def _recover(tx: Transaction, job_id: UUID, task_ids: dict[str, UUID]) -> SubmitResult:
    """After an ambiguous commit: the job exists exactly when the commit went through."""
    if await tx.jobs.get(job_id) is None:
        raise CommitOutcomeUnknown("the job was not stored; submit it again")
    return SubmitResult(job_id=job_id, task_ids=dict(task_ids), created=True)
