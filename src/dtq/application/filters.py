"""Listing filters (issue 14 item 5): what ``GET /v1/tasks`` and ``GET /v1/jobs`` select, as
query objects the store ports take, and the keyset position their pages are cut at.

Every listing is newest first: ``created_at`` descending, ties broken by ``id`` descending for
jobs and by ``(position, id)`` descending for tasks (all tasks of one job share their
``created_at``, so a job's tasks come last-submitted first, and the tasks of one job are served
by the existing ``(job_id, job_position, id)`` index; two jobs created in the same microsecond
interleave by position). A keyset (:data:`JobKeyset`,
:data:`TaskKeyset`) names a position in that order; a page holds the rows strictly after it. A
keyset is meaningful with the filter whose page produced it. The bulk operations planned for
issue 14 item 6 reuse :class:`TaskFilter` with ``TaskRepository.matching_task_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from dtq.domain.entities import Job, Task
from dtq.domain.errors import ValidationError
from dtq.domain.status import JobStatus, TaskStatus

#: A position in the newest-first job listing: ``(created_at, id)`` of the last job of a page.
JobKeyset = tuple[datetime, UUID]
#: A position in the newest-first task listing: ``(created_at, position, id)`` of a task.
TaskKeyset = tuple[datetime, int, UUID]

#: Page size of a listing when none is asked for, and the largest one.
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500


def _check_window(since: datetime | None, until: datetime | None) -> None:
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise ValidationError(f"{name} must be an aware time", field=name)


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks a listing selects; every given criterion must hold (AND).

    Attributes:
        statuses: any of these statuses (empty: every status).
        kind: exactly this kind.
        job_id: tasks of this job only.
        priority: exactly this ready-queue tier.
        since: ``created_at >= since`` (aware), inclusive.
        until: ``created_at < until`` (aware), exclusive.

    Raises:
        ValidationError: a naive ``since``/``until`` (field named).
    """

    statuses: frozenset[TaskStatus] = field(default_factory=frozenset)
    kind: str | None = None
    job_id: UUID | None = None
    priority: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        _check_window(self.since, self.until)

    def matches(self, task: Task) -> bool:
        """True when ``task`` is selected (the memory adapter's rule)."""
        return (
            (not self.statuses or task.status in self.statuses)
            and (self.kind is None or task.kind == self.kind)
            and (self.job_id is None or task.job_id == self.job_id)
            and (self.priority is None or task.priority == self.priority)
            and in_window(task.created_at, self.since, self.until)
        )


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing selects; every given criterion must hold (AND).

    Attributes:
        statuses: any of these job statuses (empty: every status).
        name: exactly this job name.
        since: ``created_at >= since`` (aware), inclusive.
        until: ``created_at < until`` (aware), exclusive.

    Raises:
        ValidationError: a naive ``since``/``until`` (field named).
    """

    statuses: frozenset[JobStatus] = field(default_factory=frozenset)
    name: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        _check_window(self.since, self.until)

    def matches(self, job: Job) -> bool:
        """True when ``job`` is selected (the memory adapter's rule)."""
        return (
            (not self.statuses or job.status in self.statuses)
            and (self.name is None or job.name == self.name)
            and in_window(job.created_at, self.since, self.until)
        )


def in_window(created_at: datetime, since: datetime | None, until: datetime | None) -> bool:
    """``since <= created_at < until``, an absent bound being open."""
    return (since is None or created_at >= since) and (until is None or created_at < until)


def task_keyset(task: Task) -> TaskKeyset:
    """The position of ``task`` in the newest-first task listing."""
    return (task.created_at, task.position, task.id)


def job_keyset(job: Job) -> JobKeyset:
    """The position of ``job`` in the newest-first job listing."""
    return (job.created_at, job.id)


def check_limit(limit: int) -> None:
    """Refuse a page size outside ``1..MAX_LIST_LIMIT``.

    Raises:
        ValidationError: field ``limit``.
    """
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValidationError(
            f"limit must be an integer from 1 to {MAX_LIST_LIMIT}, got {limit}", field="limit"
        )
