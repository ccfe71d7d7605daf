"""Request bodies -> application commands (spec §7): the API's limits and the idempotency hash.

A body reaching these functions has passed :mod:`dtq.entrypoints.api.guards` (types, ranges,
identifier patterns). What is left for the API to check are its own limits from the settings:
``api_max_tasks_per_job`` and ``api_max_payload_bytes``. Storability of payloads and metadata
(NUL characters, int64 range, nesting) and the dependency graph are the submit service's rules,
checked there once for every caller.

Errors name fields in the job's notation (``tasks[0].payload``) for both routes; the error
handler shows them without the ``tasks[0].`` prefix on ``POST /v1/tasks``, whose body has no
``tasks`` list.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import msgspec

from dtq.application.commands import SubmitJob, TaskSpec
from dtq.domain.errors import InvalidMetadata, InvalidPayload, ValidationError
from dtq.entrypoints.api.schemas import (
    RetryRequest,
    SubmitJobRequest,
    SubmitTaskRequest,
    TaskSpecRequest,
)
from dtq.entrypoints.api.timing import parse_delay, parse_retry, parse_run_at, parse_timeout
from dtq.entrypoints.config import Settings

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


def _check_size(value: object, *, field: str, settings: Settings) -> None:
    size = len(_encoder.encode(value))
    if size > settings.api_max_payload_bytes:
        metadata = field == "metadata"
        raise (InvalidMetadata if metadata else InvalidPayload)(
            f"{'metadata' if metadata else 'payload'} is {size} bytes encoded; the limit is"
            f" {settings.api_max_payload_bytes} (API_MAX_PAYLOAD_BYTES)",
            field=field,
        )


def _task_spec(
    task: TaskSpecRequest | SubmitTaskRequest, index: int, settings: Settings
) -> TaskSpec:
    _check_size(task.payload, field=f"tasks[{index}].payload", settings=settings)
    depends_on: tuple[str, ...] = ()
    if isinstance(task, SubmitTaskRequest):
        name = task.kind
    else:
        name, depends_on = task.name, tuple(task.depends_on)
    run_at, delay = _timing(task, index)
    return TaskSpec(
        name=name,
        kind=task.kind,
        payload=task.payload,
        depends_on=depends_on,
        max_attempts=task.max_attempts,
        priority=task.priority,
        run_at=run_at,
        delay=delay,
        retry_policy=(
            parse_retry(task.retry, field=f"tasks[{index}].retry")
            if isinstance(task.retry, RetryRequest)
            else None
        ),
        timeout=(
            parse_timeout(task.timeout, field=f"tasks[{index}].timeout")
            if isinstance(task.timeout, str)
            else None
        ),
    )


def _timing(
    task: TaskSpecRequest | SubmitTaskRequest, index: int
) -> tuple[datetime | None, timedelta | None]:
    """``run_at`` / ``delay`` of one task (issue 14 item 2): at most one, each parsed."""
    prefix = f"tasks[{index}]"
    run_at = task.run_at if isinstance(task.run_at, str) else None
    delay = task.delay if isinstance(task.delay, str) else None
    if run_at is not None and delay is not None:
        raise ValidationError("give run_at or delay, not both", field=f"{prefix}.delay")
    return (
        None if run_at is None else parse_run_at(run_at, field=f"{prefix}.run_at"),
        None if delay is None else parse_delay(delay, field=f"{prefix}.delay"),
    )


def submit_task(
    body: SubmitTaskRequest,
    *,
    idempotency_key: str | None,
    settings: Settings,
    trace_context: str | None = None,
) -> SubmitJob:
    """The one-task job of ``POST /v1/tasks``: job and task are both named after the kind.

    Raises:
        InvalidPayload: the encoded payload exceeds ``api_max_payload_bytes``
            (field ``tasks[0].payload``, shown as ``payload``).
    """
    return SubmitJob(
        tasks=(_task_spec(body, 0, settings),),
        name=body.kind,
        idempotency_key=idempotency_key,
        request_hash=request_hash("/v1/tasks", body) if idempotency_key is not None else None,
        trace_context=trace_context,
    )


def submit_job(
    body: SubmitJobRequest,
    *,
    idempotency_key: str | None,
    settings: Settings,
    trace_context: str | None = None,
) -> SubmitJob:
    """The command of ``POST /v1/jobs``.

    Raises:
        ValidationError: more than ``api_max_tasks_per_job`` tasks (field ``tasks``).
        InvalidPayload: an encoded payload exceeds ``api_max_payload_bytes`` (field
            ``tasks[i].payload``).
        InvalidMetadata: the encoded metadata does (field ``metadata``).
    """
    if len(body.tasks) > settings.api_max_tasks_per_job:
        raise ValidationError(
            f"a job has at most {settings.api_max_tasks_per_job} tasks (API_MAX_TASKS_PER_JOB),"
            f" got {len(body.tasks)}",
            field="tasks",
        )
    _check_size(body.metadata, field="metadata", settings=settings)
    return SubmitJob(
        tasks=tuple(_task_spec(task, i, settings) for i, task in enumerate(body.tasks)),
        name=body.name,
        metadata=body.metadata,
        idempotency_key=idempotency_key,
        request_hash=request_hash("/v1/jobs", body) if idempotency_key is not None else None,
        trace_context=trace_context,
    )
