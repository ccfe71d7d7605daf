"""What the submit service's push breaker reports (ARCHITECTURE.md, "Group commit of
submissions", the push breaker): each missed push to a counter hook
(``orchestrator_submit_pushes_missed_total{reason}``), a warning when the breaker opens (once per
open period, not once per submit) and a line when a push succeeds again."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from dtq.application.breaker import Missed
from dtq.domain.errors import BackendUnavailable


class PushReport:
    """A :class:`~dtq.application.breaker.PushWatcher` that counts and logs.

    Args:
        count: called with the reason (``failed`` or ``skipped``) and the number of jobs for
            each missed push; nothing is counted when None.
    """

    def __init__(self, count: Callable[[str, int], None] | None = None) -> None:
        self._count = count
        self._log = structlog.get_logger("dtq.submit")

    def missed(self, reason: Missed, jobs: int) -> None:
        """Count the jobs whose push failed or was skipped."""
        if self._count is not None:
            self._count(reason, jobs)

    def opened(self, error: BackendUnavailable, open_for: float) -> None:
        """Warn once per open period."""
        self._log.warning(
            "push to Redis after a submit's commit failed: pushes skipped for a while, "
            "the reconciler pushes the committed tasks",
            error=str(error),
            skip_for=open_for,
        )

    def closed(self, missed: int) -> None:
        """Say that pushes go through again, and how many jobs were left to the reconciler."""
        self._log.info("pushes after a submit's commit go through again", missed_jobs=missed)
