"""Exceptions of :mod:`dtq.client`: one per API error code, carrying the error body's fields.

Every non-2xx answer of the orchestrator carries ``{"error": {"code", "message", "field"}}``
(spec §7). :func:`error_for` turns one into the most specific :class:`ApiError` subclass: by
``code`` first, then by HTTP status; a body that is not the error shape (a proxy's HTML page)
still gives an :class:`ApiError` with code ``http_<status>``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ApiError",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidRequest",
    "LeaseLost",
    "NotCancellable",
    "NotFound",
    "NotRetryable",
    "RateLimited",
    "StaleRun",
    "TransportError",
    "Unauthenticated",
    "Unavailable",
    "WaitTimeout",
    "error_for",
]


class ApiError(Exception):
    """The orchestrator refused a request.

    Attributes:
        status: the HTTP status code.
        code: the API's stable error code (``dependency_cycle``, ``task_not_found``, …).
        message: the API's human-readable explanation, safe to show.
        field: the request field at fault (``tasks[0].payload``), or None.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class BadRequest(ApiError):
    """400/413/415/422: the request was malformed or broke a limit; ``field`` names where."""


class Unauthenticated(ApiError):
    """401: no token, or a bad, expired or revoked one (``DTQ_TOKEN``)."""


class Forbidden(ApiError):
    """403: the token lacks the scope the route needs."""


class NotFound(ApiError):
    """404: no task, job, run or artifact has this id."""


class Conflict(ApiError):
    """409: the request conflicts with the current state."""


class IdempotencyConflict(Conflict):
    """409 ``idempotency_conflict``: the Idempotency-Key was used with a different body."""


class NotCancellable(Conflict):
    """409 ``not_cancellable``: the task already completed or failed."""


class NotRetryable(Conflict):
    """409 ``not_retryable``: only a failed or cancelled task can be retried."""


class StaleRun(Conflict):
    """409 ``stale_run``: the run is no longer the task's live run."""


class LeaseLost(Conflict):
    """409 ``lease_lost``: the run's lease is gone; stop working on the task."""


class RateLimited(ApiError):
    """429: too many requests (retried by the client, honouring ``Retry-After``)."""


class Unavailable(ApiError):
    """503: the database or Redis is unavailable (retried by the client, honouring
    ``Retry-After``)."""


class InvalidRequest(ValueError):
    """The request cannot be sent as given (an Idempotency-Key outside printable ASCII, a
    string holding a lone UTF-16 surrogate); nothing was sent. The message starts with the
    path of the part at fault where there is one (``payload.a.b: ...``)."""


class TransportError(Exception):
    """The orchestrator could not be reached (connection refused, reset, timed out) after the
    client's retries."""


class WaitTimeout(TimeoutError):
    """``wait()`` gave up: the job was not finished within its timeout.

    Attributes:
        job_id: the job waited for.
        status: its status at the last look.
    """

    def __init__(self, job_id: str, status: str, timeout: float) -> None:
        super().__init__(f"job {job_id} still {status} after {timeout:g}s")
        self.job_id = job_id
        self.status = status


_BY_CODE: Mapping[str, type[ApiError]] = {
    "idempotency_conflict": IdempotencyConflict,
    "not_cancellable": NotCancellable,
    "not_retryable": NotRetryable,
    "stale_run": StaleRun,
    "lease_lost": LeaseLost,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
}

_BY_STATUS: Mapping[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    415: BadRequest,
    422: BadRequest,
    429: RateLimited,
    503: Unavailable,
}


def error_for(status: int, body: object) -> ApiError:
    """The exception for an error response: ``status`` and its decoded JSON ``body`` (or None
    when the body was not JSON)."""
    code, message, field = f"http_{status}", f"HTTP {status}", None
    if isinstance(body, dict) and isinstance(detail := body.get("error"), dict):
        code = str(detail.get("code") or code)
        message = str(detail.get("message") or message)
        raw_field = detail.get("field")
        field = str(raw_field) if raw_field is not None else None
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = Unavailable if status >= 500 else ApiError
    return cls(status, code, message, field)
