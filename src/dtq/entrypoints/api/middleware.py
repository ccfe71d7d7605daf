"""HTTP request metrics (spec §9: ``orchestrator_http_*``).

:class:`HttpMetricsMiddleware` is a plain ASGI wrapper placed *outside* Litestar's router and
its outer exception handler (see :func:`install_http_metrics`). Litestar runs middleware
registered with ``middleware=[...]`` only for requests that matched a route, so a 404 for an
unknown path or a 405 would go uncounted there; wrapping the whole handler sees every request
and the final status that was actually sent, including error responses.

The ``route`` label is the matched route template (``/v1/tasks/{id}``), which Litestar's
router writes into the ASGI scope; requests that matched no route are labelled
:data:`UNMATCHED`, never with their raw path, so label cardinality stays bounded.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from litestar.enums import ScopeType

from dtq.entrypoints.metrics import OrchestratorMetrics

if TYPE_CHECKING:
    from litestar import Litestar
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

#: ``route`` label of requests that matched no route (unknown path, or a method not allowed).
UNMATCHED = "unmatched"


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


def install_http_metrics(app: Litestar, metrics: OrchestratorMetrics) -> None:
    """Wrap ``app``'s request handler (router + exception handling) in the metrics middleware.

    Args:
        app: a constructed Litestar application; its ``asgi_handler`` is replaced.
        metrics: the orchestrator metrics to record into.
    """
    app.asgi_handler = HttpMetricsMiddleware(app.asgi_handler, metrics)
