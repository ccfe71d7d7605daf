"""Status enumerations of spec §4 and the legal task transitions of DESIGN §2."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Lifecycle of a task (``tasks.status``)."""

    PENDING = "pending"  # waiting for dependencies to complete
    QUEUED = "queued"  # runnable once scheduled_at <= now; may sit in a Redis ready list
    RUNNING = "running"  # claimed by a worker; one live run exists
    COMPLETED = "completed"  # the handler succeeded (terminal)
    FAILED = "failed"  # attempts exhausted, permanent error, or a dependency failed (terminal)
    CANCELLED = "cancelled"  # withdrawn before it ran (terminal)

    @property
    def terminal(self) -> bool:
        """True for ``completed``, ``failed`` and ``cancelled``."""
        return self in _TERMINAL_TASK


class RunStatus(StrEnum):
    """Outcome of one delivery of a task to a worker (``task_runs.status``)."""

    RUNNING = "running"  # the handler is (believed to be) executing
    SUCCEEDED = "succeeded"  # the handler returned
    FAILED = "failed"  # the handler reported an error
    DEAD = "dead"  # abandoned: the worker stopped heartbeating and the run was reclaimed


class JobStatus(StrEnum):
    """Aggregate status of a job (``jobs.status``), derived from its tasks."""

    PENDING = "pending"  # nothing has started yet
    RUNNING = "running"  # some task has started and the job is not finished
    COMPLETED = "completed"  # every task completed
    FAILED = "failed"  # some task failed
    CANCELLED = "cancelled"  # every task terminal, some cancelled, none failed

    @property
    def terminal(self) -> bool:
        """True for ``completed``, ``failed`` and ``cancelled``."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


_TERMINAL_TASK = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})

#: Every legal task transition. ``running -> queued`` is both a retry and a reclaim;
#: ``pending -> failed`` is the cascade from a failed dependency.
TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.PENDING: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED}),
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.QUEUED}),
    TaskStatus.COMPLETED: frozenset(),
    TaskStatus.FAILED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
}

#: Every legal run transition: a run ends exactly once.
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.DEAD}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.DEAD: frozenset(),
}
