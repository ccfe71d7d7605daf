"""Bulk cancel and retry by filter, and the background operations they start (issue 14 item 6):
``POST /v1/tasks/cancel``, ``POST /v1/tasks/retry``, ``GET /v1/operations/{id}``."""

from __future__ import annotations

from litestar import Controller, Response, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from dtq.application.bulk import BulkAction, BulkService, Operation
from dtq.application.filters import TaskFilter
from dtq.domain.errors import ValidationError
from dtq.domain.status import TaskStatus
from dtq.entrypoints.api import filters, guards, responses
from dtq.entrypoints.api.params import ResourceId, parse_id
from dtq.entrypoints.api.schemas import BulkDryRunBody, BulkRequest, OperationBody

DRY_RUN = ResponseSpec(
    data_container=BulkDryRunBody,
    description="dry_run: how many tasks match now; nothing changed",
    generate_examples=False,
)
BULK_RESPONSES = {200: DRY_RUN, **responses.BULK}


def bulk_filter(body: BulkRequest) -> TaskFilter:
    """The body's filters as a :class:`TaskFilter` (the listing's rules, same 400s). An empty
    ``status`` list is refused: it names no status, and never means "any status".

    Raises:
        ValidationError: naming ``status``, ``kind``, ``job_id``, ``priority``, ``since`` or
            ``until``.
    """
    if body.status == []:
        raise ValidationError("status must name at least one status", field="status")
    status = [body.status] if isinstance(body.status, str) else body.status
    return filters.task_filter(
        status=status,
        kind=body.kind,
        job_id=body.job_id,
        priority=body.priority,
        since=body.since,
        until=body.until,
    )


def operation_body(op: Operation) -> OperationBody:
    """The wire form of an operation."""
    return OperationBody(
        id=op.id,
        kind=op.kind.value,
        status=op.status.value,
        matched=op.matched,
        changed=op.changed,
        skipped=op.skipped,
        cascaded=op.cascaded,
        error=op.error,
        created_at=op.created_at,
        finished_at=op.finished_at,
    )


#: The statuses each bulk action can change (a task in another status is skipped).
ACTIONABLE: dict[BulkAction, frozenset[TaskStatus]] = {
    BulkAction.CANCEL: frozenset({TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING}),
    BulkAction.RETRY: frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED}),
}


def check_actionable(action: BulkAction, where: TaskFilter) -> None:
    """Refuse a ``status`` filter naming a status the action never changes (a bulk retry of
    ``completed`` tasks would start, match and skip every one of them).

    Raises:
        ValidationError: naming ``status``.
    """
    refused = sorted(s.value for s in where.statuses - ACTIONABLE[action])
    if refused:
        accepted = " or ".join(sorted(s.value for s in ACTIONABLE[action]))
        raise ValidationError(
            f"a bulk {action.value} never changes {', '.join(refused)} tasks; "
            f"status must be {accepted}",
            field="status",
        )


async def _start(
    bulk: BulkService, action: BulkAction, body: BulkRequest
) -> Response[OperationBody | BulkDryRunBody]:
    where = bulk_filter(body)
    check_actionable(action, where)
    if body.dry_run:
        counted = await bulk.run(action, where, dry_run=True)
        return Response(BulkDryRunBody(matched=counted.matched, changed=0), status_code=200)
    op = await bulk.start(action, where)
    return Response(
        operation_body(op), status_code=202, headers={"Location": f"/v1/operations/{op.id}"}
    )


class BulkController(Controller):
    """``POST /v1/tasks/cancel`` and ``POST /v1/tasks/retry``."""

    path = "/v1/tasks"
    tags = ["tasks"]

    @post(
        "/cancel",
        status_code=202,
        summary="Cancel every task a filter selects (a background operation)",
        responses=BULK_RESPONSES,
        before_request=guards.json_body(BulkRequest),
    )
    async def bulk_cancel(
        self, *, data: JSONBody[BulkRequest], bulk: NamedDependency[BulkService]
    ) -> Response[OperationBody | BulkDryRunBody]:
        """Each matching ``pending``/``queued``/``running`` task -> ``cancelled`` (as
        ``POST /v1/tasks/{id}/cancel``), 500 per transaction, in the background: 202 with the
        operation (``Location: /v1/operations/{id}``). ``dry_run``: 200 with the count. 400
        naming ``body`` when no filter is given, or the field that is unknown or malformed."""
        return await _start(bulk, BulkAction.CANCEL, data)

    @post(
        "/retry",
        status_code=202,
        summary="Retry every failed or cancelled task a filter selects (a background operation)",
        responses=BULK_RESPONSES,
        before_request=guards.json_body(BulkRequest),
    )
    async def bulk_retry(
        self, *, data: JSONBody[BulkRequest], bulk: NamedDependency[BulkService]
    ) -> Response[OperationBody | BulkDryRunBody]:
        """Each matching ``failed``/``cancelled`` task -> ``queued`` (as
        ``POST /v1/tasks/{id}/retry``), 500 per transaction, in the background: 202 with the
        operation. ``dry_run``: 200 with the count. 400 as for the bulk cancel."""
        return await _start(bulk, BulkAction.RETRY, data)


class OperationController(Controller):
    """``GET /v1/operations/{id}``."""

    path = "/v1/operations"
    tags = ["operations"]

    @get(
        "/{id:str}",
        summary="A bulk operation's progress",
        responses=responses.READ_BY_ID,
        before_request=guards.no_input,
    )
    async def get_operation(
        self, id: ResourceId, bulk: NamedDependency[BulkService]
    ) -> OperationBody:
        """Its status and counts now; 404 for an id this orchestrator did not start (or has
        forgotten: it keeps the last 1,000 finished ones until it restarts), 400 not a UUID."""
        return operation_body(await bulk.get(parse_id(id)))
