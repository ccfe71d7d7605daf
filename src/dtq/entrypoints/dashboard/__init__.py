"""The web dashboard (issue 16 items 3 and 4), served by the orchestrator under ``/ui``.

Server-rendered pages (Litestar's Jinja templates in ``templates/``) with htmx (vendored in
``static/htmx.min.js`` with its licence; never a CDN) polling the overview, and the job page
kept live from its event stream by ``static/live.js`` (plain ``EventSource``). It takes
the API's bundle (:class:`dtq.entrypoints.bundles.ApiServices`) like every other process part,
reads through the same services (keyset pages and bounded reads, never a count of a whole
table) and names no adapter. Read-only except retry and cancel (``ControlService``).

Routes (none in ``/schema``):

==============================  ========================================================
``GET /ui``                     overview (``/ui/overview/panel``: its polled part)
``GET /ui/jobs``                jobs, ``?status=&name=&cursor=``
``GET /ui/jobs/{id}``           a job and its DAG (``/graph``: the part re-read by a
                                fallback poll, or on a large job's next page)
``GET /ui/jobs/{id}/events``    the job page's live updates (SSE, :mod:`.stream`)
``GET /ui/tasks/{id}``          a task: payload, result, progress, runs, explain
``GET /ui/workers``             live workers
``GET /ui/failures``            failed tasks, ``?cursor=``, with retry and cancel
``GET /ui/webhooks``            webhooks and their delivery state (no secret)
``POST /ui/tasks/{id}/retry``   ``/ui/tasks/{id}/cancel``, ``/ui/jobs/{id}/cancel``
``GET``/``POST /ui/login``      token login (``API_AUTH=tokens``); ``POST /ui/logout``
``GET /ui/static/...``          CSS and htmx (open)
==============================  ========================================================

Access is decided by :class:`~dtq.entrypoints.dashboard.gate.Gate` (sessions and CSRF; the
login form's own token: :mod:`~dtq.entrypoints.dashboard.csrf`); the API's bearer guard does
not cover ``/ui`` (its scope rule is for ``/v1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, Router
from litestar.di import Provide
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig
from litestar.types import ControllerRouterHandler, ExceptionHandlersMap

from dtq.domain.errors import DtqError
from dtq.entrypoints.api.errors import status_for
from dtq.entrypoints.bundles import ApiServices
from dtq.entrypoints.dashboard.actions import ActionsController, LoginController
from dtq.entrypoints.dashboard.filters import install_filters
from dtq.entrypoints.dashboard.gate import Gate, error_page
from dtq.entrypoints.dashboard.pages import PagesController
from dtq.entrypoints.dashboard.reads import OverviewReader
from dtq.entrypoints.dashboard.stream import StreamController

__all__ = ["dashboard_routes", "template_config"]

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """The Jinja engine over ``templates/`` (autoescaping on) with the dashboard's filters."""
    return TemplateConfig(
        directory=TEMPLATES,
        engine=JinjaTemplateEngine,
        engine_callback=lambda engine: install_filters(engine.engine),
    )


def _html_error(_: Request[Any, Any, Any], exc: DtqError) -> Response[Any]:
    """A domain error as the dashboard's error page, with the API's status for it (the
    field at fault named, as in the JSON error body)."""
    status = status_for(exc)
    title = "Not found" if status == 404 else "Refused" if status < 500 else "Unavailable"
    field = f" (field {exc.field})" if exc.field else ""
    return error_page(status, title, f"{exc.detail}{field}")


def _provider(value: Any) -> Provide:
    def provide() -> Any:
        return value

    return Provide(provide, use_cache=True, sync_to_thread=False)


def dashboard_routes(services: ApiServices, *, tokens_on: bool) -> list[ControllerRouterHandler]:
    """The ``/ui`` routers for ``create_app``.

    Args:
        services: the API's bundle (queries, events, explain, control, sessions, inspector,
            webhooks).
        tokens_on: ``API_AUTH=tokens``: pages need a login session.
    """
    gate = Gate(sessions=services.sessions, tokens_on=tokens_on)
    values: dict[str, Any] = {
        "queries": services.queries,
        "events": services.events,
        "explain": services.explain,
        "control": services.control,
        "webhooks": services.webhooks,
        "overviews": OverviewReader(queries=services.queries, inspector=services.inspector),
        "sessions": services.sessions,
    }
    dependencies = {name: _provider(value) for name, value in values.items()}

    async def before_request(request: Request[Any, Any, Any]) -> Response[Any] | None:
        # a function, not the Gate itself: Litestar deep-copies a router's attributes, and
        # functions are copied by reference (the services hold locks and tasks)
        return await gate(request)

    handlers: ExceptionHandlersMap = {DtqError: _html_error}
    protected = Router(
        path="/",
        route_handlers=[PagesController, StreamController, ActionsController],
        before_request=before_request,
        dependencies=dependencies,
        exception_handlers=handlers,
        include_in_schema=False,
    )
    login = Router(
        path="/",
        route_handlers=[LoginController],
        dependencies=dependencies,
        exception_handlers=handlers,
        include_in_schema=False,
    )
    static = create_static_files_router(path="/ui/static", directories=[STATIC])
    return [protected, login, static]
