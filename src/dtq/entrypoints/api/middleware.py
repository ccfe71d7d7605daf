"""HTTP request metrics and the request-body guard (spec §9: ``orchestrator_*``).

:class:`HttpMetricsMiddleware` is a plain ASGI wrapper placed *outside* Litestar's router and
its outer exception handler (see :func:`install_middleware`). Litestar runs middleware
registered with ``middleware=[...]`` only for requests that matched a route, so a 404 for an
unknown path or a 405 would go uncounted there; wrapping the whole handler sees every request
and the final status that was actually sent, including error responses.

The ``route`` label is the matched route template (``/v1/tasks/{id}``), which Litestar's
router writes into the ASGI scope; requests that matched no route are labelled
:data:`UNMATCHED`, never with their raw path, so label cardinality stays bounded.

:class:`BodyGuard` wraps the ``receive`` and ``send`` channels inside it: a request body must
arrive in full within ``body_timeout`` seconds of the request's start (HTTP 408
``request_timeout`` after that); a client that hangs up before its body is complete is answered
:class:`~dtq.entrypoints.api.errors.ClientClosedRequest`, counted under status
:data:`CLIENT_CLOSED` and logged as a client event, not as a server error; and an error
response given before the body was read (413, 415, 404...) first reads and discards the rest of
the body (up to :data:`DRAIN_MAX_BYTES`, within the same deadline). Without that, a server that
closes the connection after its response (``Connection: close``, as urllib sends) leaves unread
bytes in the socket, the kernel answers them with a TCP reset, and the client, still sending,
never sees the 413.

:class:`CountingSubmit` counts submitted jobs and tasks (``orchestrator_jobs_submitted_total``,
``orchestrator_tasks_submitted_total``) around the submit service, so handlers do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from litestar.enums import ScopeType
from prometheus_client import Counter, Histogram

from dtq.application.aio import wait_by
from dtq.application.commands import SubmitJob, SubmitResult
from dtq.application.fleet import FleetService, SubmitWarning
from dtq.application.submit import SubmitService
from dtq.entrypoints import tracing
from dtq.entrypoints.api.errors import CLIENT_CLOSED, ClientClosedRequest, RequestTimeout
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics

if TYPE_CHECKING:
    from litestar import Litestar
    from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

#: ``route`` label of requests that matched no route (unknown path, or a method not allowed).
UNMATCHED = "unmatched"

#: Seconds a request body may take to arrive in full, counted from the request's start.
BODY_TIMEOUT = 30.0

#: Bytes of an unread request body discarded before an early error response is sent; past
#: that (or past the body deadline) the response is sent anyway and the connection may reset.
DRAIN_MAX_BYTES = 64 * 1024 * 1024

__all__ = [
    "BODY_TIMEOUT",
    "CLIENT_CLOSED",
    "DRAIN_MAX_BYTES",
    "UNMATCHED",
    "BodyGuard",
    "CountingSubmit",
    "HttpMetricsMiddleware",
    "Submission",
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
        # labelled children by (method, route, status): ``labels()`` validates and locks on
        # every call; the label sets are bounded (route templates, statuses)
        self._counted: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

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
            key = (method, route, status)
            children = self._counted.get(key)
            if children is None:
                children = (
                    self._metrics.http_requests.labels(method, route, str(status)),
                    self._metrics.http_duration.labels(method, route),
                )
                self._counted[key] = children
            children[0].inc()
            children[1].observe(elapsed)


class BodyGuard:
    """Bound the time a request body may take, turn a mid-body hang-up into a client event, and
    drain an unread body before an error response (see the module docstring).

    Args:
        app: the ASGI app to wrap.
        body_timeout: seconds from the request's start until its body must be complete.
    """

    def __init__(self, app: ASGIApp, body_timeout: float) -> None:
        self._app = app
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve an HTTP request through a :class:`_BodyChannel`; anything else as is."""
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        channel = _BodyChannel(receive, send, self._body_timeout)
        await self._app(scope, channel.receive, channel.send)


class _BodyChannel:
    """The ``receive`` and ``send`` of one request, guarded."""

    def __init__(self, receive: Receive, send: Send, timeout: float) -> None:
        self._receive = receive
        self._send = send
        self._timeout = timeout
        self._deadline = asyncio.get_running_loop().time() + timeout
        self._complete = False  # the whole body was received, or nothing more will come

    async def receive(self) -> ReceiveMessage:
        """The next message, by the body deadline.

        Raises:
            RequestTimeout: the body is still incomplete at the deadline (HTTP 408).
            ClientClosedRequest: the client disconnected before its body was complete.
        """
        if self._complete:
            return await self._receive()
        try:
            message = await wait_by(self._deadline, self._receive())  # no timer when buffered
        except TimeoutError:
            raise RequestTimeout(
                detail=f"the request body did not arrive within {self._timeout:g} s",
                headers={"Connection": "close"},
            ) from None
        if message["type"] == "http.disconnect":
            self._complete = True
            raise ClientClosedRequest(
                detail="the client closed the connection before its request body was complete"
            )
        if not message.get("more_body", False):
            self._complete = True
        return message

    async def send(self, message: Message) -> None:
        """Forward ``message``; an error response's start waits until the body is drained."""
        if (
            message["type"] == "http.response.start"
            and message["status"] >= 400
            and not self._complete
        ):
            await self._drain()
        await self._send(message)

    async def _drain(self) -> None:
        drained = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(self._deadline):
                while drained <= DRAIN_MAX_BYTES:
                    message = await self._receive()
                    if message["type"] != "http.request":  # the client hung up
                        break
                    drained += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
        self._complete = True


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


Body_contra = TypeVar("Body_contra", contravariant=True)
Body = TypeVar("Body")


class BuildSubmission(Protocol[Body_contra]):
    """A request body's ``SubmitJob`` (``commands.submit_task``, ``commands.submit_job``)."""

    def __call__(
        self,
        body: Body_contra,
        *,
        idempotency_key: str | None,
        settings: Settings,
        trace_context: str | None = None,
    ) -> SubmitJob:
        """The command for ``body``."""
        ...


@dataclass(frozen=True, slots=True)
class Submission:
    """What the two submission routes use, handed to them as one dependency.

    Litestar resolves two or more dependencies of one handler concurrently, in an anyio task
    group per request: with ``submit``, ``fleet`` and ``settings`` as three dependencies that
    cost ~75 µs of CPU per ``POST /v1/tasks`` (a third of the route's time in Litestar), for
    three constant providers.
    """

    submit: CountingSubmit
    fleet: FleetService
    settings: Settings

    async def run(
        self,
        build: BuildSubmission[Body],
        body: Body,
        idempotency_key: str | None,
        traceparent: str | None,
    ) -> tuple[SubmitResult, list[SubmitWarning]]:
        """Submit the command ``build`` makes of ``body`` (``commands.submit_task`` or
        ``commands.submit_job``), inside the submit span (issue 16 item 5: the span's W3C
        context is stored with the job); the result and the fleet warnings.

        Raises:
            DtqError: as :meth:`SubmitService.submit_job` (or ``build``'s validation).
        """
        with tracing.submit_span(traceparent) as trace_context:
            cmd = build(
                body,
                idempotency_key=idempotency_key,
                settings=self.settings,
                trace_context=trace_context,
            )
            result = await self.submit.submit_job(cmd)
            tracing.submitted(result.job_id, len(cmd.tasks), created=result.created)
            warnings = await self.fleet.submit_warnings(cmd.tasks)
        return result, warnings


def install_middleware(app: Litestar, metrics: OrchestratorMetrics, body_timeout: float) -> None:
    """Wrap ``app``'s request handler (router + exception handling) in the body guard, and that
    in the metrics middleware (so a guarded failure is counted with its own status).

    Args:
        app: a constructed Litestar application; its ``asgi_handler`` is replaced.
        metrics: the orchestrator metrics to record into.
        body_timeout: seconds a request body may take to arrive (:data:`BODY_TIMEOUT`).
    """
    app.asgi_handler = HttpMetricsMiddleware(BodyGuard(app.asgi_handler, body_timeout), metrics)
