"""``/v1/jobs``: submit a DAG job, read a job with its tasks (spec §7)."""

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
from dtq.entrypoints.api.schemas import JobBody, SubmitJobRequest, SubmitJobResponse
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics

REPLAYED = ResponseSpec(
    data_container=SubmitJobResponse,
    description="Idempotent replay: this Idempotency-Key and body were already submitted",
    generate_examples=False,
)


class JobController(Controller):
    """Jobs: ``POST /v1/jobs`` and ``GET /v1/jobs/{id}``."""

    path = "/v1/jobs"
    tags = ["jobs"]

    @post(
        "/",
        status_code=201,
        summary="Submit a job of tasks with dependencies",
        responses={200: REPLAYED, **responses.SUBMIT},
        before_request=convert.json_only,
    )
    async def submit(
        self,
        *,
        data: JSONBody[SubmitJobRequest],
        request: Request[Any, Any, Any],
        submit: NamedDependency[SubmitService],
        settings: NamedDependency[Settings],
        metrics: NamedDependency[OrchestratorMetrics],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[SubmitJobResponse]:
        """Validate the DAG, create the job and its tasks, enqueue the tasks without
        dependencies. 400 names the tasks of a duplicate name, unknown or self dependency, or
        cycle; 201 with the ids, or 200 with the original ids on an idempotent replay.
        """
        await convert.require_strict_types(request, SubmitJobRequest)
        cmd = convert.submit_job_command(data, idempotency_key=idempotency_key, settings=settings)
        result = await submit.submit_job(cmd)
        convert.count_submission(metrics, result)
        body = SubmitJobResponse(job_id=result.job_id, tasks=result.task_ids)
        return Response(body, status_code=201 if result.created else 200)

    @get("/{id:str}", summary="Get a job with all its tasks", responses=responses.READ_BY_ID)
    async def get_job(self, id: ResourceId, queries: NamedDependency[QueryService]) -> JobBody:
        """The job row and every task of it; 404 unknown, 400 not a UUID."""
        view = await queries.get_job(convert.parse_id(id))
        return convert.job_body(view)
