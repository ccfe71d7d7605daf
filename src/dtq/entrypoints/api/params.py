"""Non-body parameters shared by the controllers: their types (documented in ``/schema``) and
their parsing. Every function that rejects a value raises a domain
:class:`~dtq.domain.errors.ValidationError` naming the parameter (HTTP 400)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from litestar.params import HeaderParameter, PathParameter

from dtq.domain.errors import ValidationError
from dtq.entrypoints.api.schemas import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN
from dtq.entrypoints.api.timing import exact_request_duration

#: ``{id}`` of ``/v1/tasks/{id}`` and ``/v1/jobs/{id}``. Taken as text and parsed by
#: :func:`parse_id`, so a malformed id is our 400 naming ``id`` (spec §7) rather than a
#: routing 404.
ResourceId = Annotated[
    str,
    PathParameter(format="uuid", description="A UUID; 400 when malformed, 404 when unknown"),
]

#: The W3C ``traceparent`` request header of both submission routes (issue 16 item 5): the
#: ``submit`` span continues that trace. Never refused: a malformed value starts a new trace
#: (W3C Trace Context §4.3), and it is ignored while tracing is off.
TraceParent = Annotated[
    str | None,
    HeaderParameter(
        name="traceparent",
        required=False,
        description=(
            "W3C trace context of the caller; the submit, claim, handler and complete spans "
            "join this trace when the orchestrator exports traces (OTEL_EXPORTER_OTLP_ENDPOINT)."
        ),
    ),
]

#: The ``Idempotency-Key`` request header of both submission routes.
IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        required=False,
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description=(
            "Makes the submission safe to retry: the same key with the same body returns the "
            "original ids with 200; with a different body, 409 idempotency_conflict. "
            "1..255 printable ASCII characters."
        ),
    ),
]

#: ``GET /v1/workers`` window when ``active_since`` is absent (spec §7).
DEFAULT_ACTIVE_SINCE = "2m"
#: The longest ``active_since`` window, in seconds: Go's longest duration in whole seconds
#: (``2562047h47m16s``, about 292 years), as the error message states it.
MAX_ACTIVE_SINCE = 9_223_372_036


def parse_id(value: str) -> UUID:
    """Parse the ``{id}`` path parameter.

    Raises:
        ValidationError: not a UUID (field ``id``), spec §7: 400 if id is not a UUID.
    """
    try:
        return UUID(value)
    except ValueError:
        raise ValidationError(f"{value!r} is not a UUID", field="id") from None


def parse_active_since(value: str) -> float:
    """Parse ``?active_since=``: a Go ``time.ParseDuration`` string such as ``90s``, ``5m``,
    ``1h30m`` (units ns, us, ms, s, m, h; the grammar of the configuration variables).

    Returns:
        The window in seconds, in ``(0, MAX_ACTIVE_SINCE]``.

    Raises:
        ValidationError: not a Go duration, not positive, or longer than
            ``MAX_ACTIVE_SINCE`` (field ``active_since``).
    """
    message = (
        "active_since must be a positive Go duration of at most 2562047h47m16s "
        f"(e.g. 30s, 5m, 1h30m), got {value!r}"
    )
    try:
        exact = exact_request_duration(value, field="active_since")
    except ValidationError:
        raise ValidationError(message, field="active_since") from None
    if not 0 < exact <= MAX_ACTIVE_SINCE:  # exact: 1ns is positive, 16.5s past the bound
        raise ValidationError(message, field="active_since")
    return float(exact)


#: ``GET /v1/jobs/{id}/results`` page size when ``limit`` is absent, and its largest value.
DEFAULT_RESULTS_LIMIT = 100
MAX_RESULTS_LIMIT = 1000
#: Largest cursor position: the database stores positions as ``BIGINT`` (signed 64-bit).
MAX_CURSOR_POSITION = 2**63 - 1


def parse_limit(value: str) -> int:
    """Parse ``?limit=``: an integer in ``1..MAX_RESULTS_LIMIT``.

    Raises:
        ValidationError: anything else (field ``limit``).
    """
    message = f"limit must be an integer from 1 to {MAX_RESULTS_LIMIT}, got {value!r}"
    if not value.isascii() or not value.isdigit():
        raise ValidationError(message, field="limit")
    limit = int(value)
    if not 1 <= limit <= MAX_RESULTS_LIMIT:
        raise ValidationError(message, field="limit")
    return limit


def format_cursor(after: tuple[int, UUID]) -> str:
    """The opaque ``next_cursor`` of a results page: ``<position>.<task id hex>``."""
    return f"{after[0]}.{after[1].hex}"


def parse_cursor(value: str | None) -> tuple[int, UUID] | None:
    """Parse ``?cursor=`` (a ``next_cursor`` from a previous page); None or empty: first page.

    Raises:
        ValidationError: not a cursor this API issued (field ``cursor``), including a
            position outside ``0..MAX_CURSOR_POSITION``.
    """
    if not value:
        return None
    position, _, task_id = value.partition(".")
    try:
        if not position.isascii() or not position.isdigit() or len(task_id) != 32:
            raise ValueError(value)
        if len(position) > len(str(MAX_CURSOR_POSITION)) or int(position) > MAX_CURSOR_POSITION:
            raise ValueError(value)
        return int(position), UUID(hex=task_id)
    except ValueError:
        raise ValidationError(
            f"{value!r} is not a cursor: pass next_cursor from the previous page", field="cursor"
        ) from None
