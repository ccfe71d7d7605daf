"""The blocking client: :class:`Client` (issue 15 item 4)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar
from uuid import UUID

import httpx

from dtq.client import _api
from dtq.client._calls import (
    RETRY_STATUSES,
    Call,
    P,
    _Pages,
    encode_body,
    finished,
    outcome,
    retry_wait,
)
from dtq.client._calls import pages as _pages
from dtq.client.config import ClientConfig
from dtq.client.errors import TransportError, WaitTimeout
from dtq.client.jobs import JobBuilder
from dtq.entrypoints.api.schemas import (
    DeliveryLogBody,
    ExplainBody,
    JobBody,
    JobCancelResponse,
    JobSummaryBody,
    SubmitJobResponse,
    SubmitTaskResponse,
    TaskCancelResponse,
    TaskDetailBody,
    TaskResultBody,
    TaskRetryResponse,
    TaskSummaryBody,
    WebhookBody,
    WorkersBody,
)

T = TypeVar("T")

__all__ = ["Client"]


class Client:
    """A blocking client of one orchestrator.

    Args:
        url: the orchestrator's base URL; default ``DTQ_URL``, else ``http://127.0.0.1:8080``.
        token: the API token sent as ``Authorization: Bearer``; default ``DTQ_TOKEN``, else none.
        timeout: seconds per HTTP request (connect, read, write each).
        retries: how many times a call is re-sent after a 429/503 (honouring ``Retry-After``)
            or, for calls that are safe to re-send, after the server could not be reached.
        transport: an httpx transport to use instead of the network (tests, ASGI apps).

    Raises (from every call): an :class:`~dtq.client.errors.ApiError` subclass for an error
    answer, :class:`~dtq.client.errors.TransportError` when the server stayed unreachable.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = ClientConfig.resolve(url, token, retries)
        self._http = httpx.Client(
            base_url=self.config.url,
            headers=self.config.headers(),
            timeout=timeout,
            transport=transport,
        )
        self._sleep = sleep

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        """Send ``call``, re-sending per the retry rules above; its decoded answer."""
        attempt = 0
        content = encode_body(call.json)
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    params=call.query(),
                    content=content,
                    headers=call.headers,
                )
            except httpx.TransportError as exc:
                if not call.safe_to_resend or attempt > self.config.retries:
                    raise TransportError(f"{call.method} {call.path}: {exc}") from exc
                self._sleep(retry_wait(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and attempt <= self.config.retries:
                self._sleep(retry_wait(attempt, response.headers.get("Retry-After")))
                continue
            return outcome(call, response.status_code, response.content)

    def _follow(self, pages: _Pages[P]) -> Iterator[P]:
        """Send each page's call, the next built from the previous page's ``next_cursor``."""
        cursor: str | None = None
        while True:
            page = self.send(pages.call(cursor))
            yield page
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    # -- submit ---------------------------------------------------------------------------------

    def submit_task(
        self,
        kind: str,
        payload: Any = None,
        *,
        priority: str | None = None,
        max_attempts: int | None = None,
        delay: str | timedelta | None = None,
        run_at: datetime | None = None,
        retry: Mapping[str, Any] | None = None,
        timeout: str | timedelta | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitTaskResponse:
        """``POST /v1/tasks``: submit one task (a one-task job). An ``Idempotency-Key`` is sent
        always (``idempotency_key``, or a fresh one), so a re-sent submit creates nothing new."""
        return self.send(
            _api.submit_task(
                kind,
                payload,
                priority=priority,
                max_attempts=max_attempts,
                delay=delay,
                run_at=run_at,
                retry=retry,
                timeout=timeout,
                idempotency_key_=idempotency_key,
            )
        )

    def submit_job(
        self, job: JobBuilder | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> SubmitJobResponse:
        """``POST /v1/jobs``: submit a DAG (a :class:`~dtq.client.JobBuilder` or the request
        body as a mapping); task name -> id in the answer."""
        return self.send(_api.submit_job(job, idempotency_key_=idempotency_key))

    # -- control and listing (issue 14) ---------------------------------------------------------

    def cancel_task(self, task_id: UUID | str) -> TaskCancelResponse:
        """``POST /v1/tasks/{id}/cancel``: cancel the task and its pending dependents (a running
        one stops at its worker's next lease heartbeat); cancelling it again answers the same.

        Raises:
            NotCancellable: the task already completed or failed.
        """
        return self.send(_api.cancel_task(task_id))

    def cancel_job(self, job_id: UUID | str) -> JobCancelResponse:
        """``POST /v1/jobs/{id}/cancel``: cancel every unfinished task of the job."""
        return self.send(_api.cancel_job(job_id))

    def retry_task(self, task_id: UUID | str) -> TaskRetryResponse:
        """``POST /v1/tasks/{id}/retry``: a failed or cancelled task runs again with a fresh
        attempt budget; its cascade-ended dependents are reopened. Never re-sent after a lost
        answer (a second retry would be refused).

        Raises:
            NotRetryable: the task is not failed or cancelled.
        """
        return self.send(_api.retry_task(task_id))

    def explain(self, task_id: UUID | str) -> ExplainBody:
        """``GET /v1/tasks/{id}/explain``: why the task is (not) running."""
        return self.send(_api.explain(task_id))

    def list_tasks(
        self,
        *,
        status: str | Sequence[str] | None = None,
        kind: str | None = None,
        job_id: UUID | str | None = None,
        priority: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int = 100,
    ) -> Iterator[TaskSummaryBody]:
        """``GET /v1/tasks``: every matching task, newest first, fetched a page at a time."""
        pages = _pages(
            lambda cursor: _api.list_tasks_page(
                status=status,
                kind=kind,
                job_id=job_id,
                priority=priority,
                since=since,
                until=until,
                limit=page_size,
                cursor=cursor,
            )
        )
        for page in self._follow(pages):
            yield from page.tasks

    def list_jobs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        name: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int = 100,
    ) -> Iterator[JobSummaryBody]:
        """``GET /v1/jobs``: every matching job, newest first, fetched a page at a time."""
        pages = _pages(
            lambda cursor: _api.list_jobs_page(
                status=status, name=name, since=since, until=until, limit=page_size, cursor=cursor
            )
        )
        for page in self._follow(pages):
            yield from page.jobs

    # -- webhooks (issue 16 item 2) -------------------------------------------------------------

    def create_webhook(self, url: str, events: Sequence[str], secret: str) -> WebhookBody:
        """``POST /v1/webhooks`` (``admin`` scope): deliver the ``events`` types (``job.completed``,
        ``task.failed``, …) committed from now on to ``url``, signed with ``secret`` (16..256
        characters, never shown again). Not re-sent after a lost answer (it would make a second
        webhook).

        Raises:
            BadRequest: a bad ``url``, ``events`` or ``secret`` (its ``field`` names which).
        """
        return self.send(_api.create_webhook(url, events, secret))

    def list_webhooks(self) -> list[WebhookBody]:
        """``GET /v1/webhooks``: every webhook, oldest first (never a secret)."""
        return (self.send(_api.list_webhooks())).webhooks

    def delete_webhook(self, webhook_id: UUID | str) -> None:
        """``DELETE /v1/webhooks/{id}`` (``admin`` scope): no delivery starts after it.

        Raises:
            NotFound: no such webhook.
        """
        self.send(_api.delete_webhook(webhook_id))

    def webhook_deliveries(self, webhook_id: UUID | str) -> DeliveryLogBody:
        """``GET /v1/webhooks/{id}/deliveries``: the delivery log (cursor, count delivered,
        failures in a row, last status and error, next try).

        Raises:
            NotFound: no such webhook.
        """
        return self.send(_api.webhook_deliveries(webhook_id))

    # -- read -----------------------------------------------------------------------------------

    def get_task(self, task_id: UUID | str) -> TaskDetailBody:
        """``GET /v1/tasks/{id}``: the task with its runs."""
        return self.send(_api.get_task(task_id))

    def get_job(
        self, job_id: UUID | str, *, limit: int | None = None, cursor: str | None = None
    ) -> JobBody:
        """``GET /v1/jobs/{id}``: the job with its task counts and all its tasks, or with
        ``limit`` (1..500) one page of them in submission order (``next_cursor`` for the next)."""
        return self.send(_api.get_job(job_id, limit=limit, cursor=cursor))

    def iter_results(self, job_id: UUID | str, *, page_size: int = 500) -> Iterator[TaskResultBody]:
        """Every task result of the job in submission order, fetched a page at a time."""
        pages = _pages(lambda cursor: _api.results_page(job_id, limit=page_size, cursor=cursor))
        for page in self._follow(pages):
            yield from page.results

    def results(self, job_id: UUID | str) -> dict[str, Any]:
        """The job's results as task name -> result (None for a task not completed)."""
        return {r.name: r.result for r in self.iter_results(job_id)}

    def workers(self, active_since: str | timedelta | None = None) -> WorkersBody:
        """``GET /v1/workers``: workers whose registry heartbeat is that recent."""
        return self.send(_api.workers(active_since))

    def wait(self, job_id: UUID | str, timeout: float, *, poll: float = 0.25) -> JobBody:
        """Block until the job is terminal (completed, failed or cancelled) and none of its tasks
        is unfinished (a job turns failed at its first failure while others may still run);
        return it (with its counts and its first task; ``get_job`` for all of them).

        Polls ``GET /v1/jobs/{id}?limit=1``, every ``poll`` seconds at first, backing off to 2 s.

        Raises:
            WaitTimeout: the job was not terminal within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        interval = poll
        while True:
            job = self.get_job(job_id, limit=1)
            if finished(job):
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(str(job_id), str(job.status), timeout)
            self._sleep(min(interval, left))
            interval = min(interval * 1.5, 2.0)
