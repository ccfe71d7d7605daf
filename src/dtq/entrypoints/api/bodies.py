"""Domain entities and views -> response Structs (spec §7).

Pure mapping, no checks: every function takes what a service returned and builds the body a
route sends. Times stay ``datetime`` (RFC 3339 UTC on the wire).
"""

from __future__ import annotations

from typing import Any

import msgspec

from dtq.application.commands import (
    JobPage,
    JobResultsView,
    JobView,
    SubmitResult,
    TaskPage,
    TaskView,
)
from dtq.application.explain import Explanation
from dtq.application.fleet import SubmitWarning
from dtq.domain.entities import Task, TaskRun, Worker
from dtq.domain.policy import RetryPolicy
from dtq.entrypoints.api.schemas import (
    ExplainBody,
    HealthBody,
    JobBody,
    JobListBody,
    JobResultsBody,
    JobSummaryBody,
    RetryBody,
    RunBody,
    SubmitJobResponse,
    SubmitTaskResponse,
    SubmitWarningBody,
    SubmitWarnings,
    TaskBody,
    TaskDetailBody,
    TaskListBody,
    TaskResultBody,
    TaskSummaryBody,
    WorkerBody,
    WorkersBody,
)
from dtq.entrypoints.api.timing import format_duration


def _warnings(warnings: list[SubmitWarning]) -> SubmitWarnings:
    if not warnings:
        return msgspec.UNSET
    return [SubmitWarningBody(code=w.code.value, task=w.task, message=w.message) for w in warnings]


def submitted_task(
    result: SubmitResult, kind: str, warnings: list[SubmitWarning] | None = None
) -> SubmitTaskResponse:
    """The body of ``POST /v1/tasks``: the ids of the task (named after ``kind``) and its job,
    and the ``warnings`` when there are any."""
    return SubmitTaskResponse(
        task_id=result.task_ids[kind], job_id=result.job_id, warnings=_warnings(warnings or [])
    )


def submitted_job(
    result: SubmitResult, warnings: list[SubmitWarning] | None = None
) -> SubmitJobResponse:
    """The body of ``POST /v1/jobs``: the job id, a task name -> id map, and the ``warnings``
    when there are any."""
    return SubmitJobResponse(
        job_id=result.job_id, tasks=result.task_ids, warnings=_warnings(warnings or [])
    )


def explain_body(explanation: Explanation) -> ExplainBody:
    """The body of ``GET /v1/tasks/{id}/explain``."""
    return ExplainBody(
        task_id=explanation.task_id,
        status=explanation.status,
        reason=explanation.reason.value,
        message=explanation.message,
        details=explanation.details,
    )


def task_body(task: Task) -> TaskBody:
    """The response body of a task without its runs."""
    return TaskBody(**_task_fields(task))


def _retry_body(policy: RetryPolicy | None) -> RetryBody | None:
    if policy is None:
        return None
    return RetryBody(
        backoff=policy.backoff,
        delay=None if policy.delay is None else format_duration(policy.delay),
        max_delay=None if policy.max_delay is None else format_duration(policy.max_delay),
        jitter=policy.jitter,
    )


def _task_fields(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "job_id": task.job_id,
        "name": task.name,
        "kind": task.kind,
        "status": task.status,
        "priority": task.priority,
        "payload": task.payload,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "scheduled_at": task.scheduled_at,
        "started_at": task.started_at,
        "finished_at": task.finished_at,
        "last_error": task.last_error,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "result": task.result,
        "retry": _retry_body(task.retry_policy),
        "timeout": None if task.timeout is None else format_duration(task.timeout),
        "progress": task.progress,
    }


def _run_body(run: TaskRun) -> RunBody:
    return RunBody(
        id=run.id,
        attempt_number=run.attempt_number,
        worker_id=run.worker_id,
        status=run.status,
        error=run.error,
        started_at=run.started_at,
        finished_at=run.finished_at,
    )


def task_detail_body(view: TaskView) -> TaskDetailBody:
    """The response body of ``GET /v1/tasks/{id}``: the task and its runs by ``started_at``."""
    runs = sorted(view.runs, key=lambda run: run.started_at)
    return TaskDetailBody(**_task_fields(view.task), runs=[_run_body(run) for run in runs])


def job_body(view: JobView, next_cursor: str | None = None) -> JobBody:
    """The response body of ``GET /v1/jobs/{id}``: the job, its tasks (all, or one page whose
    successor is ``next_cursor``) and its task counts per status."""
    job = view.job
    return JobBody(
        id=job.id,
        name=job.name,
        status=job.status,
        metadata=job.metadata,
        created_at=job.created_at,
        updated_at=job.updated_at,
        tasks=[task_body(task) for task in view.tasks],
        counts={status.value: count for status, count in view.counts.items()},
        next_cursor=next_cursor,
    )


_HEAVY = ("payload", "result", "progress")


def task_list_body(page: TaskPage, next_cursor: str | None) -> TaskListBody:
    """The response body of ``GET /v1/tasks``: the page's tasks without their heavy fields."""
    items = []
    for task in page.tasks:
        fields = _task_fields(task)
        for name in _HEAVY:
            del fields[name]
        items.append(TaskSummaryBody(**fields))
    return TaskListBody(tasks=items, next_cursor=next_cursor)


def job_list_body(page: JobPage, next_cursor: str | None) -> JobListBody:
    """The response body of ``GET /v1/jobs``: the page's jobs without their tasks."""
    return JobListBody(
        jobs=[
            JobSummaryBody(
                id=job.id,
                name=job.name,
                status=job.status,
                metadata=job.metadata,
                created_at=job.created_at,
                updated_at=job.updated_at,
            )
            for job in page.jobs
        ],
        next_cursor=next_cursor,
    )


def job_results_body(view: JobResultsView, next_cursor: str | None) -> JobResultsBody:
    """The response body of ``GET /v1/jobs/{id}/results``: one page, in submission order."""
    return JobResultsBody(
        job_id=view.job.id,
        status=view.job.status,
        results=[
            TaskResultBody(name=t.name, task_id=t.id, status=t.status, result=t.result)
            for t in view.tasks
        ],
        next_cursor=next_cursor,
    )


def workers_body(workers: list[Worker]) -> WorkersBody:
    """The response body of ``GET /v1/workers``."""
    return WorkersBody(
        workers=[
            WorkerBody(
                id=w.id,
                hostname=w.hostname,
                last_heartbeat_at=w.last_heartbeat_at,
                metadata=w.metadata,
                redis_key_prefix=w.redis_key_prefix,
            )
            for w in workers
        ]
    )


def health_body(checks: dict[str, str | None]) -> tuple[HealthBody, int]:
    """The body and status of ``GET /healthz`` from ``HealthService.check()``.

    Returns:
        ``(body, 200)`` when every check is None (healthy), else ``(body, 503)`` with the
        failing checks carrying their error text.
    """
    healthy = all(error is None for error in checks.values())
    body = HealthBody(
        status="ok" if healthy else "unavailable",
        checks={name: "ok" if error is None else error for name, error in checks.items()},
    )
    return body, 200 if healthy else 503
