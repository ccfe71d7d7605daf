"""Translation between HTTP bodies and application commands/views (spec §7).

The handlers stay a few lines long because everything that is neither decoding (Litestar +
:mod:`dtq.entrypoints.api.schemas`) nor business rules (the services) lives here: the request
hash behind ``Idempotency-Key``, the size limits of the settings, path and query parsing, and
the mapping of domain entities to response bodies. Every function that rejects input raises a
domain :class:`~dtq.domain.errors.ValidationError` naming the field, which the error table in
:mod:`dtq.entrypoints.api.errors` turns into a 400.
"""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

import msgspec
from litestar import Request
from litestar.exceptions import ValidationException

from dtq.application.commands import JobView, SubmitJob, SubmitResult, TaskSpec, TaskView
from dtq.domain.entities import Task, TaskRun, Worker
from dtq.domain.errors import InvalidPayload, ValidationError
from dtq.domain.payload import check_storable
from dtq.entrypoints.api.errors import UnsupportedMediaType
from dtq.entrypoints.api.schemas import (
    HealthBody,
    JobBody,
    RunBody,
    SubmitJobRequest,
    SubmitTaskRequest,
    TaskBody,
    TaskDetailBody,
    TaskSpecRequest,
    WorkerBody,
    WorkersBody,
)
from dtq.entrypoints.config import ConfigError, Settings, parse_duration
from dtq.entrypoints.metrics import OrchestratorMetrics


def require_json_content_type(request: Request[Any, Any, Any]) -> None:
    """Refuse a submission whose ``Content-Type`` is not ``application/json`` (or
    ``application/<subtype>+json``); a charset parameter is ignored (JSON is UTF-8).

    Litestar decodes a JSON body whatever its declared type. Requiring the JSON media type
    means a web page on another origin cannot make a visitor's browser submit tasks with a
    plain form, ``text/plain`` or a typeless request (those need no CORS preflight). Runs as
    the submission routes' ``before_request`` hook (:func:`json_only`), before the body is
    decoded, so a form body is a 415 too, not a JSON decode error.

    Raises:
        UnsupportedMediaType: another or no media type (HTTP 415, ``unsupported_media_type``).
    """
    media_type = request.content_type[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    if media_type == "application/json" or (
        kind == "application" and subtype.endswith("+json") and len(subtype) > len("+json")
    ):
        return
    shown = media_type or "missing"
    raise UnsupportedMediaType(detail=f"Content-Type must be application/json, not {shown}")


async def json_only(request: Request[Any, Any, Any]) -> None:
    """``before_request`` hook of the submission routes: :func:`require_json_content_type`."""
    require_json_content_type(request)


async def require_strict_types(request: Request[Any, Any, Any], model: type[Any]) -> None:
    """Re-check a decoded body in msgspec's strict mode.

    Litestar converts request bodies in msgspec's lax mode, which accepts ``"3"`` and ``3.0``
    for an ``int`` field; the API documents (and ``/schema`` shows) integers, so such a body is
    refused here with the same 400 naming the field as any other wrong type. The body is the
    parsed JSON Litestar already cached; nothing is decoded twice from bytes.

    Args:
        request: the request whose JSON body Litestar has already decoded.
        model: the request Struct, e.g. ``SubmitTaskRequest``.

    Raises:
        ValidationException: some value has the wrong JSON type (HTTP 400, field named).
    """
    try:
        msgspec.convert(await request.json(), type=model, strict=True)
    except msgspec.ValidationError as exc:
        raise ValidationException(detail=str(exc)) from exc


#: ``GET /v1/workers`` window when ``active_since`` is absent (spec §7).
DEFAULT_ACTIVE_SINCE = "2m"

_encoder = msgspec.json.Encoder(order="sorted")


def request_hash(route: str, body: msgspec.Struct) -> str:
    """Fingerprint a decoded request for ``Idempotency-Key`` comparison.

    The decoded Struct is re-encoded with sorted keys (defaults filled in), so two bodies that
    mean the same thing (key order, whitespace, an explicit default) hash the same, while the
    same body sent to another route does not.

    Args:
        route: the route template, e.g. ``/v1/jobs``.
        body: the decoded request Struct.

    Returns:
        Lowercase hex SHA-256.
    """
    digest = hashlib.sha256(route.encode())
    digest.update(b"\n")
    digest.update(_encoder.encode(body))
    return digest.hexdigest()


def _check_payload_size(payload: object, *, field: str, settings: Settings) -> None:
    size = len(_encoder.encode(payload))
    if size > settings.api_max_payload_bytes:
        raise InvalidPayload(
            f"payload is {size} bytes encoded; the limit is {settings.api_max_payload_bytes}",
            field=field,
        )


def _task_spec(task: TaskSpecRequest, index: int, settings: Settings) -> TaskSpec:
    _check_payload_size(task.payload, field=f"tasks[{index}].payload", settings=settings)
    return TaskSpec(
        name=task.name,
        kind=task.kind,
        payload=task.payload,
        depends_on=tuple(task.depends_on),
        max_attempts=task.max_attempts,
        priority=task.priority,
    )


def submit_task_command(
    body: SubmitTaskRequest, *, idempotency_key: str | None, settings: Settings
) -> SubmitJob:
    """Build the one-task job of ``POST /v1/tasks``: job and task are both named after the kind.

    The payload is checked here (rather than only by the submit service, which would name it
    ``tasks[0].payload``) so errors name the field of *this* body: ``payload``.

    Raises:
        InvalidPayload: a NUL character, an integer beyond int64, nesting deeper than 64 or
            an encoded size above ``api_max_payload_bytes`` (field ``payload...``).
    """
    check_storable(body.payload, field="payload")
    _check_payload_size(body.payload, field="payload", settings=settings)
    spec = TaskSpec(
        name=body.kind,
        kind=body.kind,
        payload=body.payload,
        max_attempts=body.max_attempts,
        priority=body.priority,
    )
    return SubmitJob(
        tasks=(spec,),
        name=body.kind,
        idempotency_key=idempotency_key,
        request_hash=request_hash("/v1/tasks", body) if idempotency_key is not None else None,
    )


def submit_job_command(
    body: SubmitJobRequest, *, idempotency_key: str | None, settings: Settings
) -> SubmitJob:
    """Build the command of ``POST /v1/jobs``.

    NUL characters, out-of-range integers and deep nesting in payloads and metadata, and the
    dependency graph, are checked by the submit service (``check_storable``, ``validate_dag``),
    which names ``tasks[i].payload...`` / ``metadata...`` / the tasks concerned.

    Raises:
        ValidationError: more than ``api_max_tasks_per_job`` tasks (field ``tasks``).
        InvalidPayload: an encoded payload exceeds ``api_max_payload_bytes`` (field
            ``tasks[i].payload``) or the metadata does (field ``metadata``).
    """
    if len(body.tasks) > settings.api_max_tasks_per_job:
        raise ValidationError(
            f"a job has at most {settings.api_max_tasks_per_job} tasks, got {len(body.tasks)}",
            field="tasks",
        )
    _check_payload_size(body.metadata, field="metadata", settings=settings)
    return SubmitJob(
        tasks=tuple(_task_spec(task, i, settings) for i, task in enumerate(body.tasks)),
        name=body.name,
        metadata=body.metadata,
        idempotency_key=idempotency_key,
        request_hash=request_hash("/v1/jobs", body) if idempotency_key is not None else None,
    )


def count_submission(metrics: OrchestratorMetrics, result: SubmitResult) -> None:
    """Count a created job and its tasks; an idempotent replay created nothing (spec §9)."""
    if result.created:
        metrics.jobs_submitted.inc()
        metrics.tasks_submitted.inc(len(result.task_ids))


def parse_id(value: str) -> UUID:
    """Parse the ``{id}`` path parameter.

    Raises:
        ValidationError: not a UUID (field ``id``), spec §7: 400 if id is not a UUID.
    """
    try:
        return UUID(value)
    except ValueError:
        raise ValidationError(f"{value!r} is not a UUID", field="id") from None


def parse_active_since(value: str) -> float:
    """Parse ``?active_since=``: a Go ``time.ParseDuration`` string such as ``90s``, ``5m``,
    ``1h30m`` (units ns, us, ms, s, m, h; the grammar of the configuration variables).

    Returns:
        The window in seconds.

    Raises:
        ValidationError: not a Go duration, or not positive (field ``active_since``).
    """
    try:
        seconds = parse_duration(value, variable="active_since")
    except ConfigError:
        raise ValidationError(
            f"{value!r} is not a duration (use e.g. 30s, 5m, 1h30m)", field="active_since"
        ) from None
    if not seconds > 0:
        raise ValidationError(
            f"active_since must be a positive duration, got {value!r}", field="active_since"
        )
    return seconds


def task_body(task: Task) -> TaskBody:
    """The response body of a task without its runs."""
    return TaskBody(**_task_fields(task))


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


def job_body(view: JobView) -> JobBody:
    """The response body of ``GET /v1/jobs/{id}``: the job and all its tasks."""
    job = view.job
    return JobBody(
        id=job.id,
        name=job.name,
        status=job.status,
        metadata=job.metadata,
        created_at=job.created_at,
        updated_at=job.updated_at,
        tasks=[task_body(task) for task in view.tasks],
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
