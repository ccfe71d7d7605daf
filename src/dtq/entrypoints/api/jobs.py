"""``/v1/jobs``: submit a DAG job, read a job with its tasks and counts (spec §7), list jobs
(issue 14 item 5), cancel a job (issue 14 item 1)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody, QueryParameter

from dtq.application.control import ControlService
from dtq.application.queries import QueryService
from dtq.domain.errors import ValidationError
from dtq.entrypoints.api import bodies, commands, filters, guards, responses
from dtq.entrypoints.api.middleware import Submission
from dtq.entrypoints.api.params import (
    DEFAULT_RESULTS_LIMIT,
    IdempotencyKey,
    ResourceId,
    TraceParent,
    format_cursor,
    parse_cursor,
    parse_id,
    parse_limit,
)
from dtq.entrypoints.api.schemas import (
    JobBody,
    JobCancelResponse,
    JobListBody,
    JobResultsBody,
    SubmitJobRequest,
    SubmitJobResponse,
)

REPLAYED = ResponseSpec(
    data_container=SubmitJobResponse,
    description="Idempotent replay: this Idempotency-Key and body were already submitted",
    generate_examples=False,
)


class JobController(Controller):
    """Jobs: ``POST /v1/jobs``, ``GET /v1/jobs/{id}``, ``GET /v1/jobs/{id}/results`` and
    ``POST /v1/jobs/{id}/cancel``."""

    path = "/v1/jobs"
    tags = ["jobs"]

    @post(
        "/",
        status_code=201,
        summary="Submit a job of tasks with dependencies",
        responses={200: REPLAYED, **responses.SUBMIT},
        before_request=guards.submission_body(SubmitJobRequest),
    )
    async def submit(
        self,
        *,
        data: JSONBody[SubmitJobRequest],
        submission: NamedDependency[Submission],
        idempotency_key: IdempotencyKey = None,
        traceparent: TraceParent = None,
    ) -> Response[SubmitJobResponse]:
        """Validate the DAG, create the job and its tasks, enqueue the tasks without
        dependencies. 400 names the tasks of a duplicate name, unknown or self dependency, or
        cycle; 201 with the ids, or 200 with the original ids on an idempotent replay;
        ``warnings`` when no live worker serves some task's priority or kind.
        """
        result, warnings = await submission.run(
            commands.submit_job, data, idempotency_key, traceparent
        )
        body = bodies.submitted_job(result, warnings)
        return Response(body, status_code=201 if result.created else 200)

    @get(
        "/{id:str}",
        summary="Get a job with its tasks (all, or a page) and its task counts",
        responses=responses.READ_BY_ID,
    )
    async def get_job(
        self,
        *,
        request: Request[Any, Any, Any],
        id: ResourceId,
        queries: NamedDependency[QueryService],
        limit: Annotated[
            str | None,
            QueryParameter(description="Page size of tasks, 1..1000; absent: every task"),
        ] = None,
        cursor: Annotated[
            str | None,
            QueryParameter(description="The next_cursor of the previous page (needs limit)"),
        ] = None,
    ) -> JobBody:
        """The job row, ``counts`` (tasks per status, every status present) and its tasks:
        every task without ``limit`` (spec §7; ``next_cursor`` null), else a page in submission
        order with ``next_cursor`` (the results route's cursor). 404 unknown; 400 not a UUID, a
        bad ``limit``, a cursor this API did not issue, a cursor without ``limit``, or an
        unknown or repeated parameter (a misspelt ``?limt=`` would return every task).
        """
        filters.check_names((k for k, _ in request.query_params.multi_items()), filters.PAGE_PARAMS)
        after = parse_cursor(cursor)
        if after is not None and limit is None:
            raise ValidationError("cursor needs limit (the page size)", field="cursor")
        view = await queries.get_job(
            parse_id(id), limit=None if limit is None else parse_limit(limit), after=after
        )
        next_cursor = None if view.next_after is None else format_cursor(view.next_after)
        return bodies.job_body(view, next_cursor)

    @get(
        "/",
        summary="List jobs, newest first, with filters (keyset-paged)",
        responses={400: responses.BAD_REQUEST, **responses.COMMON},
    )
    async def list_jobs(
        self,
        *,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        status: Annotated[
            list[str] | None,
            QueryParameter(
                description="Any of these statuses: repeated and/or comma-separated"
                " (pending, running, completed, failed, cancelled)"
            ),
        ] = None,
        name: Annotated[str | None, QueryParameter(description="Exactly this job name")] = None,
        since: filters.Since = None,
        until: filters.Until = None,
        limit: filters.ListLimit = None,
        cursor: filters.ListCursor = None,
    ) -> JobListBody:
        """Matching jobs newest first (``created_at``, then id), without their tasks;
        ``next_cursor`` is null on the last page. 400 names an unknown parameter or status, a
        malformed name, time, limit, or a cursor this API did not issue.
        """
        filters.check_names((k for k, _ in request.query_params.multi_items()), filters.JOB_PARAMS)
        where = filters.job_filter(status=status, name=name, since=since, until=until)
        page = await queries.list_jobs(
            where, limit=filters.parse_list_limit(limit), after=filters.parse_job_cursor(cursor)
        )
        next_cursor = (
            None if page.next_after is None else filters.format_job_cursor(page.next_after)
        )
        return bodies.job_list_body(page, next_cursor)

    @get(
        "/{id:str}/results",
        summary="Get the results of a job's tasks, in submission order (keyset-paged)",
        responses=responses.READ_BY_ID,
    )
    async def get_results(
        self,
        *,
        request: Request[Any, Any, Any],
        id: ResourceId,
        queries: NamedDependency[QueryService],
        limit: Annotated[
            str,
            QueryParameter(description="Page size, 1..1000 tasks (default 100)"),
        ] = str(DEFAULT_RESULTS_LIMIT),
        cursor: Annotated[
            str | None,
            QueryParameter(description="The next_cursor of the previous page; absent: first"),
        ] = None,
    ) -> JobResultsBody:
        """Each task's name, id, status and result (null until completed) in the order the job
        was submitted; ``next_cursor`` is null on the last page. 404 unknown job, 400 not a
        UUID, a ``limit`` outside 1..1000, a ``cursor`` this API did not issue, or an unknown
        or repeated parameter.
        """
        filters.check_names((k for k, _ in request.query_params.multi_items()), filters.PAGE_PARAMS)
        view = await queries.job_results(
            parse_id(id), limit=parse_limit(limit), after=parse_cursor(cursor)
        )
        next_cursor = None if view.next_after is None else format_cursor(view.next_after)
        return bodies.job_results_body(view, next_cursor)

    @post(
        "/{id:str}/cancel",
        status_code=200,
        before_request=guards.no_input,
        summary="Cancel every unfinished task of a job (bounded batches, one call)",
        responses=responses.CANCEL,
    )
    async def cancel(
        self, id: ResourceId, control: NamedDependency[ControlService]
    ) -> JobCancelResponse:
        """Every ``pending``/``queued``/``running`` task of the job -> ``cancelled``, in
        transactions of at most 500 tasks; the job ends ``cancelled`` (``failed`` if a task of
        it failed). 200 with ``cancelled: 0`` for a job already cancelled; 409
        ``not_cancellable`` for a completed or failed job with nothing unfinished; 404 unknown,
        400 not a UUID, any query parameter or a body (nothing changed)."""
        outcome = await control.cancel_job(parse_id(id))
        return JobCancelResponse(
            job_id=outcome.job_id, status=outcome.status, cancelled=outcome.cancelled
        )
