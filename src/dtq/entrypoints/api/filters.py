"""The listing's query parameters (issue 14 item 5): ``GET /v1/tasks`` and ``GET /v1/jobs`` filters
into :class:`~dtq.application.filters.TaskFilter` / ``JobFilter``, their page size and their
opaque cursors. The bulk operations (issue 14 item 6) take the same filters and can reuse
:func:`task_filter`.

Every function that rejects a value raises a domain
:class:`~dtq.domain.errors.ValidationError` naming the parameter (HTTP 400).

* ``status``: repeated (``?status=failed&status=cancelled``), comma-separated
  (``?status=failed,cancelled``) or both; any of the values matches. An unknown status is a 400.
* ``kind``, ``priority``, job ``name``: exact match; a value no task or job could have (outside
  the submit body's patterns) is a 400, a well-formed one that nobody uses lists nothing. An
  empty ``name`` selects the jobs submitted without one (a ``POST /v1/tasks`` job is named
  after its kind).
* ``since`` (inclusive) / ``until`` (exclusive): RFC 3339 times with an offset, on
  ``created_at``.
* ``cursor``: tasks ``<created_at µs since the epoch>.<position>.<task id hex>``, jobs
  ``<job id hex>.<created_at µs>``; only meaningful with the filters of the page that returned it.
  No route takes another's cursor: the shapes differ from each other and from the
  ``<position>.<task id hex>`` of a job's task and result pages (``params.format_cursor``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, TypeVar
from uuid import UUID

from litestar.params import QueryParameter

from dtq.application.filters import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    JobFilter,
    JobKeyset,
    TaskFilter,
    TaskKeyset,
)
from dtq.domain.errors import ValidationError
from dtq.domain.names import NAME_PATTERN, PRIORITY_PATTERN
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.api.schemas import JOB_NAME_PATTERN
from dtq.entrypoints.api.timing import RFC_3339

#: The listing routes' shared query parameters (``GET /v1/tasks``, ``GET /v1/jobs``), checked
#: by the parsers below (so a bad value is a 400 naming the parameter, not litestar's own).
Since = Annotated[
    str | None, QueryParameter(description="created_at at or after this RFC 3339 time (offset)")
]
Until = Annotated[
    str | None, QueryParameter(description="created_at before this RFC 3339 time (offset)")
]
ListLimit = Annotated[str | None, QueryParameter(description="Page size, 1..500 (default 50)")]
ListCursor = Annotated[
    str | None,
    QueryParameter(description="The next_cursor of the previous page; absent: first"),
]

#: The query parameters each listing route accepts; any other name is a 400 naming it, so a
#: misspelt filter never silently lists everything.
TASK_PARAMS = frozenset(
    {"status", "kind", "job_id", "priority", "since", "until", "limit", "cursor"}
)
JOB_PARAMS = frozenset({"status", "name", "since", "until", "limit", "cursor"})
#: ``GET /v1/jobs/{id}`` and ``GET /v1/jobs/{id}/results``: the page only.
PAGE_PARAMS = frozenset({"limit", "cursor"})

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_MAX_MICROS = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _MICRO
_MAX_POSITION = 2**63 - 1
_NAME = re.compile(NAME_PATTERN)
_PRIORITY = re.compile(PRIORITY_PATTERN)
_JOB_NAME = re.compile(JOB_NAME_PATTERN)

S = TypeVar("S", bound=StrEnum)


def check_names(names: Iterable[str], allowed: frozenset[str]) -> None:
    """Refuse a query parameter the route does not know, or one given twice (only ``status``
    may be repeated).

    Args:
        names: every parameter name of the query string, once per occurrence.
        allowed: the route's parameters.

    Raises:
        ValidationError: field = the first unknown (sorted) or repeated name.
    """
    seen = list(names)
    unknown = sorted(set(seen) - allowed)
    if unknown:
        known = f"accepted: {', '.join(sorted(allowed))}" if allowed else "this route takes none"
        raise ValidationError(
            f"unknown query parameter {unknown[0]!r}; {known}", field=unknown[0][:64]
        )
    repeated = sorted({n for n in seen if n != "status" and seen.count(n) > 1})
    if repeated:
        raise ValidationError(f"{repeated[0]} given more than once", field=repeated[0])


def parse_statuses(values: Sequence[str] | None, enum: type[S]) -> frozenset[S]:
    """``?status=`` values, repeated and/or comma-separated; None or empty: no filter.

    Raises:
        ValidationError: a value that is not one of ``enum``'s statuses (field ``status``).
    """
    found: set[S] = set()
    for value in values or ():
        for part in value.split(","):
            try:
                found.add(enum(part.strip()))
            except ValueError:
                known = ", ".join(s.value for s in enum)
                raise ValidationError(
                    f"unknown status {part[:64]!r}; one of: {known}", field="status"
                ) from None
    return frozenset(found)


def _pattern(
    value: str | None, pattern: re.Pattern[str], field: str, most: int, *, empty: bool = False
) -> str | None:
    if value is None:
        return None
    if (not value and not empty) or len(value) > most or pattern.match(value) is None:
        raise ValidationError(
            f"{field} {value[:64]!r} cannot exist (see POST /v1/jobs)", field=field
        )
    return value


def parse_time(value: str | None, *, field: str) -> datetime | None:
    """An RFC 3339 time with an offset (``2026-12-01T12:00:00Z``), as aware UTC; None: absent.

    Raises:
        ValidationError: not RFC 3339, no offset, or out of range (field named).
    """
    if value is None:
        return None
    shape = RFC_3339.fullmatch(value) if len(value) <= 64 else None
    try:
        parsed = None if shape is None else datetime.fromisoformat(value.upper())
    except ValueError:  # a month 13, a leap second
        parsed = None
    if parsed is None or parsed.utcoffset() is None:
        raise ValidationError(
            f"{field} must be an RFC 3339 time with an offset (e.g. 2026-12-01T12:00:00Z),"
            f" got {value[:64]!r}",
            field=field,
        )
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValidationError(f"{field} is out of range: {value[:64]!r}", field=field) from None


def _window(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    start, end = parse_time(since, field="since"), parse_time(until, field="until")
    if start is not None and end is not None and end <= start:
        raise ValidationError("until must be later than since", field="until")
    return start, end


def task_filter(
    *,
    status: Sequence[str] | None = None,
    kind: str | None = None,
    job_id: str | None = None,
    priority: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> TaskFilter:
    """The ``GET /v1/tasks`` filters (see the module docstring).

    Raises:
        ValidationError: naming ``status``, ``kind``, ``job_id``, ``priority``, ``since`` or
            ``until``.
    """
    parsed_job: UUID | None = None
    if job_id is not None:
        try:
            parsed_job = UUID(job_id)
        except ValueError:
            raise ValidationError(f"{job_id[:64]!r} is not a UUID", field="job_id") from None
    start, end = _window(since, until)
    return TaskFilter(
        statuses=parse_statuses(status, TaskStatus),
        kind=_pattern(kind, _NAME, "kind", 200),
        job_id=parsed_job,
        priority=_pattern(priority, _PRIORITY, "priority", 32),
        since=start,
        until=end,
    )


def job_filter(
    *,
    status: Sequence[str] | None = None,
    name: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> JobFilter:
    """The ``GET /v1/jobs`` filters (see the module docstring).

    Raises:
        ValidationError: naming ``status``, ``name``, ``since`` or ``until``.
    """
    start, end = _window(since, until)
    return JobFilter(
        statuses=parse_statuses(status, JobStatus),
        name=_pattern(name, _JOB_NAME, "name", 200, empty=True),
        since=start,
        until=end,
    )


def parse_list_limit(value: str | None) -> int:
    """``?limit=``: an integer in ``1..MAX_LIST_LIMIT``; absent: ``DEFAULT_LIST_LIMIT``.

    Raises:
        ValidationError: anything else (field ``limit``).
    """
    if value is None:
        return DEFAULT_LIST_LIMIT
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_LIST_LIMIT:
        raise ValidationError(
            f"limit must be an integer from 1 to {MAX_LIST_LIMIT}, got {value[:64]!r}",
            field="limit",
        )
    return int(value)


def _micros(at: datetime) -> str:
    return str((at - _EPOCH) // _MICRO)


def format_task_cursor(key: TaskKeyset) -> str:
    """The opaque ``next_cursor`` of a task listing page."""
    return f"{_micros(key[0])}.{key[1]}.{key[2].hex}"


def format_job_cursor(key: JobKeyset) -> str:
    """The opaque ``next_cursor`` of a job listing page (the id first, so that it is not read
    as a task or result page's ``<position>.<task id hex>``)."""
    return f"{key[1].hex}.{_micros(key[0])}"


def _bad_cursor(value: str) -> ValidationError:
    return ValidationError(
        f"{value[:64]!r} is not a cursor: pass next_cursor from the previous page", field="cursor"
    )


def _number(text: str, most: int) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > len(str(most)) or int(text) > most:
        raise ValueError(text)
    return int(text)


def _uuid_hex(text: str) -> UUID:
    if len(text) != 32 or not text.isascii():
        raise ValueError(text)
    return UUID(hex=text)


def parse_task_cursor(value: str | None) -> TaskKeyset | None:
    """``?cursor=`` of ``GET /v1/tasks``; None or empty: the first page.

    Raises:
        ValidationError: not a cursor this route issued (field ``cursor``).
    """
    if not value:
        return None
    parts = value.split(".")
    try:
        if len(parts) != 3:
            raise ValueError(value)
        at = _EPOCH + _number(parts[0], _MAX_MICROS) * _MICRO
        return at, _number(parts[1], _MAX_POSITION), _uuid_hex(parts[2])
    except (ValueError, OverflowError):
        raise _bad_cursor(value) from None


def parse_job_cursor(value: str | None) -> JobKeyset | None:
    """``?cursor=`` of ``GET /v1/jobs``; None or empty: the first page.

    Raises:
        ValidationError: not a cursor this route issued (field ``cursor``).
    """
    if not value:
        return None
    parts = value.split(".")
    try:
        if len(parts) != 2:
            raise ValueError(value)
        return _EPOCH + _number(parts[1], _MAX_MICROS) * _MICRO, _uuid_hex(parts[0])
    except (ValueError, OverflowError):
        raise _bad_cursor(value) from None
