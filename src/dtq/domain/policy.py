"""Pure decisions: retry after a failure, and the aggregate job status (spec §4, §6)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from dtq.domain.status import JobStatus


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """What happens to a task after its run failed.

    Attributes:
        retry: True when the task goes back to ``queued`` for another attempt.
        next_attempt_at: when the next attempt becomes due (aware UTC); None when not retrying.
    """

    retry: bool
    next_attempt_at: datetime | None


def decide_retry(
    *, attempt: int, max_attempts: int, permanent: bool, backoff: timedelta, at: datetime
) -> RetryDecision:
    """Decide whether a failed attempt is retried (spec §6 Failure, DESIGN §2 failure).

    Args:
        attempt: the attempt that just failed (1-based; ``tasks.attempt`` after the claim).
        max_attempts: the task's retry budget (``tasks.max_attempts``, >= 1).
        permanent: the error is permanent (unknown kind, ``PermanentError``): never retried.
        backoff: delay before the next attempt becomes due.
        at: the failure time (the database clock).

    Returns:
        ``RetryDecision(retry=True, next_attempt_at=at + backoff)`` while attempts remain and the
        error is not permanent, else ``RetryDecision(False, None)``.
    """
    if permanent or attempt >= max_attempts:
        return RetryDecision(retry=False, next_attempt_at=None)
    return RetryDecision(retry=True, next_attempt_at=at + backoff)


def derive_job_status(
    *, any_failed: bool, any_unfinished: bool, any_cancelled: bool, any_started: bool
) -> JobStatus:
    """Aggregate a job's status from facts about its tasks (spec §4 RefreshJobStatus, DESIGN §2).

    Args:
        any_failed: some task is ``failed``.
        any_unfinished: some task is ``pending``, ``queued`` or ``running``.
        any_cancelled: some task is ``cancelled``.
        any_started: some task has ever been claimed (or the job already left ``pending``).

    Returns:
        ``failed`` if any task failed; else ``running``/``pending`` while work is unfinished
        (``running`` once anything started); else ``cancelled`` if some task was cancelled;
        else ``completed``.
    """
    if any_failed:
        return JobStatus.FAILED
    if any_unfinished:
        return JobStatus.RUNNING if any_started else JobStatus.PENDING
    if any_cancelled:
        return JobStatus.CANCELLED
    return JobStatus.COMPLETED
