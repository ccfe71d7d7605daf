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
    CANCELLED = "cancelled"  # its task was cancelled while it ran (issue 14 item 1)


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
#: ``pending -> failed`` is the cascade from a failed dependency. The exits from ``failed`` and
#: ``cancelled`` are taken only by an explicit manual retry (issue 14 item 4): nothing else moves
#: a task out of a terminal status.
TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    # promoted; cancelled (by a user, or the cascade from a cancelled dependency); failed by the
    # cascade from a failed dependency
    TaskStatus.PENDING: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED}),
    # claimed; cancelled
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    # succeeded; failed for good; retried or reclaimed; cancelled while it ran (its run is
    # closed ``cancelled``, the worker learns it through its next lease heartbeat)
    TaskStatus.RUNNING: frozenset(
        {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.QUEUED, TaskStatus.CANCELLED}
    ),
    TaskStatus.COMPLETED: frozenset(),
    # manual retry: ``queued`` with a fresh attempt budget (its dependencies all completed), or
    # ``pending`` (a dependency is unfinished; also a dependent the cascade had ended, reopened
    # by the retry of the task it depends on)
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED, TaskStatus.PENDING}),
    # manual retry, as from ``failed``
    TaskStatus.CANCELLED: frozenset({TaskStatus.QUEUED, TaskStatus.PENDING}),
}

#: Where only a manual retry leads out of a terminal status (see TASK_TRANSITIONS).
MANUAL_RETRY_EXITS: frozenset[TaskStatus] = frozenset({TaskStatus.QUEUED, TaskStatus.PENDING})

#: Every legal run transition: a run ends exactly once.
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.DEAD, RunStatus.CANCELLED}
    ),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.DEAD: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}
