"""HTTP request metrics and the request-body guard (spec §9: ``orchestrator_*``).

:class:`HttpMetricsMiddleware` is a plain ASGI wrapper placed *outside* Litestar's router and
its outer exception handler (see :func:`install_http_metrics`). Litestar runs middleware
registered with ``middleware=[...]`` only for requests that matched a route, so a 404 for an
unknown path or a 405 would go uncounted there; wrapping the whole handler sees every request
and the final status that was actually sent, including error responses.

The ``route`` label is the matched route template (``/v1/tasks/{id}``), which Litestar's
router writes into the ASGI scope; requests that matched no route are labelled
:data:`UNMATCHED`, never with their raw path, so label cardinality stays bounded.

:class:`BodyGuard` wraps the ``receive`` channel inside it: a request body must arrive in full
within ``body_timeout`` seconds of the request's start (HTTP 408 ``request_timeout`` after
that), and a client that hangs up before its body is complete is answered
:class:`~dtq.entrypoints.api.errors.ClientClosedRequest`, counted under status
:data:`CLIENT_CLOSED` and logged as a client event, not as a server error.

:class:`CountingSubmit` counts submitted jobs and tasks (``orchestrator_jobs_submitted_total``,
``orchestrator_tasks_submitted_total``) around the submit service, so handlers do not.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from litestar.enums import ScopeType

from dtq.application.commands import SubmitJob, SubmitResult
from dtq.application.submit import SubmitService
from dtq.entrypoints.api.errors import CLIENT_CLOSED, ClientClosedRequest, RequestTimeout
from dtq.entrypoints.metrics import OrchestratorMetrics

if TYPE_CHECKING:
    from litestar import Litestar
    from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

#: ``route`` label of requests that matched no route (unknown path, or a method not allowed).
UNMATCHED = "unmatched"

#: Seconds a request body may take to arrive in full, counted from the request's start.
BODY_TIMEOUT = 30.0

__all__ = [
    "BODY_TIMEOUT",
    "CLIENT_CLOSED",
    "UNMATCHED",
    "BodyGuard",
    "CountingSubmit",
    "HttpMetricsMiddleware",
    "install_middleware",
]


class HttpMetricsMiddleware:
    """Count and time every HTTP request by method, route template and status.

    Args:
        app: the ASGI app to wrap.
        metrics: where ``http_requests`` and ``http_duration`` are recorded.
    """

    def __init__(self, app: ASGIApp, metrics: OrchestratorMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request and record it once the response has been handed off.

        A request whose app raised without sending a response start is recorded as 500.
        """
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        method = scope["method"]
        status = 500
        started = time.perf_counter()

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, send_with_status)
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("path_template") or UNMATCHED
            self._metrics.http_requests.labels(method, route, str(status)).inc()
            self._metrics.http_duration.labels(method, route).observe(elapsed)


class BodyGuard:
    """Bound the time a request body may take, and turn a mid-body hang-up into a client event.

    Args:
        app: the ASGI app to wrap.
        body_timeout: seconds from the request's start until its body must be complete.
    """

    def __init__(self, app: ASGIApp, body_timeout: float) -> None:
        self._app = app
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request with a ``receive`` that raises instead of waiting forever.

        Raises (into the app, whose error handler answers them):
            RequestTimeout: the body is still incomplete at the deadline (HTTP 408).
            ClientClosedRequest: the client disconnected before its body was complete.
        """
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._body_timeout
        body_complete = False

        async def guarded_receive() -> ReceiveMessage:
            nonlocal body_complete
            if body_complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    detail=f"the request body did not arrive within {self._body_timeout:g} s",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] == "http.disconnect":
                raise ClientClosedRequest(
                    detail="the client closed the connection before its request body was complete"
                )
            if not message.get("more_body", False):
                body_complete = True
            return message

        await self._app(scope, guarded_receive, send)


class CountingSubmit:
    """The submit service as the API uses it: counts what each submission created (spec §9).

    Args:
        service: the application's submit service.
        metrics: where ``jobs_submitted`` and ``tasks_submitted`` are counted.
    """

    def __init__(self, service: SubmitService, metrics: OrchestratorMetrics) -> None:
        self._service = service
        self._metrics = metrics

    async def submit_job(self, cmd: SubmitJob) -> SubmitResult:
        """:meth:`SubmitService.submit_job`; an idempotent replay created nothing and counts 0."""
        result = await self._service.submit_job(cmd)
        if result.created:
            self._metrics.jobs_submitted.inc()
            self._metrics.tasks_submitted.inc(len(result.task_ids))
        return result


def install_middleware(app: Litestar, metrics: OrchestratorMetrics, body_timeout: float) -> None:
    """Wrap ``app``'s request handler (router + exception handling) in the body guard, and that
    in the metrics middleware (so a guarded failure is counted with its own status).

    Args:
        app: a constructed Litestar application; its ``asgi_handler`` is replaced.
        metrics: the orchestrator metrics to record into.
        body_timeout: seconds a request body may take to arrive (:data:`BODY_TIMEOUT`).
    """
    app.asgi_handler = HttpMetricsMiddleware(BodyGuard(app.asgi_handler, body_timeout), metrics)
