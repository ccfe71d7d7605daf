"""``/v1/jobs``: submit a DAG job, read a job with its tasks (spec §7)."""

from __future__ import annotations

from litestar import Controller, Response, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from dtq.application.queries import QueryService
from dtq.entrypoints.api import bodies, commands, guards, responses
from dtq.entrypoints.api.middleware import CountingSubmit
from dtq.entrypoints.api.params import IdempotencyKey, ResourceId, parse_id
from dtq.entrypoints.api.schemas import JobBody, SubmitJobRequest, SubmitJobResponse
from dtq.entrypoints.config import Settings

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
        before_request=guards.json_body(SubmitJobRequest),
    )
    async def submit(
        self,
        *,
        data: JSONBody[SubmitJobRequest],
        submit: NamedDependency[CountingSubmit],
        settings: NamedDependency[Settings],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[SubmitJobResponse]:
        """Validate the DAG, create the job and its tasks, enqueue the tasks without
        dependencies. 400 names the tasks of a duplicate name, unknown or self dependency, or
        cycle; 201 with the ids, or 200 with the original ids on an idempotent replay.
        """
        cmd = commands.submit_job(data, idempotency_key=idempotency_key, settings=settings)
        result = await submit.submit_job(cmd)
        body = bodies.submitted_job(result)
        return Response(body, status_code=201 if result.created else 200)

    @get("/{id:str}", summary="Get a job with all its tasks", responses=responses.READ_BY_ID)
    async def get_job(self, id: ResourceId, queries: NamedDependency[QueryService]) -> JobBody:
        """The job row and every task of it; 404 unknown, 400 not a UUID."""
        return bodies.job_body(await queries.get_job(parse_id(id)))
