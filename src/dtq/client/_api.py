"""The orchestrator's routes (spec §7, issue 14, issue 15) as :class:`~dtq.client._calls.Call`
values; :class:`~dtq.client.Client` and :class:`~dtq.client.AsyncClient` send them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from dtq.client._calls import Call, idempotency_key, struct
from dtq.client.jobs import JobBuilder, go_duration, task_options
from dtq.entrypoints.api.schemas import (
    DeliveryLogBody,
    ExplainBody,
    JobBody,
    JobCancelResponse,
    JobListBody,
    JobResultsBody,
    SubmitJobResponse,
    SubmitTaskResponse,
    TaskCancelResponse,
    TaskDetailBody,
    TaskListBody,
    TaskRetryResponse,
    WebhookBody,
    WebhookList,
    WorkersBody,
)

_submit_task = struct(SubmitTaskResponse)
_submit_job = struct(SubmitJobResponse)
_task = struct(TaskDetailBody)
_job = struct(JobBody)
_results = struct(JobResultsBody)
_workers = struct(WorkersBody)
_explain = struct(ExplainBody)
_task_cancel = struct(TaskCancelResponse)
_job_cancel = struct(JobCancelResponse)
_task_retry = struct(TaskRetryResponse)
_task_list = struct(TaskListBody)
_job_list = struct(JobListBody)
_webhook = struct(WebhookBody)
_webhooks = struct(WebhookList)
_deliveries = struct(DeliveryLogBody)


def _nothing(_: bytes | None) -> None:
    return None


def submit_task(
    kind: str,
    payload: Any = None,
    *,
    priority: str | None = None,
    max_attempts: int | None = None,
    delay: str | timedelta | None = None,
    run_at: datetime | None = None,
    retry: Mapping[str, Any] | None = None,
    timeout: str | timedelta | None = None,
    idempotency_key_: str | None = None,
) -> Call[SubmitTaskResponse]:
    body: dict[str, Any] = {"kind": kind}
    if payload is not None:
        body["payload"] = payload
    body.update(
        task_options(
            priority=priority,
            max_attempts=max_attempts,
            delay=delay,
            run_at=run_at,
            retry=retry,
            timeout=timeout,
        )
    )
    return Call(
        "POST", "/v1/tasks", _submit_task, json=body, headers=idempotency_key(idempotency_key_)
    )


def submit_job(
    job: JobBuilder | Mapping[str, Any], *, idempotency_key_: str | None = None
) -> Call[SubmitJobResponse]:
    body = job.body() if isinstance(job, JobBuilder) else dict(job)
    return Call(
        "POST", "/v1/jobs", _submit_job, json=body, headers=idempotency_key(idempotency_key_)
    )


def get_task(task_id: UUID | str) -> Call[TaskDetailBody]:
    return Call("GET", f"/v1/tasks/{task_id}", _task)


def get_job(
    job_id: UUID | str, *, limit: int | None = None, cursor: str | None = None
) -> Call[JobBody]:
    return Call("GET", f"/v1/jobs/{job_id}", _job, params={"limit": limit, "cursor": cursor})


def results_page(
    job_id: UUID | str, *, limit: int | None = None, cursor: str | None = None
) -> Call[JobResultsBody]:
    return Call(
        "GET", f"/v1/jobs/{job_id}/results", _results, params={"limit": limit, "cursor": cursor}
    )


def workers(active_since: str | timedelta | None = None) -> Call[WorkersBody]:
    since = go_duration(active_since, "active_since") if active_since is not None else None
    return Call("GET", "/v1/workers", _workers, params={"active_since": since})


def explain(task_id: UUID | str) -> Call[ExplainBody]:
    return Call("GET", f"/v1/tasks/{task_id}/explain", _explain)


def cancel_task(task_id: UUID | str) -> Call[TaskCancelResponse]:
    # Idempotent on the server (a cancelled task answers 200 again): safe to re-send.
    return Call("POST", f"/v1/tasks/{task_id}/cancel", _task_cancel)


def cancel_job(job_id: UUID | str) -> Call[JobCancelResponse]:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", _job_cancel)


def retry_task(task_id: UUID | str) -> Call[TaskRetryResponse]:
    # Not idempotent: a re-sent retry whose first try was applied answers 409 not_retryable.
    return Call("POST", f"/v1/tasks/{task_id}/retry", _task_retry, safe_to_resend=False)


def list_tasks_page(
    *,
    status: str | Sequence[str] | None = None,
    kind: str | None = None,
    job_id: UUID | str | None = None,
    priority: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[TaskListBody]:
    params = {
        "status": [status] if isinstance(status, str) else status,
        "kind": kind,
        "job_id": job_id,
        "priority": priority,
        "since": since,
        "until": until,
        "limit": limit,
        "cursor": cursor,
    }
    return Call("GET", "/v1/tasks", _task_list, params=params)


def list_jobs_page(
    *,
    status: str | Sequence[str] | None = None,
    name: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[JobListBody]:
    params = {
        "status": [status] if isinstance(status, str) else status,
        "name": name,
        "since": since,
        "until": until,
        "limit": limit,
        "cursor": cursor,
    }
    return Call("GET", "/v1/jobs", _job_list, params=params)


def create_webhook(url: str, events: Sequence[str], secret: str) -> Call[WebhookBody]:
    # Not idempotent: a re-sent create whose first try was applied makes a second webhook.
    body = {"url": url, "events": list(events), "secret": secret}
    return Call("POST", "/v1/webhooks", _webhook, json=body, safe_to_resend=False)


def list_webhooks() -> Call[WebhookList]:
    return Call("GET", "/v1/webhooks", _webhooks)


def delete_webhook(webhook_id: UUID | str) -> Call[None]:
    # Safe to re-send: a webhook deleted by the first try answers 404 to the second.
    return Call("DELETE", f"/v1/webhooks/{webhook_id}", _nothing)


def webhook_deliveries(webhook_id: UUID | str) -> Call[DeliveryLogBody]:
    return Call("GET", f"/v1/webhooks/{webhook_id}/deliveries", _deliveries)
