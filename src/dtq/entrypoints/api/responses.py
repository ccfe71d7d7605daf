"""OpenAPI documentation of the error responses each route can give (spec §7).

Every error body is :class:`~dtq.entrypoints.api.schemas.ErrorBody`; these specs only say which
statuses a route documents and why, so ``/schema`` matches what the error table returns.
"""

from __future__ import annotations

from litestar.openapi.datastructures import ResponseSpec

from dtq.entrypoints.api.schemas import ErrorBody


def _error(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=ErrorBody, description=description, generate_examples=False)


BAD_REQUEST = _error(
    "Invalid input: malformed JSON, wrong or missing field, limit exceeded, invalid payload, "
    "invalid dependency graph; `field` names the culprit"
)
NOT_FOUND = _error("No object has this id")
CONFLICT = _error("Idempotency-Key reused with a different request (`idempotency_conflict`)")
TOO_LARGE = _error("Request body larger than API_MAX_BODY_BYTES (`request_too_large`)")
UNSUPPORTED = _error(
    "Content-Type is not application/json (`unsupported_media_type`); a body sent as a form or "
    "plain text is refused, so a browser cannot submit cross-site without a CORS preflight"
)
INTERNAL = _error("Unexpected server error (`internal_error`); details are only logged")
UNAVAILABLE = _error("Database or Redis unavailable (`backend_unavailable`); retry later")

UNAUTHENTICATED = _error(
    "No API token, or one that is not valid, expired or revoked (`unauthenticated`; "
    "`WWW-Authenticate: Bearer`)"
)
FORBIDDEN = _error("The token lacks the scope this route needs (`forbidden`, naming it)")

#: Errors of every route that needs a token (``API_AUTH=tokens``; ``auth.document_security``).
AUTH = {401: UNAUTHENTICATED, 403: FORBIDDEN}
NO_TASKS = ResponseSpec(
    data_container=None, description="No task arrived within `wait`", generate_examples=False
)
LEASE_LOST = _error(
    "The run is no longer the task's live run (`lease_lost`: stop the handler, report nothing),"
    " or it was claimed by another worker id (`run_not_owned`)"
)
STALE_RUN = _error(
    "The run is no longer the task's live run (`stale_run`: reclaimed; nothing changed), or it"
    " was claimed by another worker id (`run_not_owned`)"
)

#: Errors any route can give.
COMMON = {500: INTERNAL, 503: UNAVAILABLE}
#: Errors of the two submission routes.
SUBMIT = {400: BAD_REQUEST, 409: CONFLICT, 413: TOO_LARGE, 415: UNSUPPORTED, **COMMON}
#: Errors of the read routes addressed by ``{id}``.
READ_BY_ID = {400: BAD_REQUEST, 404: NOT_FOUND, **COMMON}


#: ``POST /v1/tasks/{id}/cancel`` and ``POST /v1/jobs/{id}/cancel`` (issue 14 item 1).
CANCEL = {
    400: BAD_REQUEST,
    404: NOT_FOUND,
    409: _error("The task (or job) has already completed or failed (`not_cancellable`)"),
    **COMMON,
}
#: ``POST /v1/tasks/{id}/retry`` (issue 14 item 4).
RETRY = {
    400: BAD_REQUEST,
    404: NOT_FOUND,
    409: _error("The task is not failed or cancelled, or a dependency of it is (`not_retryable`)"),
    **COMMON,
}
