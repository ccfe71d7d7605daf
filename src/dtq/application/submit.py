"""Submitting jobs (spec §7 POST /v1/jobs and /v1/tasks; spec §4 one transaction per job)."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import deque
from dataclasses import replace
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from dtq.application.breaker import PushBreaker
from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import CarriedTask, Queue, Store, Transaction
from dtq.domain.dag import TaskNode, validate_dag
from dtq.domain.entities import Job, Task
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    DuplicateIdempotencyKey,
    IdempotencyConflict,
    ValidationError,
)
from dtq.domain.ids import job_task_ids
from dtq.domain.payload import check_metadata, check_storable
from dtq.domain.status import JobStatus, TaskStatus

logger = logging.getLogger("dtq.submit")

#: Most submissions one group transaction writes (issue 17 item 3).
GROUP_MAX_JOBS = 64
#: Most tasks one group transaction writes; a larger job is written alone.
GROUP_MAX_TASKS = 1_000
#: Group transactions in flight at once (each holds one database connection).
GROUP_LANES = 2
#: Writes of a job, after a commit whose outcome is unknown found it absent, before the caller
#: is told to submit again.
REWRITES_AFTER_UNKNOWN = 2
#: The most tasks a transaction dates by ``Transaction.write_time`` (no round trip of its own)
#: rather than ``now()``: binding a larger one's rows after the estimate takes long enough to
#: push it out of the database's tolerance (ARCHITECTURE.md, "SQL per use case").
ESTIMATED_TIME_MAX_TASKS = 100


class _Submission:
    """One job being created: its ids (chosen once, so a re-run transaction writes the same
    rows and an ambiguous commit can be checked), its transaction step, and the Redis work
    left for after the commit."""

    __slots__ = ("cmd", "due", "job_id", "later", "made", "result", "task_ids")

    def __init__(self, cmd: SubmitJob) -> None:
        self.cmd = cmd
        self.job_id = uuid4()
        ids = job_task_ids(len(cmd.tasks))  # one job's tasks adjacent in the key (domain/ids.py)
        self.task_ids = {spec.name: task_id for spec, task_id in zip(cmd.tasks, ids, strict=True)}
        #: due time of each root, as the latest transaction attempt computed it
        self.due: dict[UUID, datetime] = {}
        self.later: set[UUID] = set()
        #: the job and tasks as the latest transaction attempt created them
        self.made: tuple[Job, list[Task]] | None = None
        self.result: SubmitResult | BaseException | None = None

    async def create(self, tx: Transaction) -> SubmitResult:
        """Write the job, its tasks and edges (or answer a replayed Idempotency-Key).

        Raises:
            IdempotencyConflict: the key was used with another request.
            DuplicateIdempotencyKey: a concurrent transaction took the key first.
        """
        existing = await self.replayed(tx)
        if existing is not None:
            return existing
        await tx.jobs.add(*self.rows(await _write_time(tx, len(self.cmd.tasks))))
        return self.created()

    async def replayed(self, tx: Transaction) -> SubmitResult | None:
        """The original answer when the submission's Idempotency-Key was used before.

        Raises:
            IdempotencyConflict: the key was used with another request.
        """
        if self.cmd.idempotency_key is None:
            return None
        return await _replay(tx, self.cmd)

    def rows(self, now: datetime) -> tuple[Job, list[Task], list[tuple[UUID, UUID]]]:
        """The job, its tasks and its edges as created at ``now`` (the transaction's time);
        records each root's due time for after the commit."""
        cmd = self.cmd
        job = Job(
            id=self.job_id,
            name=cmd.name,
            status=JobStatus.PENDING,
            created_at=now,
            updated_at=now,
            metadata=cmd.metadata,
            idempotency_key=cmd.idempotency_key,
            request_hash=cmd.request_hash,
            trace_context=cmd.trace_context,
            has_dependencies=any(spec.depends_on for spec in cmd.tasks),
            task_count=len(cmd.tasks),
        )
        ids = self.task_ids
        tasks = [
            _new_task(spec, self.job_id, ids[spec.name], now, position=i)
            for i, spec in enumerate(cmd.tasks)
        ]
        edges = [
            (ids[spec.name], ids[dep])
            for spec in cmd.tasks
            for dep in dict.fromkeys(spec.depends_on)
        ]
        self.made = (job, tasks)
        self.due.clear()
        self.later.clear()
        for task in tasks:
            self.due[task.id] = task.scheduled_at
            if task.scheduled_at > now:
                self.later.add(task.id)
        return job, tasks, edges

    def created(self) -> SubmitResult:
        """The answer for a job this submission wrote."""
        return SubmitResult(job_id=self.job_id, task_ids=dict(self.task_ids), created=True)

    def roots(self) -> list[tuple[UUID, str]]:
        """``(task_id, priority)`` of the job's tasks without dependencies."""
        return [(self.task_ids[s.name], s.priority) for s in self.cmd.tasks if not s.depends_on]

    def carried(self) -> list[CarriedTask]:
        """The snapshot of a one-task job's task, due now, to ride with its id (an idle
        worker claims it without reading it, ``Queue.enqueue_many``); none for a larger job
        (its first claim changes the job the others would carry)."""
        if self.made is None:
            return []
        job, tasks = self.made
        if len(tasks) != 1 or tasks[0].id in self.later:
            return []
        task = copy.copy(tasks[0])  # a fresh task: cheaper than dataclasses.replace
        task.payload, task.transitions = None, ()
        if job.transitions:
            job = replace(job, transitions=())
        return [CarriedTask(task=task, job=job)]


class SubmitService:
    """Creates jobs with their tasks and dependency edges, then pushes the runnable ones.

    Concurrent submissions share transactions (group commit, issue 17 item 3): a submission
    that arrives while the service's ``lanes`` group transactions are all in flight waits for
    the next one, which writes up to ``group_max_jobs`` waiting submissions (and at most
    ``group_max_tasks`` tasks) and is acknowledged at its commit, before the roots' push; each
    keeps its own ids, idempotency and errors. An idle service writes a submission at once,
    alone, and answers it after the push.

    Args:
        store: the system of record.
        queue: the fast path; written only after the job's transaction committed.
        group_max_jobs: most submissions per transaction (1 turns grouping off).
        group_max_tasks: most tasks per group transaction; a larger job is written alone.
        lanes: group transactions in flight at once.
        pushes: the breaker the post-commit pushes go through (one per process); a new one
            when None.
    """

    def __init__(
        self,
        *,
        store: Store,
        queue: Queue,
        group_max_jobs: int = GROUP_MAX_JOBS,
        group_max_tasks: int = GROUP_MAX_TASKS,
        lanes: int = GROUP_LANES,
        pushes: PushBreaker | None = None,
    ) -> None:
        self._store = store
        self._queue = queue
        self._group_max_jobs = group_max_jobs
        self._group_max_tasks = group_max_tasks
        self._lanes = max(1, lanes)
        self._waiting: deque[tuple[_Submission, asyncio.Future[SubmitResult]]] = deque()
        self._running = 0
        self._lane_tasks: set[asyncio.Task[None]] = set()
        self._pushes = PushBreaker() if pushes is None else pushes

    async def submit_job(self, cmd: SubmitJob) -> SubmitResult:
        """Validate and create a job in one transaction; enqueue its root tasks after commit.

        Tasks without dependencies start ``queued``, due now or at their ``run_at``/``delay``
        (a root due later goes onto the scheduled set after the commit, not a ready list);
        the others start ``pending`` and are promoted when their dependencies complete (and
        then wait for their own due time, if later). If Redis fails after the commit, the
        job is still created (and the call succeeds): the reconciler pushes its due tasks. With
        an idempotency key, a replay of the same request returns the original ids
        (``created=False``) and writes nothing, also when two such requests race. The job may
        share its transaction with concurrent submissions, and is then returned at the commit,
        while its roots are being pushed (see the class docstring).

        Args:
            cmd: the job to create.

        Returns:
            The job id and a name -> task id map.

        Raises:
            ValidationError: no tasks, bad ``max_attempts``, a payload the database cannot
                store (``InvalidPayload``) or such metadata (``InvalidMetadata``); DAG errors
                (``DagError`` subclasses) name the tasks.
            IdempotencyConflict: the key was used before with a different request.
            BackendUnavailable: the database failed.
        """
        _validate(cmd)
        submission = _Submission(cmd)
        if self._group_max_jobs <= 1 or len(cmd.tasks) > self._group_max_tasks:
            return await self._alone(submission)
        future: asyncio.Future[SubmitResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((submission, future))
        if self._running < self._lanes:
            self._running += 1
            lane = asyncio.create_task(self._lane())
            self._lane_tasks.add(lane)
            lane.add_done_callback(self._lane_tasks.discard)
        return await future

    async def _lane(self) -> None:
        """Write waiting submissions, a group per transaction, until none is left."""
        try:
            while self._waiting:
                group: list[tuple[_Submission, asyncio.Future[SubmitResult]]] = []
                tasks = 0
                while self._waiting and len(group) < self._group_max_jobs:
                    size = len(self._waiting[0][0].cmd.tasks)
                    if group and tasks + size > self._group_max_tasks:
                        break
                    group.append(self._waiting.popleft())
                    tasks += size
                await self._write_group(group)
        finally:
            self._running -= 1

    async def _write_group(
        self, group: list[tuple[_Submission, asyncio.Future[SubmitResult]]]
    ) -> None:
        """One transaction for the group, then each submission's answer, then the push of the
        committed roots; a group that fails for one submission's sake (a lost idempotency
        race, an unexpected error) is written again one submission per transaction, so every
        submission gets its own outcome (each pushed before it is answered)."""
        submissions = [s for s, _ in group]
        committed: list[_Submission] = []
        try:
            if len(submissions) == 1:
                await self._alone(submissions[0], settle=True)
            else:
                committed = await self._together(submissions)
        finally:  # every caller gets an answer, whatever escaped
            for submission, future in group:
                if future.done():  # the caller was cancelled; the job is written all the same
                    continue
                outcome = submission.result
                if isinstance(outcome, SubmitResult):
                    future.set_result(outcome)
                else:
                    future.set_exception(outcome or RuntimeError("submission not written"))
        await self._after_commit(committed)

    async def _together(self, submissions: list[_Submission]) -> list[_Submission]:
        async def create_all(tx: Transaction) -> list[SubmitResult | IdempotencyConflict]:
            """Replays answered by reads; every new job written by one ``add_many``."""
            out: list[SubmitResult | IdempotencyConflict] = []
            fresh = []
            for submission in submissions:
                try:
                    existing = await submission.replayed(tx)
                except IdempotencyConflict as exc:  # a read-side refusal: the rest go on
                    out.append(exc)
                    continue
                if existing is not None:
                    out.append(existing)
                else:
                    fresh.append(submission)
                    out.append(submission.created())
            # after the replays' reads, which bring the clock
            now = await _write_time(tx, sum(len(s.cmd.tasks) for s in fresh))
            await tx.jobs.add_many([submission.rows(now) for submission in fresh])
            return out

        try:
            outcomes = await self._store.run(create_all)
        except CommitOutcomeUnknown:  # all or none committed: each checks for its own job
            for submission in submissions:
                await self._alone(submission, settle=True, recovering=True)
            return []
        except BackendUnavailable as exc:
            for submission in submissions:
                submission.result = exc
            return []
        except Exception:  # e.g. a lost idempotency race: nothing committed; one by one
            for submission in submissions:
                await self._alone(submission, settle=True)
            return []
        for submission, outcome in zip(submissions, outcomes, strict=True):
            submission.result = outcome
        return [s for s in submissions if _created(s)]

    async def _alone(
        self, submission: _Submission, *, settle: bool = False, recovering: bool = False
    ) -> SubmitResult:
        """Write one submission in its own transaction (the path before group commit).

        With ``settle`` its outcome (result or error) is stored on it instead of raised."""
        try:
            if recovering:
                result = await self._after_unknown(submission)
            else:
                result = await self._create_alone(submission)
        except Exception as exc:
            if not settle:
                raise
            submission.result = exc
            return SubmitResult(job_id=submission.job_id, task_ids={}, created=False)
        submission.result = result
        await self._after_commit([submission] if result.created else [])
        return result

    async def _create_alone(self, submission: _Submission) -> SubmitResult:
        cmd = submission.cmd
        try:
            return await self._store.run(submission.create)
        except DuplicateIdempotencyKey:
            return await self._store.run(lambda tx: _replay_required(tx, cmd))
        except CommitOutcomeUnknown:
            return await self._after_unknown(submission)

    async def _after_unknown(self, submission: _Submission) -> SubmitResult:
        """The outcome of a submission whose commit's outcome is unknown (the connection was
        lost with the COMMIT in flight, e.g. a pooled connection the database had closed).

        The job is read back by its id; if it is absent, the submission is written again with
        the same ids, up to ``REWRITES_AFTER_UNKNOWN`` times. That cannot make two jobs: had
        the first commit landed after the read, the rewrite's insert fails on the job's primary
        key (or, with an Idempotency-Key, replays it) and the next read finds it.

        Raises:
            CommitOutcomeUnknown: the job was still absent after the rewrites (submit again).
            BackendUnavailable: the database failed while reading back.
        """
        for _ in range(REWRITES_AFTER_UNKNOWN):
            found = await self._store.run(
                lambda tx: _recover(tx, submission.job_id, submission.task_ids)
            )
            if found is not None:
                return found
            try:
                result = await self._store.run(submission.create)
            except (CommitOutcomeUnknown, BackendUnavailable, DuplicateIdempotencyKey):
                continue  # read back again
            if result.job_id == submission.job_id:  # a keyed rewrite may replay our own job
                return submission.created()
            return result
        raise CommitOutcomeUnknown("the job was not stored; submit it again")

    async def _after_commit(self, created: list[_Submission]) -> None:
        """Push the committed jobs' due roots (one round trip) and schedule the later ones.

        The jobs are committed: if Redis fails now, the reconciler pushes their due tasks
        once Redis is back; failing the requests would invite clients to submit again (an
        error that is not an outage is logged, and the jobs are committed all the same). For
        the same reason, for a while after a push failed the pushes are not sent at all (the
        breaker raises ``PushSkipped``, suppressed here): a hung Redis would make each wait
        the client's reply timeout; and the push that tries again is cut short by the breaker
        (``PushTimedOut``, suppressed too)."""
        if not created:
            return
        now_items = [r for s in created for r in s.roots() if r[0] not in s.later]
        carried = created[0].carried() if len(created) == 1 else []  # a lone submit's
        try:
            async with self._pushes.attempt(len(created)):
                await self._queue.enqueue_many(now_items, carried=carried)
                for s in created:
                    for task_id, priority in s.roots():
                        if task_id in s.later:  # due later: the promoter pushes it on time
                            await self._queue.schedule(task_id, priority, s.due[task_id])
        except BackendUnavailable:
            pass
        except Exception:  # not an outage (a bug, a client misconfigured): committed all the same
            logger.exception(
                "pushing %d committed job(s) failed; the reconciler pushes their tasks",
                len(created),
            )


def _created(submission: _Submission) -> bool:
    return isinstance(submission.result, SubmitResult) and submission.result.created


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
    check_metadata(cmd.metadata)
    if len(cmd.tasks) > 1 or cmd.tasks[0].depends_on:  # else one task, no edge: nothing to check
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


async def _write_time(tx: Transaction, tasks: int) -> datetime:
    """The time a transaction creating ``tasks`` tasks dates its rows by."""
    return await (tx.write_time() if tasks <= ESTIMATED_TIME_MAX_TASKS else tx.now())


async def _recover(tx: Transaction, job_id: UUID, task_ids: dict[str, UUID]) -> SubmitResult | None:
    """After an ambiguous commit: the job exists exactly when the commit went through (None
    while it does not)."""
    if await tx.jobs.get(job_id) is None:
        return None
    return SubmitResult(job_id=job_id, task_ids=dict(task_ids), created=True)
