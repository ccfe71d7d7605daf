"""Inputs and outputs of the application services (no HTTP types here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

from dtq.application.filters import JobKeyset, TaskKeyset
from dtq.domain.entities import DEFAULT_PRIORITY, Job, Task, TaskRun
from dtq.domain.policy import RetryPolicy
from dtq.domain.status import TaskStatus


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of a job to submit.

    Attributes:
        name: unique within the job; dependencies refer to it.
        kind: handler key, e.g. ``email.send`` (spec §6 Registration).
        payload: decoded JSON handed to the handler.
        depends_on: names of tasks of the same job that must complete first.
        max_attempts: retry budget, >= 1.
        priority: ready-queue tier (``queue:ready:{priority}``).
        run_at: due no earlier than this aware time (issue 14 item 2); a past time is now.
        delay: due this long after the submit's transaction time. At most one of the two.
        retry_policy: the task's own retry backoff (issue 14 item 3); None: ``RETRY_BACKOFF``.
        timeout: the task's handler timeout, winning over the kind's; None: the kind's.
    """

    name: str
    kind: str
    payload: Any = None
    depends_on: tuple[str, ...] = ()
    max_attempts: int = 3
    priority: str = DEFAULT_PRIORITY
    run_at: datetime | None = None
    delay: timedelta | None = None
    retry_policy: RetryPolicy | None = None
    timeout: timedelta | None = None


@dataclass(frozen=True, slots=True)
class SubmitJob:
    """A job to create (spec §7 POST /v1/jobs; POST /v1/tasks is a one-task job).

    Attributes:
        idempotency_key: the client's ``Idempotency-Key`` header, or None.
        request_hash: fingerprint of the request body; the same key with another hash is a
            conflict.
        trace_context: an opaque trace context stored with the job (``Job.trace_context``,
            issue 16 item 5), or None.
    """

    tasks: tuple[TaskSpec, ...]
    name: str = ""
    metadata: Any = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """Ids of a submitted job. ``created`` is False for an idempotent replay."""

    job_id: UUID
    task_ids: dict[str, UUID]
    created: bool


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task with its run history ordered by ``started_at``."""

    task: Task
    runs: list[TaskRun]


@dataclass(frozen=True, slots=True)
class JobView:
    """A job with its tasks (issue 14 item 5: and its task counts).

    Attributes:
        tasks: every task (ordered by ``created_at``, ``name``), or one page of them in
            submission order when a page size was asked for.
        counts: tasks per status, every status present (0 when none).
        next_after: the keyset ``(position, id)`` of the next page of tasks; None when the last
            page (or every task) was returned.
    """

    job: Job
    tasks: list[Task]
    counts: Mapping[TaskStatus, int] = field(default_factory=dict)
    next_after: tuple[int, UUID] | None = None


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of the task listing (``GET /v1/tasks``), newest first.

    Attributes:
        tasks: without ``payload``, ``result`` and ``progress`` (None).
        next_after: the keyset of the page's last task when more may follow, else None.
    """

    tasks: list[Task]
    next_after: TaskKeyset | None


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of the job listing (``GET /v1/jobs``), newest first.

    Attributes:
        next_after: the keyset of the page's last job when more may follow, else None.
    """

    jobs: list[Job]
    next_after: JobKeyset | None


@dataclass(frozen=True, slots=True)
class JobResultsView:
    """One page of a job's results (``GET /v1/jobs/{id}/results``).

    Attributes:
        tasks: the page's tasks in submission order (``Task.position``, then id).
        next_after: the keyset cursor ``(position, id)`` of the next page, or None on the last.
    """

    job: Job
    tasks: list[Task]
    next_after: tuple[int, UUID] | None


@dataclass(frozen=True, slots=True)
class ExecutionPolicy:
    """Timings and budgets of execution; all durations in seconds.

    Attributes:
        lease_duration: logical lease window (``LEASE_DURATION``).
        retry_backoff: delay before a failed task is retried (``RETRY_BACKOFF``).
        stale_running_after: minimum age of a ``running`` task before reclaim is considered
            (``STALE_RUNNING_AFTER``); reclaim also needs the lease to be absent.
        max_reclaims: crash budget: lost-worker reclaims allowed per task before it fails with
            ``worker lost`` (DESIGN §3).
        lease_ttl_buffer: most that is added to ``lease_duration`` for the Redis key TTL
            (spec §5); never more than half the lease, so a short lease set for a demo or a
            drill is not stretched by a fixed buffer.
        max_result_bytes: largest JSON-encoded handler result a task may store, in bytes
            (``API_MAX_RESULT_BYTES``); see ``domain.payload.check_result``.
    """

    lease_duration: float = 30.0
    retry_backoff: float = 5.0
    stale_running_after: float = 60.0
    max_reclaims: int = 5
    lease_ttl_buffer: float = 5.0
    max_result_bytes: int = 1024 * 1024

    @property
    def lease_ttl(self) -> float:
        """Lease hash TTL in seconds: ``lease_duration + min(buffer, lease_duration / 2)``."""
        return self.lease_duration + min(self.lease_ttl_buffer, self.lease_duration / 2)


@dataclass(frozen=True, slots=True)
class Claim:
    """A task claimed by a worker: the task as claimed and its new live run.

    ``task.attempt == run.attempt_number`` (1-based). ``parents`` maps the name of each direct
    dependency to its result, read in the claim transaction (fan-in, issue 13); empty for a
    task without dependencies. ``trace_context`` is the job's ``Job.trace_context`` (opaque;
    issue 16 item 5), read with the job rows the claim reads anyway; None when the job has none.
    ``job`` is the job row as the claim transaction left it (shared by the claims of one
    batch: not to be changed); the success of the only task of a job (``Job.task_count`` 1)
    settles the job from it rather than from a read. None when the claim was rebuilt without
    its job (a worker over HTTP).
    """

    task: Task
    run: TaskRun
    worker_id: str
    parents: Mapping[str, Any] = field(default_factory=dict)
    trace_context: str | None = None
    job: Job | None = None

    @property
    def job_has_dependencies(self) -> bool | None:
        """The job's ``Job.has_dependencies``: False lets the success of the claim skip the
        search for dependents to promote (no task of the job depends on another); None (the
        job unknown, or stored before it was recorded) and True search."""
        return None if self.job is None else self.job.has_dependencies


class ReportOutcome(StrEnum):
    """What happened to a worker's report of an outcome."""

    RECORDED = "recorded"  # the state changed
    DUPLICATE = "duplicate"  # the same outcome was already recorded for this run: no-op
    STALE = "stale"  # the run is no longer live (reclaimed): refused, nothing changed


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """Counts of one reconcile pass.

    Attributes:
        unpolled: due ``queued`` tasks per priority that no live worker polls (only priorities
            with some), or None when this pass did not finish counting the due tasks.
        queue_reset: the pass found the queue's data lost (a new queue epoch).
        reclaim_deferred: reclaims were held back: the queue's data is younger than a lease TTL.
        reclaims_held: runs without a lease not reclaimed because their live worker is
            registered with another Redis key prefix, counted by that prefix
            (``ReconcileService.reclaim_stale``); empty when there were none.
    """

    enqueued: int = 0
    reclaimed: int = 0
    promoted: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    unpolled: dict[str, int] | None = None
    queue_reset: bool = False
    reclaim_deferred: bool = False
    reclaims_held: dict[str, int] = field(default_factory=dict)
