"""``/v1/tasks``: submit a single-task job, read a task with its runs (spec §7), explain why it
is (not) running (issue 14 item 7); cancel and retry a task (issue 14 items 1 and 4)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody, QueryParameter

from dtq.application.control import ControlService
from dtq.application.explain import ExplainService
from dtq.application.queries import QueryService
from dtq.entrypoints.api import bodies, commands, filters, guards, responses
from dtq.entrypoints.api.middleware import Submission
from dtq.entrypoints.api.params import IdempotencyKey, ResourceId, TraceParent, parse_id
from dtq.entrypoints.api.schemas import (
    ExplainBody,
    SubmitTaskRequest,
    SubmitTaskResponse,
    TaskCancelResponse,
    TaskDetailBody,
    TaskListBody,
    TaskRetryResponse,
)

REPLAYED = ResponseSpec(
    data_container=SubmitTaskResponse,
    description="Idempotent replay: this Idempotency-Key and body were already submitted",
    generate_examples=False,
)


async def submit_one(
    submission: Submission,
    data: SubmitTaskRequest,
    idempotency_key: str | None,
    traceparent: str | None,
) -> tuple[SubmitTaskResponse, int]:
    """Submit ``data`` as a one-task job: the response body and its status (201 created, 200
    an idempotent replay). Shared by the route and the submit fast path (``fast_submit.py``).

    Raises:
        DtqError: as :meth:`Submission.run`.
    """
    result, warnings = await submission.run(
        commands.submit_task, data, idempotency_key, traceparent
    )
    return bodies.submitted_task(result, data.kind, warnings), 201 if result.created else 200


class TaskController(Controller):
    """Single tasks: ``POST /v1/tasks``, ``GET /v1/tasks/{id}``, ``GET /v1/tasks/{id}/explain``,
    ``POST /v1/tasks/{id}/cancel`` and ``POST /v1/tasks/{id}/retry``; the listing
    ``GET /v1/tasks``."""

    path = "/v1/tasks"
    tags = ["tasks"]

    @post(
        "/",
        status_code=201,
        summary="Submit a single-task job",
        responses={200: REPLAYED, **responses.SUBMIT},
        before_request=guards.submission_body(SubmitTaskRequest),
    )
    async def submit(
        self,
        *,
        data: JSONBody[SubmitTaskRequest],
        submission: NamedDependency[Submission],
        idempotency_key: IdempotencyKey = None,
        traceparent: TraceParent = None,
    ) -> Response[SubmitTaskResponse]:
        """Create a job with one task named after its kind and enqueue it.

        Returns 201 with the new ids, or 200 with the original ids on an idempotent replay;
        ``warnings`` when no live worker serves the task's priority or kind.
        """
        body, status = await submit_one(submission, data, idempotency_key, traceparent)
        return Response(body, status_code=status)

    @get("/{id:str}", summary="Get a task with its run history", responses=responses.READ_BY_ID)
    async def get_task(
        self,
        id: ResourceId,
        queries: NamedDependency[QueryService],
        request: Request[Any, Any, Any],
    ) -> TaskDetailBody:
        """The task row and its runs ordered by ``started_at``; 404 unknown, 400 not a UUID or
        any query parameter (the route takes none: a misspelt one is not silently ignored)."""
        filters.check_names((k for k, _ in request.query_params.multi_items()), frozenset())
        return bodies.task_detail_body(await queries.get_task(parse_id(id)))

    @get(
        "/{id:str}/explain",
        summary="Explain why a task is (not) running: one stable reason code",
        responses=responses.READ_BY_ID,
    )
    async def explain(
        self,
        id: ResourceId,
        explain: NamedDependency[ExplainService],
        request: Request[Any, Any, Any],
    ) -> ExplainBody:
        """``reason`` is one of terminal, waiting_on_dependencies, running, lease_lost,
        scheduled, queued_no_worker, queued, delivery_in_flight (decision order in
        ``application/explain.py``); 404 unknown, 400 not a UUID or any query parameter, 503
        when the database, or Redis for a code that needs it, is unavailable."""
        filters.check_names((k for k, _ in request.query_params.multi_items()), frozenset())
        return bodies.explain_body(await explain.explain(parse_id(id)))

    @post(
        "/{id:str}/cancel",
        status_code=200,
        before_request=guards.no_input,
        summary="Cancel a task (a running one stops at its worker's next lease heartbeat)",
        responses=responses.CANCEL,
    )
    async def cancel(
        self, id: ResourceId, control: NamedDependency[ControlService]
    ) -> TaskCancelResponse:
        """``pending``/``queued``/``running`` -> ``cancelled``, with its pending dependents;
        200 also for a task already cancelled; 409 ``not_cancellable`` for a completed or
        failed one; 404 unknown, 400 not a UUID, any query parameter or a body (nothing
        changed)."""
        task_id = parse_id(id)
        status, cascaded = await control.cancel_task(task_id)
        return TaskCancelResponse(task_id=task_id, status=status, cascaded=cascaded)

    @post(
        "/{id:str}/retry",
        status_code=200,
        before_request=guards.no_input,
        summary="Retry a failed or cancelled task now, with a fresh attempt budget",
        responses=responses.RETRY,
    )
    async def retry(
        self, id: ResourceId, control: NamedDependency[ControlService]
    ) -> TaskRetryResponse:
        """``failed``/``cancelled`` -> ``queued`` (``pending`` while a dependency is
        unfinished), its cascade-ended dependents -> ``pending``, the job re-derived; 409
        ``not_retryable`` otherwise; 404 unknown, 400 not a UUID, any query parameter or a body
        (nothing changed)."""
        task_id = parse_id(id)
        status, reopened = await control.retry_task(task_id)
        return TaskRetryResponse(task_id=task_id, status=status, reopened=reopened)

    @get(
        "/",
        summary="List tasks, newest first, with filters (keyset-paged)",
        responses={400: responses.BAD_REQUEST, **responses.COMMON},
    )
    async def list_tasks(
        self,
        *,
        request: Request[Any, Any, Any],
        queries: NamedDependency[QueryService],
        status: Annotated[
            list[str] | None,
            QueryParameter(
                description="Any of these statuses: repeated and/or comma-separated"
                " (pending, queued, running, completed, failed, cancelled)"
            ),
        ] = None,
        kind: Annotated[str | None, QueryParameter(description="Exactly this kind")] = None,
        job_id: Annotated[
            str | None, QueryParameter(description="Tasks of this job (UUID)")
        ] = None,
        priority: Annotated[
            str | None, QueryParameter(description="Exactly this priority tier")
        ] = None,
        since: filters.Since = None,
        until: filters.Until = None,
        limit: filters.ListLimit = None,
        cursor: filters.ListCursor = None,
    ) -> TaskListBody:
        """Matching tasks newest first (``created_at``, then last submitted first), without
        ``payload``/``result``/``progress``/``runs``; ``next_cursor`` is null on the last page.
        400 names an unknown parameter or status, a malformed kind, job_id, priority, time,
        limit, or a cursor this API did not issue.
        """
        filters.check_names((k for k, _ in request.query_params.multi_items()), filters.TASK_PARAMS)
        where = filters.task_filter(
            status=status, kind=kind, job_id=job_id, priority=priority, since=since, until=until
        )
        page = await queries.list_tasks(
            where, limit=filters.parse_list_limit(limit), after=filters.parse_task_cursor(cursor)
        )
        next_cursor = (
            None if page.next_after is None else filters.format_task_cursor(page.next_after)
        )
        return bodies.task_list_body(page, next_cursor)
