"""A circuit breaker for the submit service's pushes after the commit (ARCHITECTURE.md, "Group
commit of submissions", the push breaker).

A Redis that hangs (its process stopped: connections are accepted, nothing answers) makes every
push wait the client's reply timeout (about 3 s), and a lone submit or a group's lane waits with
it, for a push whose loss is harmless: the jobs are committed and the reconciler pushes due
``queued`` tasks whose pending marker is missing (spec §5). So after a push fails, the pushes of
the next ``PUSH_BREAKER_OPEN_FOR`` seconds are not sent; then one is (half-open): its success
closes the breaker, its failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, Protocol

from dtq.domain.errors import BackendUnavailable

#: Seconds the post-commit pushes are skipped after one failed.
PUSH_BREAKER_OPEN_FOR = 1.0

Missed = Literal["failed", "skipped"]


class PushSkipped(BackendUnavailable):
    """The push was not sent: a recent one failed (the reconciler pushes these tasks)."""


class PushWatcher(Protocol):
    """Told what the breaker does, for metrics and logs (implemented in ``entrypoints``)."""

    def missed(self, reason: Missed, jobs: int) -> None:
        """A push of ``jobs`` committed jobs did not happen: ``failed`` (it raised
        ``BackendUnavailable``) or ``skipped`` (the breaker was open). Called for each."""

    def opened(self, error: BackendUnavailable, open_for: float) -> None:
        """A push failed and the breaker opened: called once per open period."""

    def closed(self, missed: int) -> None:
        """A push succeeded after the breaker had opened; ``missed``: the jobs whose push
        failed or was skipped meanwhile."""


class PushBreaker:
    """Skips pushes for ``open_for`` seconds after one failed, then tries one again.

    One per process (the pushes of every submit share it). Not thread-safe: the event loop's.

    Args:
        open_for: seconds the pushes are skipped after a failure.
        clock: monotonic seconds.
        watcher: told of missed pushes, opening and closing; nothing when None.
    """

    def __init__(
        self,
        *,
        open_for: float = PUSH_BREAKER_OPEN_FOR,
        clock: Callable[[], float] = time.monotonic,
        watcher: PushWatcher | None = None,
    ) -> None:
        self._open_for = open_for
        self._clock = clock
        self._watcher = watcher
        self._open_until: float | None = None  # None: closed
        self._trial = False  # the half-open push is in flight
        self._missed = 0  # jobs whose push failed or was skipped since the breaker opened

    @property
    def is_open(self) -> bool:
        """A push failed and none succeeded since."""
        return self._open_until is not None

    @contextmanager
    def attempt(self, jobs: int) -> Iterator[None]:
        """Around one push of ``jobs`` committed jobs: records its outcome.

        Raises:
            PushSkipped: on entering, while the breaker is open (the body does not run).
            BackendUnavailable: the push's own, re-raised after it opened the breaker.
        """
        trial = self._enter(jobs)
        try:
            yield
        except BackendUnavailable as exc:
            self._failed(exc, jobs, trial=trial)
            raise
        except BaseException:
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
