"""``/v1/worker``: the HTTP worker protocol (issue 15 item 1), plain JSON for any language.

A worker long-polls ``POST /v1/worker/claim``, renews each run with
``POST /v1/worker/runs/{run_id}/heartbeat`` and ends it with ``…/result`` or ``…/failure``; the
run routes name the worker in the ``X-Worker-Id`` header (a run claimed by another worker id is
a 409 ``run_not_owned``; the header given twice, on a run route or a claim, is a 400 naming
it). ``POST /v1/worker/registry`` upserts the worker's registry row, as the native runtime's
registry loop does, and ``POST /v1/worker/registry/remove`` deletes it (a clean stop); a claim
keeps the row live with the kinds and priorities it names. The orchestrator does every claim,
marker, lease and fencing step through the native runtime's services (``application.remote``).
Not the registry listing ``GET /v1/workers`` (``workers.py``).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec
from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import HeaderParameter, JSONBody, PathParameter

from dtq.application.commands import Claim
from dtq.application.remote import NO_PROGRESS, RemoteWorkerService
from dtq.domain.entities import DEFAULT_PRIORITY
from dtq.domain.errors import InvalidPayload, ValidationError
from dtq.domain.payload import MAX_ERROR_CHARS
from dtq.entrypoints.api import guards, responses
from dtq.entrypoints.api.schemas import (
    NO_CONTROL_PATTERN,
    NO_NUL_PATTERN,
    WORKER_ID_PATTERN,
    Kind,
    Payload,
    Priority,
)
from dtq.entrypoints.api.timing import format_duration, parse_delay

#: Longest ``wait`` of a claim: past it a 400 (a proxy would cut a longer hold).
MAX_CLAIM_WAIT = timedelta(seconds=30)
#: ``wait`` of a claim that gives none.
DEFAULT_CLAIM_WAIT = "20s"


WorkerId = Annotated[
    str,
    msgspec.Meta(
        pattern=WORKER_ID_PATTERN,
        description="The worker's id (WORKER_ID): 1..200 printable ASCII characters, no space",
        examples=["worker-1"],
    ),
]

#: The ``X-Worker-Id`` header of the run routes: the worker that claimed the run.
WorkerIdHeader = Annotated[
    str | None,
    HeaderParameter(
        name="X-Worker-Id",
        required=False,
        pattern=WORKER_ID_PATTERN,
        description="The worker_id the run was claimed with; another id is a 409 run_not_owned",
    ),
]

#: ``{run_id}`` of the run routes; parsed by :func:`parse_run_id` (400 naming ``run_id``).
RunId = Annotated[str, PathParameter(format="uuid", description="A run id from a claim")]


class ClaimRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/claim``: hold until tasks of ``kinds`` are claimed, or ``wait`` ends."""

    worker_id: WorkerId
    kinds: Annotated[list[Kind], msgspec.Meta(min_length=1, max_length=1000)]
    priorities: Annotated[list[Priority], msgspec.Meta(min_length=1, max_length=32)] = (
        msgspec.field(default_factory=lambda: [DEFAULT_PRIORITY])
    )
    max_count: Annotated[
        int, msgspec.Meta(ge=1, le=100, description="Most tasks to claim, 1..100")
    ] = msgspec.field(default=1, name="max")
    wait: Annotated[
        str,
        msgspec.Meta(
            max_length=64,
            description="Go duration to hold for the first task, 0s..30s (default 20s)",
            examples=["20s"],
        ),
    ] = DEFAULT_CLAIM_WAIT


class HeartbeatRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/runs/{run_id}/heartbeat``; ``{}`` or with the handler's progress."""

    progress: Annotated[
        Any | msgspec.UnsetType,
        msgspec.Meta(
            description=(
                "The latest progress (any JSON value, at most 64 KiB); null is a value (the"
                " checkpoint is cleared); leave the field out to report none"
            )
        ),
    ] = msgspec.UNSET


FinalProgress = Annotated[
    Any | msgspec.UnsetType,
    msgspec.Meta(
        description=(
            "The run's last progress, written with the report; null is a value (the checkpoint"
            " is cleared); leave the field out to report none"
        )
    ),
]


class ResultRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/runs/{run_id}/result``: the handler's return value."""

    result: Annotated[
        Any,
        msgspec.Meta(description="Any JSON value, at most API_MAX_RESULT_BYTES; null: none"),
    ] = None
    progress: FinalProgress = msgspec.UNSET


class BatchedResult(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One success of ``POST /v1/worker/results``."""

    run_id: UUID
    result: Annotated[Any, msgspec.Meta(description="As for …/result")] = None
    progress: FinalProgress = msgspec.UNSET


class ResultsRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/results``: several successes of one worker in one request."""

    reports: Annotated[list[BatchedResult], msgspec.Meta(min_length=1, max_length=128)]


class ResultsBody(msgspec.Struct, kw_only=True):
    """Per report, in order: recorded, duplicate, stale_run, run_not_found or run_not_owned."""

    outcomes: list[Literal["recorded", "duplicate", "stale_run", "run_not_found", "run_not_owned"]]


class FailureRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/runs/{run_id}/failure``: retried by policy unless ``permanent``."""

    error: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=MAX_ERROR_CHARS,
            pattern=NO_NUL_PATTERN,
            description="What went wrong, 1..10000 characters, no \\u0000",
        ),
    ]
    permanent: bool = False
    progress: FinalProgress = msgspec.UNSET


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/runs/{run_id}/release``: hand the task back unfinished (shutdown)."""

    reason: Annotated[
        str, msgspec.Meta(min_length=1, max_length=MAX_ERROR_CHARS, pattern=NO_NUL_PATTERN)
    ] = "worker shutting down"
    progress: FinalProgress = msgspec.UNSET


class RegistryRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/registry``: the worker is alive (its ``workers`` row, spec §4)."""

    worker_id: WorkerId
    hostname: Annotated[str, msgspec.Meta(max_length=255, pattern=NO_CONTROL_PATTERN)] = ""
    metadata: dict[str, Payload] = msgspec.field(default_factory=dict)


class RemoveRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/worker/registry/remove``: the worker stopped on purpose (its row goes)."""

    worker_id: WorkerId


#: What ``metadata.kinds`` and ``metadata.priorities`` of a registry row must be when given:
#: what the fleet reads as the kinds a worker runs and the tiers it polls.
_ADVERTISED: dict[str, tuple[Any, str]] = {
    "kinds": (
        Annotated[list[Kind], msgspec.Meta(max_length=1000)],
        "a list of at most 1000 kinds, each 1 to 200 letters, digits, '.', '_', ':' or '-'",
    ),
    "priorities": (
        Annotated[list[Priority], msgspec.Meta(max_length=32)],
        "a list of at most 32 priorities, each 1 to 32 characters of a-z, 0-9, '_' or '-'",
    ),
}


def check_advertised(metadata: dict[str, Any]) -> None:
    """Refuse registry metadata whose ``kinds`` or ``priorities`` is given but is not a list of
    names a claim accepts (``ClaimRequest``); both may be absent.

    Raises:
        ValidationError: field ``metadata.kinds`` or ``metadata.priorities``.
    """
    for key, (model, what) in _ADVERTISED.items():
        if key not in metadata:
            continue
        try:
            msgspec.convert(metadata[key], model, strict=True)
        except msgspec.ValidationError:
            raise ValidationError(
                f"metadata.{key} must be {what}, as a claim names them (or be left out)",
                field=f"metadata.{key}",
            ) from None


class ClaimedTaskBody(msgspec.Struct, kw_only=True):
    """One claimed task: run it, then report on ``run_id``."""

    task_id: UUID
    job_id: UUID
    run_id: UUID
    kind: str
    payload: Any
    attempt: int
    parents: dict[str, Any]
    checkpoint: Any
    lease_expires_at: datetime
    timeout: str | None
    traceparent: Annotated[
        str | None,
        msgspec.Meta(
            description="The job's W3C trace context (issue 16 item 5): continue the trace in"
            " the handler's spans; null when the job was submitted untraced"
        ),
    ] = None


class ClaimBody(msgspec.Struct, kw_only=True):
    """The tasks claimed for the worker (at least one; none is a 204)."""

    tasks: list[ClaimedTaskBody]


class HeartbeatBody(msgspec.Struct, kw_only=True):
    """The renewed lease; ``cancel`` true: stop the handler and report nothing."""

    lease_expires_at: datetime
    cancel: bool


class ReportBody(msgspec.Struct, kw_only=True):
    """``recorded``, or ``duplicate`` for a replay of a report already recorded."""

    outcome: Literal["recorded", "duplicate"]
    retry_at: datetime | None = None


def reported(progress: Any) -> Any:
    """A request's ``progress`` for ``RemoteWorkerService``: ``NO_PROGRESS`` when the field
    was left out, else its value (``None`` included: it clears the checkpoint)."""
    return NO_PROGRESS if progress is msgspec.UNSET else progress


def parse_run_id(value: str) -> UUID:
    """Parse ``{run_id}``.

    Raises:
        ValidationError: not a UUID (field ``run_id``).
    """
    try:
        return UUID(value)
    except ValueError:
        raise ValidationError(f"{value!r} is not a UUID", field="run_id") from None


def require_worker(value: str | None) -> str:
    """The ``X-Worker-Id`` header of a run route.

    Raises:
        ValidationError: the header is missing (field ``X-Worker-Id``).
    """
    if value is None:
        raise ValidationError("the X-Worker-Id header is required", field="X-Worker-Id")
    return value


def parse_wait(value: str) -> float:
    """Parse a claim's ``wait``: a Go duration from 0s to ``MAX_CLAIM_WAIT``, both bounds exact
    and no surrounding whitespace, as every body duration (:func:`~.timing.parse_delay`).

    Raises:
        ValidationError: anything else (field ``wait``).
    """
    return parse_delay(value, field="wait", maximum=MAX_CLAIM_WAIT).total_seconds()


def claimed_task_body(claim: Claim, remote: RemoteWorkerService) -> ClaimedTaskBody:
    """The wire form of one claim."""
    task = claim.task
    return ClaimedTaskBody(
        task_id=task.id,
        job_id=task.job_id,
        run_id=claim.run.id,
        kind=task.kind,
        payload=task.payload,
        attempt=claim.run.attempt_number,
        parents=dict(claim.parents),
        checkpoint=task.progress,
        lease_expires_at=remote.lease_expires_at(claim),
        timeout=None if task.timeout is None else format_duration(task.timeout),
        traceparent=claim.trace_context,
    )


async def _watch_disconnect(request: Request[Any, Any, Any], gone: asyncio.Event) -> None:
    """Set ``gone`` once the client hangs up (the body is already read, so the next ASGI
    message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


#: Errors of every ``/v1/worker`` route: a JSON body is required (415 otherwise).
_BODY_ERRORS = {
    400: responses.BAD_REQUEST,
    413: responses.TOO_LARGE,
    415: responses.UNSUPPORTED,
    **responses.COMMON,
}
_RUN_ERRORS = {404: responses.NOT_FOUND, **_BODY_ERRORS}


class WorkerProtocolController(Controller):
    """The HTTP worker protocol: claim, heartbeat, result, failure, registry."""

    path = "/v1/worker"
    tags = ["worker protocol"]

    @post(
        "/claim",
        status_code=200,
        summary="Long-poll for tasks to run",
        responses={204: responses.NO_TASKS, **_BODY_ERRORS},
        before_request=guards.worker_body(ClaimRequest),
    )
    async def claim(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[ClaimRequest],
        remote: NamedDependency[RemoteWorkerService],
    ) -> Response[ClaimBody | None]:
        """Hold up to ``wait`` for tasks of ``kinds``; 200 with the claimed tasks, 204 with
        none. A client that disconnects meanwhile strands nothing (``RemoteWorkerService``).

        Raises:
            ValidationError: an ``X-Worker-Id`` header (which the run routes read) names
                another worker than the body's ``worker_id``: the runs would be claimed for
                one id and reported under the other (409 ``run_not_owned`` then).
        """
        header = request.headers.get("x-worker-id")
        if header is not None and header != data.worker_id:
            raise ValidationError(
                f"X-Worker-Id {header[:64]!r} is not the body's worker_id"
                f" {data.worker_id!r}: a run is reported under the id it was claimed with",
                field="X-Worker-Id",
            )
        wait = parse_wait(data.wait)
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(request, gone))
        try:
            claims = await remote.claim(
                data.worker_id,
                kinds=data.kinds,
                priorities=data.priorities,
                max_count=data.max_count,
                wait=wait,
                gone=gone,
            )
        finally:
            watcher.cancel()
        if not claims:
            return Response(None, status_code=204)
        return Response(ClaimBody(tasks=[claimed_task_body(c, remote) for c in claims]))

    @post(
        "/runs/{run_id:str}/heartbeat",
        status_code=200,
        summary="Renew a run's lease (and store its progress)",
        responses={409: responses.LEASE_LOST, **_RUN_ERRORS},
        before_request=guards.worker_body(HeartbeatRequest),
    )
    async def heartbeat(
        self,
        run_id: RunId,
        data: JSONBody[HeartbeatRequest],
        remote: NamedDependency[RemoteWorkerService],
        x_worker_id: WorkerIdHeader = None,
    ) -> HeartbeatBody:
        """200 with the new lease deadline; 409 ``lease_lost`` once the run is not live."""
        renewal = await remote.heartbeat(
            parse_run_id(run_id), require_worker(x_worker_id), reported(data.progress)
        )
        return HeartbeatBody(lease_expires_at=renewal.lease_expires_at, cancel=renewal.cancel)

    @post(
        "/runs/{run_id:str}/result",
        status_code=200,
        summary="Report a run's success",
        responses={409: responses.STALE_RUN, **_RUN_ERRORS},
        before_request=guards.worker_body(ResultRequest),
    )
    async def result(
        self,
        run_id: RunId,
        data: JSONBody[ResultRequest],
        remote: NamedDependency[RemoteWorkerService],
        x_worker_id: WorkerIdHeader = None,
    ) -> ReportBody:
        """200 ``recorded`` (or ``duplicate`` for a replay); 409 ``stale_run``."""
        outcome = await remote.succeed(
            parse_run_id(run_id),
            require_worker(x_worker_id),
            data.result,
            progress=reported(data.progress),
        )
        return ReportBody(outcome="recorded" if outcome == "recorded" else "duplicate")

    @post(
        "/results",
        status_code=200,
        summary="Report several runs' successes at once",
        responses=_BODY_ERRORS,
        before_request=guards.worker_body(ResultsRequest),
    )
    async def results(
        self,
        data: JSONBody[ResultsRequest],
        remote: NamedDependency[RemoteWorkerService],
        x_worker_id: WorkerIdHeader = None,
    ) -> ResultsBody:
        """One outcome per report (a stale or foreign run is an outcome, not an error): the
        batched form of ``…/result``, one transaction for the whole batch."""
        worker_id = require_worker(x_worker_id)
        try:
            answers = await remote.succeed_many(
                worker_id, [(r.run_id, r.result, reported(r.progress)) for r in data.reports]
            )
        except InvalidPayload as exc:
            raise InvalidPayload(exc.detail, field=f"reports{exc.field}") from None
        return msgspec.convert({"outcomes": answers}, ResultsBody)

    @post(
        "/runs/{run_id:str}/failure",
        status_code=200,
        summary="Report a run's failure",
        responses={409: responses.STALE_RUN, **_RUN_ERRORS},
        before_request=guards.worker_body(FailureRequest),
    )
    async def failure(
        self,
        run_id: RunId,
        data: JSONBody[FailureRequest],
        remote: NamedDependency[RemoteWorkerService],
        x_worker_id: WorkerIdHeader = None,
    ) -> ReportBody:
        """200 ``recorded`` with ``retry_at`` when a retry is scheduled (or ``duplicate``);
        409 ``stale_run``."""
        failed = await remote.fail(
            parse_run_id(run_id),
            require_worker(x_worker_id),
            data.error,
            permanent=data.permanent,
            progress=reported(data.progress),
        )
        return ReportBody(
            outcome="recorded" if failed.outcome == "recorded" else "duplicate",
            retry_at=failed.retry_at,
        )

    @post(
        "/runs/{run_id:str}/release",
        status_code=200,
        summary="Hand a run's task back unfinished (the worker is shutting down)",
        responses={409: responses.STALE_RUN, **_RUN_ERRORS},
        before_request=guards.worker_body(ReleaseRequest),
    )
    async def release(
        self,
        run_id: RunId,
        data: JSONBody[ReleaseRequest],
        remote: NamedDependency[RemoteWorkerService],
        x_worker_id: WorkerIdHeader = None,
    ) -> ReportBody:
        """200 ``recorded``: the task is queued again at once, no retry charged; 409
        ``stale_run`` when the run is no longer live."""
        await remote.release(
            parse_run_id(run_id),
            require_worker(x_worker_id),
            data.reason,
            progress=reported(data.progress),
        )
        return ReportBody(outcome="recorded")

    @post(
        "/registry",
        status_code=204,
        summary="Record that a worker is alive (its registry row)",
        responses=_BODY_ERRORS,
        before_request=guards.json_body(RegistryRequest),
    )
    async def registry(
        self, data: JSONBody[RegistryRequest], remote: NamedDependency[RemoteWorkerService]
    ) -> None:
        """Upsert the ``workers`` row (``GET /v1/workers`` lists it).

        Raises:
            ValidationError: ``metadata.kinds`` or ``metadata.priorities`` is given but is not
                a list of kinds or priorities (:func:`check_advertised`).
        """
        metadata = dict(data.metadata)
        check_advertised(metadata)
        await remote.register(data.worker_id, data.hostname or None, metadata)

    @post(
        "/registry/remove",
        status_code=204,
        summary="Remove a worker's registry row (it stopped on purpose)",
        responses=_BODY_ERRORS,
        before_request=guards.json_body(RemoveRequest),
    )
    async def remove(
        self, data: JSONBody[RemoveRequest], remote: NamedDependency[RemoteWorkerService]
    ) -> None:
        """Delete the ``workers`` row, also when there is none: the worker no longer counts as
        live (``GET /v1/workers``, explain, submit warnings) until it registers or claims."""
        await remote.unregister(data.worker_id)
