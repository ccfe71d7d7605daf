"""Pure decisions: retry after a failure, and the aggregate job status (spec §4, §6)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

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


Backoff = Literal["fixed", "exponential"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A task's own retry backoff (issue 14 item 3), stored on its row (``retry_policy``).

    Attributes:
        backoff: ``fixed`` (always ``delay``) or ``exponential`` (``delay * 2**(attempt-1)``).
        delay: the base delay; None means the deployment's ``RETRY_BACKOFF``.
        max_delay: the cap of an exponential delay (None: uncapped but for the 1-year limit).
        jitter: draw the delay uniformly from ``[d/2, d]`` ("equal jitter") instead of ``d``.
    """

    backoff: Backoff = "fixed"
    delay: timedelta | None = None
    max_delay: timedelta | None = None
    jitter: bool = False

    def to_json(self) -> dict[str, Any]:
        """The stored shape: ``{"backoff", "delay_ms"?, "max_delay_ms"?, "jitter"}``."""
        out: dict[str, Any] = {"backoff": self.backoff, "jitter": self.jitter}
        if self.delay is not None:
            out["delay_ms"] = _ms(self.delay)
        if self.max_delay is not None:
            out["max_delay_ms"] = _ms(self.max_delay)
        return out

    @classmethod
    def from_json(cls, value: Any) -> RetryPolicy | None:
        """Inverse of :meth:`to_json`; None for SQL NULL (or anything not an object)."""
        if not isinstance(value, dict):
            return None
        backoff: Backoff = "exponential" if value.get("backoff") == "exponential" else "fixed"
        delay, cap = value.get("delay_ms"), value.get("max_delay_ms")
        return cls(
            backoff=backoff,
            delay=None if delay is None else timedelta(milliseconds=int(delay)),
            max_delay=None if cap is None else timedelta(milliseconds=int(cap)),
            jitter=bool(value.get("jitter", False)),
        )


#: No retry is ever scheduled further out than this.
LONGEST_RETRY_DELAY = timedelta(days=366)


def retry_delay(
    policy: RetryPolicy | None,
    *,
    attempt: int,
    default: timedelta,
    rand: Callable[[], float],
) -> timedelta:
    """The delay before the retry that follows failed attempt ``attempt`` (1-based).

    ``fixed``: ``delay``; ``exponential``: ``delay * 2**(attempt-1)`` capped at ``max_delay``
    (and at :data:`LONGEST_RETRY_DELAY`); ``delay`` defaults to ``default`` (``RETRY_BACKOFF``).
    With ``jitter`` the result ``d`` becomes ``d * (0.5 + rand() / 2)``, so it stays in
    ``[d/2, d]``; ``rand`` returns a float in ``[0, 1)`` (inject a fixed one in tests).
    No policy (None) is ``fixed`` at ``default``, without jitter.
    """
    if policy is None:
        return default
    base = policy.delay if policy.delay is not None else default
    delay = base
    if policy.backoff == "exponential":
        exponent = min(max(attempt - 1, 0), 64)
        seconds = min(base.total_seconds() * 2.0**exponent, LONGEST_RETRY_DELAY.total_seconds())
        delay = timedelta(seconds=seconds)
        if policy.max_delay is not None:
            delay = min(delay, policy.max_delay)
    if policy.jitter:
        delay = delay * (0.5 + rand() / 2)
    return delay


def _ms(value: timedelta) -> int:
    return round(value.total_seconds() * 1000)


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
