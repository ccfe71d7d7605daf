"""Domain errors: one root, business facts as subclasses, infrastructure as a separate branch.

Every error carries a ``detail`` that is safe to show to an API client and, where the error is
about one input field, the ``field`` it concerns (a dotted path such as
``tasks[2].depends_on[0]``).
"""

from __future__ import annotations

from datetime import datetime


class DtqError(Exception):
    """Root of every error dtq raises on purpose.

    Args:
        detail: human-readable message, safe to return to a client. Defaults to the class
            docstring's first line.
        field: the request field the error is about, when there is one.
    """

    code = "dtq_error"

    def __init__(self, detail: str | None = None, *, field: str | None = None) -> None:
        doc = (type(self).__doc__ or type(self).__name__).strip().splitlines()[0]
        self.detail = detail or doc
        self.field = field
        super().__init__(self.detail)


# --- not found ------------------------------------------------------------------------------


class NotFound(DtqError):
    """The requested object does not exist."""

    code = "not_found"


class TaskNotFound(NotFound):
    """No task has this id."""

    code = "task_not_found"


class JobNotFound(NotFound):
    """No job has this id."""

    code = "job_not_found"


class OperationNotFound(NotFound):
    """No bulk operation has this id (here: on this orchestrator, since its start)."""

    code = "operation_not_found"


# --- invalid input (400) ----------------------------------------------------------------------


class ValidationError(DtqError):
    """The request is not valid."""

    code = "validation_error"


class DagError(ValidationError):
    """The job's dependency graph is not valid (spec §7: 400 on validation)."""

    code = "invalid_dag"


class DuplicateTaskName(DagError):
    """Two tasks of one job share a name; names must be unique per job."""

    code = "duplicate_task_name"


class UnknownDependency(DagError):
    """A task depends on a name that is not a task of the same job."""

    code = "unknown_dependency"


class DuplicateDependency(DagError):
    """A task lists the same dependency more than once."""

    code = "duplicate_dependency"


class SelfDependency(DagError):
    """A task depends on itself."""

    code = "self_dependency"


class DependencyCycle(DagError):
    """The dependencies form a cycle.

    Attributes:
        path: the task names around the cycle, first name repeated at the end, in
            ``depends_on``'s direction: each task depends on the next (``["a", "b", "a"]``: a
            depends on b, b depends on a). The message prints it with ``->`` and says so; of a
            cycle longer than :attr:`SHOWN` tasks, the first and last names and the count.
    """

    code = "dependency_cycle"
    #: The most task names the message prints; a longer cycle shows its first and last ones.
    SHOWN = 10

    def __init__(self, path: list[str], *, field: str | None = "tasks") -> None:
        self.path = path
        tasks = len(path) - 1
        if tasks <= self.SHOWN:
            shown = "dependency cycle: " + " -> ".join(path)
        else:  # the first and last names of a long ring: the message stays one readable line
            half = self.SHOWN // 2
            shown = f"dependency cycle of {tasks} tasks: " + " -> ".join(
                [*path[:half], "...", *path[-half:]]
            )
        super().__init__(shown + " (each task depends on the next)", field=field)


class InvalidPayload(ValidationError):
    """A payload (or result, progress) value cannot be stored (NUL character, number out of
    range)."""

    code = "invalid_payload"


class InvalidMetadata(InvalidPayload):
    """A job's or worker's metadata cannot be stored (NUL character, number out of range, too
    large)."""

    code = "invalid_metadata"


# --- conflicts (409) --------------------------------------------------------------------------


class Conflict(DtqError):
    """The request conflicts with the current state."""

    code = "conflict"


class InvalidTransition(Conflict):
    """The entity's status does not allow this transition (DESIGN §2)."""

    code = "invalid_transition"


class TaskNotClaimable(Conflict):
    """The task is not ``queued`` and due, so it cannot be claimed (spec §5, ErrTaskNotClaimable).

    Attributes:
        not_before: set when the task is queued but not yet due: its ``scheduled_at``, so the
            caller can put the delivery back on the scheduled set instead of dropping it.
        priority: the task's priority tier, set together with ``not_before``.
    """

    code = "task_not_claimable"

    def __init__(
        self,
        detail: str | None = None,
        *,
        not_before: datetime | None = None,
        priority: str | None = None,
    ) -> None:
        self.not_before = not_before
        self.priority = priority
        super().__init__(detail)


class StaleRun(Conflict):
    """The reporting run is no longer the task's live run (it was reclaimed); nothing changed."""

    code = "stale_run"


class TooManyOperations(Conflict):
    """This orchestrator already runs as many bulk operations as it allows; wait for one to end
    (issue 14 item 6)."""

    code = "too_many_operations"


class NotCancellable(Conflict):
    """The task (or job) has already completed or failed, so it cannot be cancelled (issue 14
    item 1)."""

    code = "not_cancellable"


class NotRetryable(Conflict):
    """Only a ``failed`` or ``cancelled`` task can be retried, and only once none of its
    dependencies is failed or cancelled (issue 14 item 4)."""

    code = "not_retryable"


class IdempotencyConflict(Conflict):
    """The Idempotency-Key was already used with a different request body."""

    code = "idempotency_conflict"

    def __init__(self, detail: str | None = None, *, field: str | None = "Idempotency-Key") -> None:
        super().__init__(detail, field=field)


class DuplicateKind(DtqError):
    """A handler kind was registered twice on one worker runtime (spec §6 Registration)."""

    code = "duplicate_kind"


# --- concurrency / infrastructure -------------------------------------------------------------


class ConcurrentUpdate(DtqError):
    """A version-guarded write found the row changed since it was read; the function re-runs."""

    code = "concurrent_update"


class DuplicateIdempotencyKey(DtqError):
    """Another transaction inserted a job with the same Idempotency-Key first (a race)."""

    code = "duplicate_idempotency_key"


class BackendUnavailable(DtqError):
    """A backing service (database or Redis) failed or could not be reached."""

    code = "backend_unavailable"


class CommitOutcomeUnknown(BackendUnavailable):
    """The connection was lost during COMMIT (or SQLSTATE 40003): the write may or may not have
    been applied. Re-read state before acting again."""

    code = "commit_outcome_unknown"
