"""Typed non-body parameters shared by the controllers (documented in ``/schema``)."""

from __future__ import annotations

from typing import Annotated

from litestar.params import HeaderParameter, PathParameter

from dtq.entrypoints.api.schemas import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN

#: ``{id}`` of ``/v1/tasks/{id}`` and ``/v1/jobs/{id}``. Taken as text and parsed by
#: :func:`dtq.entrypoints.api.convert.parse_id`, so a malformed id is our 400 naming ``id``
#: (spec §7) rather than a routing 404.
ResourceId = Annotated[
    str,
    PathParameter(format="uuid", description="A UUID; 400 when malformed, 404 when unknown"),
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
