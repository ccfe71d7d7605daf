"""The one error table of the HTTP API and its exception handlers (DESIGN §5, STYLE Entrypoints).

Every error response has the same body, :class:`~dtq.entrypoints.api.schemas.ErrorBody`::

    {"error": {"code": "dependency_cycle",
               "message": "dependency cycle: a -> b -> a (each task depends on the next)",
               "field": "tasks"}}

Domain errors map to a status through :data:`STATUS_BY_ERROR` (the most specific class in the
exception's MRO wins); Litestar's own exceptions (decode/validation errors, unknown route, wrong
method, body too large) and anything unexpected are translated here as well, so no handler
contains a try/except. Each error is logged once per request: a 503 (a backend down or busy:
an outage, not a bug) as one WARNING line naming the error, without a traceback, so an outage
does not flood the log; other 5xx responses log the traceback at ERROR; 4xx responses log one
INFO line without it.

``field`` paths use the domain's notation: dotted keys and ``[i]`` indexes from the body's root
(``tasks[0].kind``), ``id`` for the path parameter, ``active_since`` for the query parameter and
the header name for a header. On ``POST /v1/tasks`` (a one-task job whose body has no ``tasks``
list) a domain error's ``tasks[0].`` prefix is dropped here: ``tasks[0].payload`` -> ``payload``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    SerializationException,
    ValidationException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import HTTPRouteHandler
from litestar.types import ExceptionHandlersMap

from dtq.domain.errors import (
    BackendUnavailable,
    ConcurrentUpdate,
    Conflict,
    DtqError,
    DuplicateIdempotencyKey,
    NotFound,
    ValidationError,
)
from dtq.domain.tokens import Forbidden, Unauthenticated
from dtq.entrypoints.api import refusals
from dtq.entrypoints.api.schemas import ErrorBody, ErrorDetail

logger = logging.getLogger("dtq.api")

#: Sent with every 503: a backend is down or busy, and the client may try again this soon.
RETRY_AFTER_HEADERS: Mapping[str, str] = {"Retry-After": "1"}

#: Domain error class -> HTTP status. Looked up along the exception's MRO, so subclasses
#: (``TaskNotFound``, ``DependencyCycle``, ``InvalidPayload``, ``CommitOutcomeUnknown``...)
#: inherit their family's status. A ``DtqError`` outside every family is a server bug: 500.
STATUS_BY_ERROR: Mapping[type[DtqError], int] = {
    NotFound: 404,
    ValidationError: 400,
    Conflict: 409,  # includes IdempotencyConflict, InvalidTransition, StaleRun
    DuplicateIdempotencyKey: 409,  # a lost idempotency race the service could not resolve
    BackendUnavailable: 503,  # includes CommitOutcomeUnknown: the client should retry
    ConcurrentUpdate: 503,  # the store gave up retrying a conflicting transaction
    Unauthenticated: 401,  # no, unknown, expired or revoked API token (auth.py)
    Forbidden: 403,  # the token lacks the route's scope
}

#: The challenge sent with a 401 (RFC 6750 §3).
WWW_AUTHENTICATE_HEADERS: Mapping[str, str] = {"WWW-Authenticate": "Bearer"}


#: Litestar HTTP exceptions -> stable codes; other statuses fall back to ``http_error``.
class UnsupportedMediaType(HTTPException):
    """HTTP 415: a submission's body is not declared as JSON (``require_json_content_type``)."""

    status_code = 415


#: Status of a request whose client hung up before its body was complete (nginx's 499 "client
#: closed request"): the ``status`` label it is counted under; nobody receives the response.
CLIENT_CLOSED = "499"


class ClientClosedRequest(HTTPException):
    """The client disconnected before sending its whole request body."""

    status_code = int(CLIENT_CLOSED)


class RequestTimeout(HTTPException):
    """HTTP 408: the request body did not arrive in full within the API's body timeout."""

    status_code = 408


class RangeNotSatisfiable(HTTPException):
    """HTTP 416: a download's ``Range`` starts at or past the artifact's end (field ``Range``)."""

    status_code = 416


CODE_BY_HTTP_ERROR: Mapping[type[HTTPException], str] = {
    NotFoundException: "route_not_found",
    MethodNotAllowedException: "method_not_allowed",
    RequestEntityTooLarge: "request_too_large",
    UnsupportedMediaType: "unsupported_media_type",
    ClientClosedRequest: "client_closed_request",
    RequestTimeout: "request_timeout",
    RangeNotSatisfiable: "range_not_satisfiable",
}

#: Litestar HTTP exceptions about one request field -> that field (the header's name).
FIELD_BY_HTTP_ERROR: Mapping[type[HTTPException], str] = {
    RangeNotSatisfiable: "Range",
}

#: Routes whose body is one task of a one-task job: domain errors drop ``tasks[0].`` there.
ONE_TASK_ROUTES = frozenset({"/v1/tasks"})
_ONE_TASK_PREFIX = re.compile(r"^tasks\[0\](?:\.|$)")

#: Handler parameters whose name in an error differs from the Python name.
PARAMETER_FIELDS: Mapping[str, str] = {
    "idempotency_key": "Idempotency-Key",
    "x_worker_id": "X-Worker-Id",
}


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response[ErrorBody]:
    """Build a response with the API's one error body.

    Args:
        status: HTTP status code.
        code: stable machine-readable error code.
        message: human-readable explanation, safe to show a client.
        field: the request field at fault, if any.
        headers: extra response headers (e.g. ``Allow`` on a 405).

    Returns:
        A JSON response.
    """
    return Response(
        ErrorBody(error=ErrorDetail(code=code, message=message, field=field)),
        status_code=status,
        media_type=MediaType.JSON,
        headers=dict(headers) if headers else None,
    )


def status_for(exc: DtqError) -> int:
    """The HTTP status of a domain error: its nearest family in :data:`STATUS_BY_ERROR`."""
    for cls in type(exc).__mro__:
        status = STATUS_BY_ERROR.get(cls)
        if status is not None:
            return status
    return 500


def _log(request: Request[Any, Any, Any], status: int, exc: BaseException, code: str) -> None:
    if status == 503:
        logger.warning(
            "request failed: %s %s -> %d %s: %s",
            request.method,
            request.url.path,
            status,
            code,
            exc,
        )
    elif status >= 500:
        logger.error(
            "request failed: %s %s -> %d %s",
            request.method,
            request.url.path,
            status,
            code,
            exc_info=exc,
        )
    else:
        logger.info(
            "request rejected: %s %s -> %d %s: %s",
            request.method,
            request.url.path,
            status,
            code,
            exc,
        )


def handle_domain_error(request: Request[Any, Any, Any], exc: DtqError) -> Response[ErrorBody]:
    """Map a :class:`~dtq.domain.errors.DtqError` through the table; keep its code and field
    (in the body's own notation on :data:`ONE_TASK_ROUTES`)."""
    status = status_for(exc)
    _log(request, status, exc, exc.code)
    if status >= 500 and status != 503:
        return _internal_error()
    field = exc.field
    if field is not None and request.scope.get("path_template") in ONE_TASK_ROUTES:
        field = _ONE_TASK_PREFIX.sub("", field) or None
    headers = RETRY_AFTER_HEADERS if status == 503 else _challenge(exc)
    return error_response(status, exc.code, exc.detail, field, headers=headers)


def _challenge(exc: DtqError) -> Mapping[str, str] | None:
    """``WWW-Authenticate`` of a 401, and of a 403 (``insufficient_scope``, RFC 6750 §3.1)."""
    if isinstance(exc, Unauthenticated):
        return WWW_AUTHENTICATE_HEADERS
    if isinstance(exc, Forbidden):
        return {"WWW-Authenticate": 'Bearer error="insufficient_scope"'}
    return None


class BodyRefused(ValidationException):
    """A request body that its Struct refused (msgspec's error is the ``__cause__``).

    Args:
        model: the Struct, so that the 400 can list the accepted fields or values.
    """

    def __init__(self, model: type[Any], detail: str) -> None:
        super().__init__(detail=detail)
        self.model = model


def handle_validation_exception(
    request: Request[Any, Any, Any], exc: ValidationException
) -> Response[ErrorBody]:
    """Translate Litestar's decode/validation failure into a 400 naming the field, in the API's
    words (:mod:`dtq.entrypoints.api.refusals`).

    The path of an error msgspec raised is in its message; errors about a parameter (header,
    query) that Litestar raised carry its name in ``extra`` instead.
    """
    cause = exc.__cause__
    field: str | None
    if isinstance(cause, msgspec.ValidationError):
        model = exc.model if isinstance(exc, BodyRefused) else None
        message, field = refusals.describe(cause, model)
    else:
        extra = exc.extra[0] if isinstance(exc.extra, list) and exc.extra else {}
        message = refusals.reason(str(extra.get("message") or exc.detail))
        field = str(extra["key"]) if extra.get("key") else None
    if field is not None:
        field = PARAMETER_FIELDS.get(field, field)
    _log(request, 400, exc, "validation_error")
    return error_response(400, "validation_error", message, field)


def handle_http_exception(
    request: Request[Any, Any, Any], exc: HTTPException
) -> Response[ErrorBody]:
    """Translate Litestar's HTTP exceptions (unknown route, 405, 413, undecodable body) and
    the API's own (415, 416, ...): their code from :data:`CODE_BY_HTTP_ERROR`, their field
    from :data:`FIELD_BY_HTTP_ERROR`."""
    if exc.status_code >= 500:
        return handle_unexpected(request, exc)
    field = next((f for cls, f in FIELD_BY_HTTP_ERROR.items() if isinstance(exc, cls)), None)
    if isinstance(exc.__cause__, SerializationException):
        reason = refusals.reason(exc.__cause__.detail)
        code, message = "invalid_json", f"request body is not valid JSON: {reason}"
    else:
        code = next(
            (c for cls, c in CODE_BY_HTTP_ERROR.items() if isinstance(exc, cls)), "http_error"
        )
        message = exc.detail
        if isinstance(exc, RequestEntityTooLarge) and message == RequestEntityTooLarge.detail:
            message = _body_too_large(request) or message
        elif isinstance(exc, NotFoundException) and code == "route_not_found":
            message = f"no route {request.method} {request.url.path}"
        elif isinstance(exc, MethodNotAllowedException):
            allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
            message = f"{request.method} is not allowed on {request.url.path}" + (
                f" (allowed: {allowed})" if allowed else ""
            )
    _log(request, exc.status_code, exc, code)
    return error_response(exc.status_code, code, message, field, headers=exc.headers)


def _body_too_large(request: Request[Any, Any, Any]) -> str | None:
    """The message of Litestar's own 413 (its words: "Request Entity Too Large"): the route's
    limit, which is ``API_MAX_BODY_BYTES`` (the artifact upload, with its own limit, says so
    itself); None when the route is unknown."""
    handler = request.scope.get("route_handler")
    if not isinstance(handler, HTTPRouteHandler):
        return None
    limit = handler.resolve_request_max_body_size()
    if limit is None:
        return None
    return f"request body larger than API_MAX_BODY_BYTES ({limit} bytes)"


def handle_recursion_error(
    request: Request[Any, Any, Any], exc: RecursionError
) -> Response[ErrorBody]:
    """A body nested deeper than the interpreter's recursion limit (msgspec raises while
    decoding it). dtq's own code paths are iterative, so this is always the client's input."""
    _log(request, 400, exc, "invalid_json")
    return error_response(400, "invalid_json", "request body is nested too deeply")


def _internal_error() -> Response[ErrorBody]:
    return error_response(500, "internal_error", "internal server error")


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """Anything else: a generic 500 for the client, the traceback for the log."""
    _log(request, 500, exc, "internal_error")
    return _internal_error()


#: Registered once on the app (``Litestar(exception_handlers=...)``).
EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    DtqError: handle_domain_error,
    ValidationException: handle_validation_exception,
    HTTPException: handle_http_exception,
    RecursionError: handle_recursion_error,
    Exception: handle_unexpected,
}
