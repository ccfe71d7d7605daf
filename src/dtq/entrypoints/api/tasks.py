"""``/v1/tasks``: submit a single-task job, read a task with its runs (spec §7)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from dtq.application.queries import QueryService
from dtq.application.submit import SubmitService
from dtq.entrypoints.api import convert, responses
from dtq.entrypoints.api.params import IdempotencyKey, ResourceId
from dtq.entrypoints.api.schemas import (
    SubmitTaskRequest,
    SubmitTaskResponse,
    TaskDetailBody,
)
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics

REPLAYED = ResponseSpec(
    data_container=SubmitTaskResponse,
    description="Idempotent replay: this Idempotency-Key and body were already submitted",
    generate_examples=False,
)


class TaskController(Controller):
    """Single tasks: ``POST /v1/tasks`` and ``GET /v1/tasks/{id}``."""

    path = "/v1/tasks"
    tags = ["tasks"]

    @post(
        "/",
        status_code=201,
        summary="Submit a single-task job",
        responses={200: REPLAYED, **responses.SUBMIT},
        before_request=convert.json_only,
    )
    async def submit(
        self,
        *,
        data: JSONBody[SubmitTaskRequest],
        request: Request[Any, Any, Any],
        submit: NamedDependency[SubmitService],
        settings: NamedDependency[Settings],
        metrics: NamedDependency[OrchestratorMetrics],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[SubmitTaskResponse]:
        """Create a job with one task named after its kind and enqueue it.

        Returns 201 with the new ids, or 200 with the original ids on an idempotent replay.
        """
        await convert.require_strict_types(request, SubmitTaskRequest)
        cmd = convert.submit_task_command(data, idempotency_key=idempotency_key, settings=settings)
        result = await submit.submit_job(cmd)
        convert.count_submission(metrics, result)
        body = SubmitTaskResponse(task_id=result.task_ids[data.kind], job_id=result.job_id)
        return Response(body, status_code=201 if result.created else 200)

    @get("/{id:str}", summary="Get a task with its run history", responses=responses.READ_BY_ID)
    async def get_task(
        self, id: ResourceId, queries: NamedDependency[QueryService]
    ) -> TaskDetailBody:
        """The task row and its runs ordered by ``started_at``; 404 unknown, 400 not a UUID."""
        view = await queries.get_task(convert.parse_id(id))
        return convert.task_detail_body(view)
