"""Entities of the task orchestrator: Job, Task, TaskRun, Worker (spec §4, DESIGN §2).

Entities are plain slotted dataclasses that guard their own invariants. Methods take the time
as ``at=`` (an aware UTC datetime from the database clock) and never read a clock themselves.
``version`` is the optimistic-concurrency counter: repositories write an entity only if the row
still has the version that was read, and bump it; domain methods never touch it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any
from uuid import UUID

from dtq.domain.errors import (
    InvalidTransition,
    NotCancellable,
    NotRetryable,
    StaleRun,
    TaskNotClaimable,
)
from dtq.domain.events import Transition
from dtq.domain.policy import RetryDecision, RetryPolicy, decide_retry
from dtq.domain.status import RUN_TRANSITIONS, TASK_TRANSITIONS, JobStatus, RunStatus, TaskStatus

#: Priority tier used when a task does not name one (spec §5: ``queue:ready:default``).
DEFAULT_PRIORITY = "default"

#: ``task_runs.error`` of a run closed because its task was cancelled while it ran.
CANCELLED_ERROR = "task cancelled"

#: ``last_error`` prefix written when the crash budget (DESIGN §3) is exhausted.
WORKER_LOST = "worker lost"


@dataclass(slots=True)
class TaskRun:
    """One delivery of a task to a worker (a ``task_runs`` row).

    ``attempt_number`` is NOT unique per task: a reclaimed run (``dead``) and its successor share
    it (spec §4 attempt invariant). The run key is ``id``; history is ordered by ``started_at``.
    """

    id: UUID
    task_id: UUID
    attempt_number: int
    worker_id: str
    status: RunStatus
    started_at: datetime
    error: str | None = None
    finished_at: datetime | None = None

    def __copy__(self) -> TaskRun:
        """A shallow copy, as ``copy.copy`` makes it, through ``__init__`` (the default goes
        through ``__reduce_ex__``, about ten times slower; a claim's copy is on the hot path)."""
        return type(self)(*_run_fields(self))

    def _end(self, status: RunStatus, *, at: datetime, error: str | None = None) -> None:
        if status not in RUN_TRANSITIONS[self.status]:
            raise InvalidTransition(f"run {self.id} cannot go from {self.status} to {status}")
        self.status = status
        self.finished_at = at
        if error is not None:
            self.error = error


@dataclass(slots=True)
class Task:
    """A unit of work bound to a handler ``kind`` with a JSON ``payload`` (a ``tasks`` row).

    Attributes:
        attempt: how much of ``max_attempts`` has been consumed (a budget counter, not a run
            key); reclaim rolls it back by one.
        reclaims: how many times a lost worker cost this task its run; capped by the crash
            budget (DESIGN §3).
        current_run_id: the live run while ``running``; every write ending a run is fenced on it.
        scheduled_at: the task is not claimable before this instant.
        result: the handler's return value (any JSON value), set by the success that completed
            the task; None until then, and when the handler returned None.
        position: the task's 0-based index in its job's submission (the order results are
            listed in).
        progress: the latest JSON value a handler reported with ``task.progress()`` (issue 13
            item 5), written fenced to the live run; None until one is reported. It survives
            the run: the next attempt (after a reclaim, a hand-back or a retried failure) reads
            it as ``task.checkpoint``.
        retry_policy: the task's own backoff (issue 14 item 3), or None for the deployment's
            fixed ``RETRY_BACKOFF``; set at submit, never changed.
        timeout: the handler's time limit for this task (wins over the kind's), or None.
    """

    id: UUID
    job_id: UUID
    name: str
    kind: str
    payload: Any
    status: TaskStatus
    scheduled_at: datetime
    created_at: datetime
    updated_at: datetime
    priority: str = DEFAULT_PRIORITY
    max_attempts: int = 3
    attempt: int = 0
    reclaims: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    current_run_id: UUID | None = None
    version: int = 0
    result: Any = None
    position: int = 0
    progress: Any = None
    retry_policy: RetryPolicy | None = None
    timeout: timedelta | None = None
    # status moves not yet written to the outbox (issue 16 item 1); drained by the repository
    # that saves the task, never stored as a column
    transitions: tuple[Transition, ...] = field(default=(), compare=False, repr=False)

    def __copy__(self) -> Task:
        """A shallow copy, as ``copy.copy`` makes it, through ``__init__`` (see
        ``TaskRun.__copy__``)."""
        return type(self)(*_task_fields(self))

    # -- guard -----------------------------------------------------------------------------

    def _move(self, target: TaskStatus, *, at: datetime, cause: str) -> None:
        if target not in TASK_TRANSITIONS[self.status]:
            raise InvalidTransition(f"task {self.id} cannot go from {self.status} to {target}")
        self.transitions = (*self.transitions, Transition(str(self.status), str(target), cause))
        self.status = target
        self.updated_at = at

    def _live_run(self, run: TaskRun) -> None:
        """Raise StaleRun unless ``run`` is this task's live run and still running."""
        if (
            self.status is not TaskStatus.RUNNING
            or self.current_run_id != run.id
            or run.status is not RunStatus.RUNNING
        ):
            raise StaleRun(f"run {run.id} is no longer the live run of task {self.id}")

    # -- progress ----------------------------------------------------------------------------

    def record_progress(self, run_id: UUID, value: Any) -> bool:
        """Store ``value`` as the progress of run ``run_id`` (DESIGN §7: fenced like an outcome).

        Args:
            run_id: the reporting run; must be the task's live run.
            value: the handler's latest progress (checked with ``payload.check_progress``).

        Returns:
            True when the stored value changed, False when it already was ``value``.

        Raises:
            StaleRun: the task is not ``running`` under ``run_id`` (reclaimed, or ended).
        """
        if self.status is not TaskStatus.RUNNING or self.current_run_id != run_id:
            raise StaleRun(f"run {run_id} is no longer the live run of task {self.id}")
        if self.progress == value:
            return False
        self.progress = value
        return True

    # -- transitions -------------------------------------------------------------------------

    def is_due(self, at: datetime) -> bool:
        """True when ``scheduled_at <= at``."""
        return self.scheduled_at <= at

    def claim(self, *, run_id: UUID, worker_id: str, at: datetime) -> TaskRun:
        """Start a new run: ``queued -> running``, ``attempt += 1`` (spec §5 ClaimQueuedTask).

        Args:
            run_id: id of the new ``task_runs`` row (client-generated, so a retried or
                ambiguous claim can be recognised).
            worker_id: the claiming worker (``task_runs.worker_id``).
            at: claim time (database clock).

        Returns:
            The new run, ``running``, with ``attempt_number`` equal to the new ``attempt``.

        Raises:
            TaskNotClaimable: the task is not ``queued``, not yet due (a stale duplicate id
                popped early), or has no attempts left.
        """
        if self.status is not TaskStatus.QUEUED:
            raise TaskNotClaimable(f"task {self.id} is {self.status}, not queued")
        if not self.is_due(at):
            raise TaskNotClaimable(
                f"task {self.id} is not due until {self.scheduled_at}",
                not_before=self.scheduled_at,
                priority=self.priority,
            )
        if self.attempt >= self.max_attempts:
            raise TaskNotClaimable(f"task {self.id} has no attempts left")
        self._move(TaskStatus.RUNNING, at=at, cause="claimed")
        self.attempt += 1
        self.started_at = at
        self.finished_at = None
        self.current_run_id = run_id
        return TaskRun(
            id=run_id,
            task_id=self.id,
            attempt_number=self.attempt,
            worker_id=worker_id,
            status=RunStatus.RUNNING,
            started_at=at,
        )

    def succeed(self, run: TaskRun, *, at: datetime, result: Any = None) -> bool:
        """Record the handler's success: task ``completed``, run ``succeeded`` (spec §6 Success).

        Args:
            run: the run reporting it; must be the task's live run.
            at: completion time (database clock).
            result: the handler's return value, stored as the task's result (the caller has
                checked it with ``payload.check_result``). A replay keeps the first result.

        Returns:
            True when the state changed; False when this very run had already succeeded
            (a replayed report is a no-op, not a conflict).

        Raises:
            StaleRun: the run is not the task's live run (reclaimed, or another outcome).
        """
        if run.status is RunStatus.SUCCEEDED and run.task_id == self.id:
            return False
        self._live_run(run)
        run._end(RunStatus.SUCCEEDED, at=at)
        self._move(TaskStatus.COMPLETED, at=at, cause="succeeded")
        self.finished_at = at
        self.current_run_id = None
        self.last_error = None
        self.result = result
        return True

    def fail(
        self,
        run: TaskRun,
        *,
        error: str,
        permanent: bool,
        backoff: timedelta,
        at: datetime,
    ) -> RetryDecision | None:
        """Record the handler's failure (spec §6 Failure, DESIGN §2 failure).

        The run becomes ``failed``. While attempts remain and the error is not permanent, the
        task goes back to ``queued`` with ``scheduled_at = at + backoff``; otherwise it is
        ``failed`` (the caller then cascades to pending dependents).

        Returns:
            The retry decision, or None when this run had already failed (replay: no-op).

        Raises:
            StaleRun: the run is not the task's live run.
        """
        if run.status is RunStatus.FAILED and run.task_id == self.id:
            return None
        self._live_run(run)
        decision = decide_retry(
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            permanent=permanent,
            backoff=backoff,
            at=at,
        )
        run._end(RunStatus.FAILED, at=at, error=error)
        self.last_error = error
        self.current_run_id = None
        if decision.retry:
            assert decision.next_attempt_at is not None
            self._move(TaskStatus.QUEUED, at=at, cause="retry")
            self.scheduled_at = decision.next_attempt_at
        else:
            self._move(TaskStatus.FAILED, at=at, cause="failed")
            self.finished_at = at
        return decision

    def reclaim(
        self,
        run: TaskRun,
        *,
        reason: str,
        max_reclaims: int,
        at: datetime,
        worker_lost: bool = True,
    ) -> bool:
        """Abandon a run whose worker was lost (spec §2 invariant, §4 attempt invariant).

        The run becomes ``dead``; the task goes back to ``queued`` due now with ``attempt``
        rolled back by one, so losing a worker costs no retry. ``reclaims`` counts lost runs;
        once it exceeds ``max_reclaims`` the task fails with a ``worker lost`` error instead
        (DESIGN §3 crash budget). A graceful hand-back at worker shutdown passes
        ``worker_lost=False``: the run is still ``dead`` but the crash budget is not charged.

        Returns:
            True when the task was re-queued, False when the crash budget failed it.

        Raises:
            StaleRun: the run is not the task's live run (already ended or reclaimed).
        """
        self._live_run(run)
        run._end(RunStatus.DEAD, at=at, error=reason)
        self.current_run_id = None
        if worker_lost:
            self.reclaims += 1
        if self.reclaims > max_reclaims:
            self.last_error = f"{WORKER_LOST}: {self.reclaims} runs abandoned ({reason})"
            self._move(TaskStatus.FAILED, at=at, cause="reclaimed")
            self.finished_at = at
            return False
        self.attempt -= 1
        self.last_error = reason
        self._move(TaskStatus.QUEUED, at=at, cause="reclaimed" if worker_lost else "handed_back")
        self.scheduled_at = at
        return True

    def promote(self, *, at: datetime) -> None:
        """``pending -> queued``: all dependencies have completed (DESIGN §2 promotion).

        Due at ``at``, or later at the task's own ``scheduled_at`` when it was submitted with a
        ``run_at``/``delay`` still in the future (issue 14 item 2): see :attr:`due_later`.

        Raises:
            InvalidTransition: the task is not ``pending``.
        """
        self._move(TaskStatus.QUEUED, at=at, cause="promoted")
        self.scheduled_at = max(self.scheduled_at, at)

    @property
    def due_later(self) -> bool:
        """True when the task's due time is after its last change (``scheduled_at >
        updated_at``): a queued task in this state belongs on the scheduled set, not on a
        ready list."""
        return self.scheduled_at > self.updated_at

    def cascade_fail(self, *, failed_dependency: str, at: datetime) -> None:
        """``pending -> failed`` because a dependency failed (spec README: transitive cascade).

        Raises:
            InvalidTransition: the task is not ``pending``.
        """
        self._move(TaskStatus.FAILED, at=at, cause="cascade")
        self.finished_at = at
        self.last_error = f"dependency {failed_dependency!r} failed"

    def cancel(self, *, at: datetime, run: TaskRun | None = None) -> bool:
        """Cancel the task (issue 14 item 1): ``pending|queued|running -> cancelled``.

        A ``running`` task needs its live ``run``, which is closed ``cancelled`` (the worker
        learns it through its next lease heartbeat; a report of that run is refused from now
        on). Cancelling a cancelled task changes nothing (idempotent).

        Args:
            at: cancel time (database clock).
            run: the task's live run; required when the task is ``running``.

        Returns:
            True when the task changed; False when it already was ``cancelled``.

        Raises:
            NotCancellable: the task is ``completed`` or ``failed``.
            StaleRun: the task is ``running`` and ``run`` is not its live run.
        """
        if self.status is TaskStatus.CANCELLED:
            return False
        if self.status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
            raise NotCancellable(f"task {self.id} is {self.status}", field="id")
        if self.status is TaskStatus.RUNNING:
            if run is None:
                raise StaleRun(f"task {self.id} is running: its live run is needed to cancel it")
            self._live_run(run)
            run._end(RunStatus.CANCELLED, at=at, error=CANCELLED_ERROR)
            self.current_run_id = None
        self._move(TaskStatus.CANCELLED, at=at, cause="cancelled")
        self.finished_at = at
        return True

    def cascade_cancel(self, *, cancelled_dependency: str, at: datetime) -> None:
        """``pending -> cancelled`` because a dependency was cancelled (issue 14 item 1).

        Raises:
            InvalidTransition: the task is not ``pending``.
        """
        if self.status is not TaskStatus.PENDING:
            raise InvalidTransition(f"task {self.id} is {self.status}, not pending")
        self._move(TaskStatus.CANCELLED, at=at, cause="cascade")
        self.finished_at = at
        self.last_error = f"dependency {cancelled_dependency!r} cancelled"

    @property
    def ended_while_pending(self) -> bool:
        """True for a ``failed`` or ``cancelled`` task that never started (no run): it ended
        while it waited for its dependencies, by the cascade (or a cancel), so the retry of a
        dependency reopens it (issue 14 item 4)."""
        return self.status in (TaskStatus.FAILED, TaskStatus.CANCELLED) and self.started_at is None

    def retry(self, *, at: datetime, dependencies_completed: bool) -> None:
        """Manual retry (issue 14 item 4): ``failed|cancelled -> queued`` due ``at``, or
        ``-> pending`` when some dependency has not completed yet.

        The attempt budget starts afresh (``attempt`` and ``reclaims`` 0); the run history,
        ``last_error`` and the progress checkpoint are kept. The next claim's run again has
        ``attempt_number`` 1, so a task's runs are told apart by id and ``started_at`` (spec
        §4), as after a reclaim.

        Args:
            at: retry time (database clock).
            dependencies_completed: every direct dependency is ``completed`` (index probe).

        Raises:
            NotRetryable: the task is not ``failed`` or ``cancelled``.
        """
        if self.status not in (TaskStatus.FAILED, TaskStatus.CANCELLED):
            raise NotRetryable(f"task {self.id} is {self.status}", field="id")
        self._move(
            TaskStatus.QUEUED if dependencies_completed else TaskStatus.PENDING,
            at=at,
            cause="retried",
        )
        self.attempt = 0
        self.reclaims = 0
        self.scheduled_at = at
        self.finished_at = None
        self.current_run_id = None


#: Every field of a TaskRun / a Task, in ``__init__`` order (for ``__copy__``).
_run_fields = attrgetter(*(f.name for f in fields(TaskRun)))
_task_fields = attrgetter(*(f.name for f in fields(Task)))


@dataclass(slots=True)
class Job:
    """A group of tasks submitted together (a ``jobs`` row).

    Attributes:
        idempotency_key: the client's ``Idempotency-Key``, unique across jobs, or None.
        request_hash: fingerprint of the request body that created the job under that key.
        trace_context: the trace context of the submit request (issue 16 item 5), an opaque
            string (a W3C ``traceparent``) that only the entrypoints interpret; fixed at
            creation; None when tracing was off.
        has_dependencies: whether some task of the job depends on another (it has edges);
            fixed at creation. None when unknown (a job stored before it was recorded).
        task_count: how many tasks the job has (>= 1); fixed at creation. None when unknown
            (a job stored before it was recorded).
    """

    id: UUID
    name: str
    status: JobStatus
    created_at: datetime
    updated_at: datetime
    metadata: Any = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    version: int = 0
    trace_context: str | None = None
    has_dependencies: bool | None = None
    task_count: int | None = None
    # status moves not yet written to the outbox (issue 16 item 1), as on ``Task``
    transitions: tuple[Transition, ...] = field(default=(), compare=False, repr=False)

    def __copy__(self) -> Job:
        """A shallow copy, as ``copy.copy`` makes it, through ``__init__`` (see
        ``TaskRun.__copy__``)."""
        return type(self)(*_job_fields(self))

    def set_status(self, status: JobStatus, *, at: datetime) -> bool:
        """Move to ``status`` if it differs; a terminal ``failed`` job stays failed.

        Returns:
            True when the status changed (and the row must be written), else False.
        """
        if status is self.status or self.status is JobStatus.FAILED:
            return False
        self.transitions = (*self.transitions, Transition(str(self.status), str(status), "settled"))
        self.status = status
        self.updated_at = at
        return True

    def reopen(self, status: JobStatus, *, at: datetime) -> bool:
        """Move to ``status`` (re-derived after a manual retry, issue 14 item 4) even out of a
        terminal status: the one way a ``failed`` or ``cancelled`` job becomes unfinished.

        Returns:
            True when the status changed (and the row must be written), else False.
        """
        if status is self.status:
            return False
        self.transitions = (
            *self.transitions,
            Transition(str(self.status), str(status), "reopened"),
        )
        self.status = status
        self.updated_at = at
        return True


#: Every field of a Job, in ``__init__`` order (for ``__copy__``).
_job_fields = attrgetter(*(f.name for f in fields(Job)))


@dataclass(slots=True)
class Worker:
    """A worker process in the optional registry (``workers`` row, spec §4).

    Attributes:
        metadata: free-form JSON object, e.g. ``{"kinds": [...], "concurrency": 4}``.
        redis_key_prefix: the hash-tagged Redis key prefix its leases live under; None for a
            row written by a worker older than the field.
    """

    id: str
    hostname: str | None
    last_heartbeat_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)
    redis_key_prefix: str | None = None
