"""``/v1/workers``: workers that heartbeated recently (spec §7)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from dtq.application.queries import QueryService
from dtq.entrypoints.api import bodies, filters, responses
from dtq.entrypoints.api.params import DEFAULT_ACTIVE_SINCE, parse_active_since
from dtq.entrypoints.api.schemas import WorkersBody


class WorkerController(Controller):
    """The worker registry: ``GET /v1/workers``."""

    path = "/v1/workers"
    tags = ["workers"]

    @get(
        "/",
        summary="List recently active workers",
        responses={400: responses.BAD_REQUEST, **responses.COMMON},
    )
    async def list_workers(
        self,
        queries: NamedDependency[QueryService],
        request: Request[Any, Any, Any],
        active_since: Annotated[
            str,
            QueryParameter(
                name="active_since",
                description=(
                    "Go-style positive duration (90s, 5m, 1h30m), at most 2562047h; default 2m"
                ),
            ),
        ] = DEFAULT_ACTIVE_SINCE,
    ) -> WorkersBody:
        """Workers whose last registry heartbeat is within ``active_since``; 400 unless it is
        a positive duration of at most 2562047h47m16s, or for any other or a repeated query
        parameter (``?activ_since=`` would silently list the default window)."""
        filters.check_names(
            (k for k, _ in request.query_params.multi_items()), frozenset({"active_since"})
        )
        workers = await queries.list_workers(parse_active_since(active_since))
        return bodies.workers_body(workers)
