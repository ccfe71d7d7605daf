"""The listing statements (issue 14 item 5; plans in docs/SQL.md "Listing and counts").

A listing's WHERE clause depends on which filters are given, so its text is composed here from
the constant fragments below; every value is a bound parameter and no request text reaches the
SQL. Each shape is a range scan of one index, read in key order (backwards: newest first), and
stops at its LIMIT:

* tasks of one job: ``idx_tasks_job_position (job_id, job_position, id)`` — a job's tasks share
  ``created_at``, so ``(position, id)`` descending is the listing's order inside a job;
* tasks of one kind: ``idx_tasks_kind_created (kind, created_at, job_position, id)``;
* otherwise (statuses, priority, time window or nothing): one range of
  ``idx_tasks_status_created (status, created_at, job_position, id)`` per wanted status (every
  status when none is given) through ``CROSS JOIN LATERAL``, each cut at the page size, and the
  union (at most statuses x limit rows) sorted once;
* jobs: ``idx_jobs_name_created (name, created_at, id)`` with a name, else one range of
  ``idx_jobs_status_created (status, created_at, id)`` per wanted status, as for tasks.

Other filters are residual conditions on the chosen range. Column lists agree by position with
``sql.GET_TASK`` and ``sql.GET_JOB``, so the row mappers are shared; the
task listing reads NULL in place of ``payload``, ``result`` and ``progress``.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.numeric import Int8

from dtq.application.filters import JobFilter, JobKeyset, TaskFilter, TaskKeyset
from dtq.domain.status import JobStatus, TaskStatus

#: ``(expression on t, alias)`` in sql.GET_TASK's positions; the heavy JSON columns are NULL.
_TASK_LIGHT = (
    ("t.id", "id"),
    ("t.job_id", "job_id"),
    ("t.name", "name"),
    ("t.kind", "kind"),
    ("NULL::text", "payload"),
    ("t.status", "status"),
    ("t.scheduled_at", "scheduled_at"),
    ("t.created_at", "created_at"),
    ("t.updated_at", "updated_at"),
    ("t.priority", "priority"),
    ("t.max_attempts", "max_attempts"),
    ("t.attempt", "attempt"),
    ("t.reclaims", "reclaims"),
    ("t.started_at", "started_at"),
    ("t.finished_at", "finished_at"),
    ("t.last_error", "last_error"),
    ("t.current_run_id", "current_run_id"),
    ("t.version", "version"),
    ("NULL::text", "result"),
    ("t.job_position", "job_position"),
    ("NULL::text", "progress"),
    ("t.retry_policy::text", "retry_policy"),
    ("t.timeout_ms", "timeout_ms"),
)
_TASK_KEY = (("t.created_at", "created_at"), ("t.job_position", "job_position"), ("t.id", "id"))
_JOB_COLUMNS = (
    ("t.id", "id"),
    ("t.name", "name"),
    ("t.status", "status"),
    ("t.metadata::text", "metadata"),
    ("t.idempotency_key", "idempotency_key"),
    ("t.request_hash", "request_hash"),
    ("t.version", "version"),
    ("t.created_at", "created_at"),
    ("t.updated_at", "updated_at"),
    ("t.trace_context", "trace_context"),
    ("t.has_dependencies", "has_dependencies"),
    ("t.task_count", "task_count"),
)

_TASK_ORDER = ("created_at", "job_position", "id")
_JOB_ORDER = ("created_at", "id")

#: Tasks per status of one job: a scan of the job's range of idx_tasks_job_id (job_id, status).
COUNT_TASKS_BY_STATUS = "SELECT status, count(*) FROM tasks WHERE job_id = %s GROUP BY status"


class _Where:
    """Conditions and their parameters, in the order they appear in the text."""

    def __init__(self) -> None:
        self.conditions: list[str] = []
        self.params: list[Any] = []

    def add(self, condition: str, *params: Any) -> None:
        self.conditions.append(condition)
        self.params.extend(params)

    def window(self, since: Any, until: Any) -> None:
        if since is not None:
            self.add("t.created_at >= %s", since)
        if until is not None:
            self.add("t.created_at < %s", until)

    def text(self) -> str:
        return " AND ".join(self.conditions) if self.conditions else "TRUE"


def _desc(alias: str, columns: tuple[str, ...]) -> str:
    return ", ".join(f"{alias}.{c} DESC" for c in columns)


def _plain(
    table: str,
    *,
    columns: tuple[tuple[str, str], ...],
    where: _Where,
    order: tuple[str, ...],
    limit: int,
) -> tuple[str, list[Any]]:
    select = ", ".join(expr for expr, _ in columns)
    # Only this module's constant fragments are composed; every value is a bound parameter.
    query = (
        f"SELECT {select} FROM {table} AS t WHERE {where.text()}"  # noqa: S608
        f" ORDER BY {_desc('t', order)} LIMIT %s"
    )
    return query, [*where.params, Int8(limit)]


def _per_status(
    table: str,
    *,
    columns: tuple[tuple[str, str], ...],
    statuses: list[str],
    where: _Where,
    order: tuple[str, ...],
    limit: int,
) -> tuple[str, list[Any]]:
    inner = ", ".join(f"{expr} AS {alias}" for expr, alias in columns)
    outer = ", ".join(f"p.{alias}" for _, alias in columns)
    where.conditions.insert(0, "t.status = s.status")
    query = (
        f"SELECT {outer} FROM unnest(%b::text[]) AS s(status)"  # noqa: S608 (as in _plain)
        f" CROSS JOIN LATERAL (SELECT {inner} FROM {table} AS t WHERE {where.text()}"
        f" ORDER BY {_desc('t', order)} LIMIT %s) AS p"
        f" ORDER BY {_desc('p', order)} LIMIT %s"
    )
    return query, [statuses, *where.params, Int8(limit), Int8(limit)]


def task_page(
    where: TaskFilter, after: TaskKeyset | None, limit: int, *, keys_only: bool = False
) -> tuple[str, list[Any]]:
    """The statement and parameters of ``TaskRepository.list_page`` (``keys_only``: of
    ``matching_task_ids``, reading only ``created_at, job_position, id``)."""
    columns = _TASK_KEY if keys_only else _TASK_LIGHT
    w = _Where()
    statuses = sorted(s.value for s in where.statuses)
    if where.job_id is not None:
        w.add("t.job_id = %s", where.job_id)
        if after is not None:
            w.add("t.created_at <= %s", after[0])
            w.add("(t.job_position, t.id) < (%s::bigint, %s::uuid)", Int8(after[1]), after[2])
    elif after is not None:
        w.add(
            "(t.created_at, t.job_position, t.id) < (%s::timestamptz, %s::bigint, %s::uuid)",
            after[0],
            Int8(after[1]),
            after[2],
        )
    if where.kind is not None:
        w.add("t.kind = %s", where.kind)
    if where.priority is not None:
        w.add("t.priority = %s", where.priority)
    w.window(where.since, where.until)
    if where.job_id is not None or where.kind is not None:
        if statuses:
            w.add("t.status = ANY(%b::text[])", statuses)
        order = ("job_position", "id") if where.job_id is not None else _TASK_ORDER
        return _plain("tasks", columns=columns, where=w, order=order, limit=limit)
    every = [s.value for s in TaskStatus]
    return _per_status(
        "tasks",
        columns=columns,
        statuses=statuses or every,
        where=w,
        order=_TASK_ORDER,
        limit=limit,
    )


def job_page(where: JobFilter, after: JobKeyset | None, limit: int) -> tuple[str, list[Any]]:
    """The statement and parameters of ``JobRepository.list_page``."""
    w = _Where()
    statuses = sorted(s.value for s in where.statuses)
    if after is not None:
        w.add("(t.created_at, t.id) < (%s::timestamptz, %s::uuid)", after[0], after[1])
    w.window(where.since, where.until)
    if where.name is not None:
        w.add("t.name = %s", where.name)
        if statuses:
            w.add("t.status = ANY(%b::text[])", statuses)
        return _plain("jobs", columns=_JOB_COLUMNS, where=w, order=_JOB_ORDER, limit=limit)
    every = [s.value for s in JobStatus]
    return _per_status(
        "jobs",
        columns=_JOB_COLUMNS,
        statuses=statuses or every,
        where=w,
        order=_JOB_ORDER,
        limit=limit,
    )
