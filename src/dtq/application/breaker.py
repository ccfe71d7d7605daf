"""A circuit breaker for the submit service's pushes after the commit (ARCHITECTURE.md, "Group
commit of submissions", the push breaker).

A Redis that hangs (its process stopped: connections are accepted, nothing answers) makes every
push wait the client's reply timeout (about 3 s), and a lone submit or a group's lane waits with
it, for a push whose loss is harmless: the jobs are committed and the reconciler pushes due
``queued`` tasks whose pending marker is missing (spec §5). So after a push fails, the pushes of
the next ``PUSH_BREAKER_OPEN_FOR`` seconds are not sent; then one is (half-open): its success
closes the breaker, its failure opens it again. That trial is given up after
``PUSH_TRIAL_TIMEOUT`` seconds, so while Redis stays hung each open period costs one submit (or
one lane) that much instead of the reply timeout. A push while the breaker is closed keeps the
client's own timeout: a slow but working Redis must not open the breaker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal, Protocol

from dtq.domain.errors import BackendUnavailable

#: Seconds the post-commit pushes are skipped after one failed.
PUSH_BREAKER_OPEN_FOR = 1.0
#: Seconds the half-open trial push may take before it is given up as failed: well above a
#: healthy push (a reconnect and one script call, milliseconds even on a loaded machine), well
#: under the Redis client's 3 s reply timeout (ARCHITECTURE.md, the push breaker).
PUSH_TRIAL_TIMEOUT = 0.5

Missed = Literal["failed", "skipped"]


class PushSkipped(BackendUnavailable):
    """The push was not sent: a recent one failed (the reconciler pushes these tasks)."""


class PushTimedOut(BackendUnavailable):
    """The trial push got no answer in time and was given up (it may still run on the server)."""


class PushWatcher(Protocol):
    """Told what the breaker does, for metrics and logs (implemented in ``entrypoints``)."""

    def missed(self, reason: Missed, jobs: int) -> None:
        """A push of ``jobs`` committed jobs did not happen: ``failed`` (it raised
        ``BackendUnavailable``) or ``skipped`` (the breaker was open). Called for each."""

    def opened(self, error: BackendUnavailable, open_for: float) -> None:
        """A push failed and the breaker opened for ``open_for`` seconds: called once per open
        period. ``error`` is the push's own, or ``PushTimedOut`` for a trial given up."""

    def closed(self, missed: int) -> None:
        """A push succeeded after the breaker had opened; ``missed``: the jobs whose push
        failed or was skipped meanwhile."""


class PushBreaker:
    """Skips pushes for ``open_for`` seconds after one failed, then tries one again, for at most
    ``trial_timeout`` seconds.

    One per process (the pushes of every submit share it). Not thread-safe: the event loop's.

    Args:
        open_for: seconds the pushes are skipped after a failure.
        trial_timeout: seconds of the event loop's clock the half-open trial push may take; it
            is then cancelled and counted as failed. The push's calls must leave nothing behind
            when cancelled (``Queue``'s contract). Pushes while closed are not bounded here.
        clock: monotonic seconds (the open period; not the trial's bound).
        watcher: told of missed pushes, opening and closing; nothing when None.
    """

    def __init__(
        self,
        *,
        open_for: float = PUSH_BREAKER_OPEN_FOR,
        trial_timeout: float = PUSH_TRIAL_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        watcher: PushWatcher | None = None,
    ) -> None:
        self._open_for = open_for
        self._trial_timeout = trial_timeout
        self._clock = clock
        self._watcher = watcher
        self._open_until: float | None = None  # None: closed
        self._trial = False  # the half-open push is in flight
        self._missed = 0  # jobs whose push failed or was skipped since the breaker opened

    @property
    def trial_timeout(self) -> float:
        """Seconds the half-open trial push may take."""
        return self._trial_timeout

    @property
    def is_open(self) -> bool:
        """A push failed and none succeeded since."""
        return self._open_until is not None

    @asynccontextmanager
    async def attempt(self, jobs: int) -> AsyncIterator[None]:
        """Around one push of ``jobs`` committed jobs: records its outcome, and gives the
        half-open trial up after ``trial_timeout`` seconds (the body is cancelled).

        Raises:
            PushSkipped: on entering, while the breaker is open (the body does not run).
            PushTimedOut: the trial took longer than ``trial_timeout``; the breaker opened
                again.
            BackendUnavailable: the push's own, re-raised after it opened the breaker.
        """
        trial = self._enter(jobs)
        bound = asyncio.timeout(self._trial_timeout) if trial else None  # closed: no deadline
        try:
            if bound is None:
                yield
            else:
                async with bound:
                    yield
        except BackendUnavailable as exc:
            self._failed(exc, jobs, trial=trial)
            raise
        except BaseException as exc:
            if isinstance(exc, TimeoutError) and bound is not None and bound.expired():
                timed_out = PushTimedOut(
                    f"the trial push got no answer within {self._trial_timeout} s"
                )
                # the trial's own deadline, not a cancel from outside
                self._failed(timed_out, jobs, trial=True)
                raise timed_out from exc
            if trial:  # cancelled: the next push after the period is the trial
                self._trial = False
            raise
        self._succeeded()

    def _enter(self, jobs: int) -> bool:
        """Whether this push is the half-open trial; raises ``PushSkipped`` to skip it."""
        if self._open_until is None:
            return False
        if self._trial or self._clock() < self._open_until:
            self._miss("skipped", jobs)
            raise PushSkipped
        self._trial = True
        return True

    def _failed(self, error: BackendUnavailable, jobs: int, *, trial: bool) -> None:
        self._miss("failed", jobs)
        if self._open_until is not None and not trial:
            return  # sent before the breaker opened: the period stands
        self._open_until = self._clock() + self._open_for
        self._trial = False
        if self._watcher is not None:
            self._watcher.opened(error, self._open_for)

    def _succeeded(self) -> None:
        if self._open_until is None:
            return
        missed, self._missed = self._missed, 0
        self._open_until, self._trial = None, False
        if self._watcher is not None:
            self._watcher.closed(missed)

    def _miss(self, reason: Missed, jobs: int) -> None:
        self._missed += jobs
        if self._watcher is not None:
            self._watcher.missed(reason, jobs)
