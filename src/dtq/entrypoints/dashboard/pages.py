"""The dashboard's read pages (issue 16 item 3): overview, jobs, job, task, workers, failures,
webhooks.

Every handler reads through the application's services and renders one template; the
``/panel`` and ``/graph`` variants render only the part htmx re-reads (the overview's poll;
the job page's next page of tasks, or its fallback poll when the live stream of
:mod:`~dtq.entrypoints.dashboard.stream` is unavailable). Query parameters are parsed
by the listing's own parsers, so a bad value is a 400 naming the parameter (the dashboard's
HTML error page).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get
from litestar.di import NamedDependency
from litestar.params import FromQuery as Query
from litestar.response import Template

from dtq.application.events import EventService, format_event_id
from dtq.application.explain import ExplainService, Explanation
from dtq.application.filters import JobKeyset, TaskFilter
from dtq.application.queries import QueryService
from dtq.application.webhooks import WebhookService
from dtq.domain.errors import DtqError
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.api.filters import (
    format_job_cursor,
    format_task_cursor,
    job_filter,
    parse_job_cursor,
    parse_task_cursor,
)
from dtq.entrypoints.api.params import ResourceId, format_cursor, parse_cursor, parse_id
from dtq.entrypoints.dashboard.graph import NODE_H, NODE_W, draw
from dtq.entrypoints.dashboard.reads import LIVE_WITHIN, WINDOW, OverviewReader

#: Jobs and failed tasks per page.
PAGE_SIZE = 25
#: Tasks per page of a job too large to draw.
JOB_TASK_PAGE = 50
#: The largest job drawn as a graph; a larger one shows counts and pages of tasks.
MAX_DRAWN_TASKS = 200


def _context(request: Request[Any, Any, Any], **values: Any) -> dict[str, Any]:
    principal = request.state.get("principal")
    return {
        "csrf": request.state.csrf,
        "principal": principal,
        "path": request.url.path,
        "query": request.url.query,
        **values,
    }


def _page(request: Request[Any, Any, Any], template: str, **values: Any) -> Template:
    return Template(template_name=template, context=_context(request, **values))


class PagesController(Controller):
    """``GET /ui...``: the read pages (``read`` scope)."""

    path = "/ui"
    include_in_schema = False

    @get("/")
    async def overview(
        self,
        request: Request[Any, Any, Any],
        overviews: NamedDependency[OverviewReader],
    ) -> Template:
        """The overview: tasks per status, ready depths, live workers, throughput."""
        data = await overviews.read()
        return _page(request, "overview.html", view=data, window=WINDOW, nav="overview")

    @get("/overview/panel")
    async def overview_panel(
        self,
        request: Request[Any, Any, Any],
        overviews: NamedDependency[OverviewReader],
    ) -> Template:
        """The overview's polled part."""
        data = await overviews.read()
        return _page(request, "overview_panel.html", view=data, window=WINDOW)

    @get("/jobs")
    async def jobs(
        self,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        status: Query[list[str] | None] = None,
        name: Query[str | None] = None,
        cursor: Query[str | None] = None,
    ) -> Template:
        """Jobs newest first, filtered by ``status`` (repeatable) and ``name``, keyset-paged."""
        where = job_filter(status=status, name=name or None)
        after: JobKeyset | None = parse_job_cursor(cursor)
        page = await queries.list_jobs(where, limit=PAGE_SIZE, after=after)
        return _page(
            request,
            "jobs.html",
            jobs=page.jobs,
            next_cursor=format_job_cursor(page.next_after) if page.next_after else None,
            statuses=list(JobStatus),
            chosen={s.value for s in where.statuses},
            name=name or "",
            nav="jobs",
        )

    @get("/jobs/{id:str}")
    async def job(
        self,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        events: NamedDependency[EventService],
        id: ResourceId,
    ) -> Template:
        """A job: its counts and DAG (or a page of its tasks when it is large), kept live by
        ``/ui/jobs/{id}/events`` from the horizon of this read on."""
        view = await _job_view(queries, events, id, None)
        return _page(request, "job.html", nav="jobs", **view)

    @get("/jobs/{id:str}/graph")
    async def job_graph(
        self,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        events: NamedDependency[EventService],
        id: ResourceId,
        cursor: Query[str | None] = None,
    ) -> Template:
        """The job page's status-and-graph section alone (a large job's next page of tasks;
        the page's slow fallback poll while the live stream is unavailable)."""
        view = await _job_view(queries, events, id, cursor)
        return _page(request, "job_graph.html", **view)

    @get("/tasks/{id:str}")
    async def task(
        self,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        explain: NamedDependency[ExplainService],
        id: ResourceId,
    ) -> Template:
        """A task: payload, result, progress, runs, errors and explain."""
        task_id = parse_id(id)
        view = await queries.get_task(task_id)
        why: Explanation | None = None
        why_error: str | None = None
        try:
            why = await explain.explain(task_id)
        except DtqError as exc:  # explain needs the queue; the page shows the task without it
            why_error = exc.detail
        return _page(
            request,
            "task.html",
            task=view.task,
            runs=view.runs,
            explain=why,
            explain_error=why_error,
            nav="jobs",
        )

    @get("/workers")
    async def workers(
        self, request: Request[Any, Any, Any], queries: NamedDependency[QueryService]
    ) -> Template:
        """Workers whose registry heartbeat is within two minutes."""
        found = await queries.list_workers(LIVE_WITHIN)
        return _page(request, "workers.html", workers=found, nav="workers")

    @get("/webhooks")
    async def webhooks(
        self, request: Request[Any, Any, Any], webhooks: NamedDependency[WebhookService]
    ) -> Template:
        """Every webhook with its delivery state (never its secret): delivered count,
        failures in a row, the last try's status, error and time, the next try."""
        found = await webhooks.list()
        return _page(request, "webhooks.html", webhooks=found, nav="webhooks")

    @get("/failures")
    async def failures(
        self,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        cursor: Query[str | None] = None,
    ) -> Template:
        """Failed tasks newest first, keyset-paged, with retry and cancel-job buttons."""
        where = TaskFilter(statuses=frozenset({TaskStatus.FAILED}))
        page = await queries.list_tasks(where, limit=PAGE_SIZE, after=parse_task_cursor(cursor))
        return _page(
            request,
            "failures.html",
            tasks=page.tasks,
            next_cursor=format_task_cursor(page.next_after) if page.next_after else None,
            nav="failures",
        )


async def _job_view(
    queries: QueryService, events: EventService, raw_id: str, cursor: str | None
) -> dict[str, Any]:
    """The job page's values: the drawing when the job has at most ``MAX_DRAWN_TASKS`` tasks,
    else one keyset page of ``JOB_TASK_PAGE`` tasks in submission order; ``after``, where
    its live stream starts (the horizon of this read); ``finished`` (the job is terminal and
    no task is unfinished: nothing will change, no stream)."""
    job_id = parse_id(raw_id)
    graph = await queries.job_graph(job_id, max_tasks=MAX_DRAWN_TASKS)
    unfinished = sum(n for status, n in graph.counts.items() if not status.terminal)
    values: dict[str, Any] = {
        "job": graph.job,
        "counts": graph.counts,
        "total": sum(graph.counts.values()),
        "finished": graph.job.status.terminal and not unfinished,
        "after": format_event_id(events.horizon(graph.at)),
        "drawing": None,
        "tasks": [],
        "next_cursor": None,
        "cursor": cursor or "",
        "node_w": NODE_W,
        "node_h": NODE_H,
    }
    if graph.tasks is not None:
        values["drawing"] = draw(graph.tasks, graph.edges)
        return values
    view = await queries.get_job(job_id, limit=JOB_TASK_PAGE, after=parse_cursor(cursor))
    values["tasks"] = view.tasks
    values["next_cursor"] = format_cursor(view.next_after) if view.next_after else None
    return values
