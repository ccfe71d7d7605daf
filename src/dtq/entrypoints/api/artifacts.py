"""``/v1/artifacts``: upload an artifact as a raw body, download it whole or by byte range.

``POST /v1/artifacts`` takes any content type (the JSON-only guard of the submission routes does
not apply) and streams the body to the artifact store chunk by chunk, counting it against
``API_MAX_ARTIFACT_BYTES`` (413 ``request_too_large`` past it; the upload is then discarded
whole, as it is when the client hangs up mid-body). ``GET /v1/artifacts/{id}`` streams the bytes;
with ``Range: bytes=a-b`` (also ``a-`` and the suffix form ``-n``; one range only) it answers
206 with ``Content-Range``, and 416 with ``Content-Range: bytes */size`` when the range starts
at or past the end (``range_not_satisfiable``, field ``Range``). ``HEAD`` gives the size in
``Content-Length``. Errors: 400 for a malformed id or ``Range`` (``field`` names it), 404 for an
unknown id (``field`` ``id``, the path parameter, as for a malformed one).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, MediaType, Request, Response, get, head, post
from litestar.di import NamedDependency
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import HeaderParameter
from litestar.response import Stream

from dtq.application.artifacts import ArtifactService
from dtq.domain.errors import ValidationError
from dtq.entrypoints.api import guards, responses
from dtq.entrypoints.api.errors import RangeNotSatisfiable
from dtq.entrypoints.api.params import ResourceId
from dtq.entrypoints.api.schemas import ErrorBody
from dtq.entrypoints.config import Settings

OCTET_STREAM = "application/octet-stream"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class ArtifactBody(msgspec.Struct, kw_only=True):
    """An artifact's reference: what ``task.artifacts.open`` and ``GET`` take."""

    artifact_id: str
    size: int
    sha256: str


class InvalidRange(ValidationError):
    """The Range header is not one ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` range."""

    code = "invalid_range"


RangeHeader = Annotated[
    str | None,
    HeaderParameter(
        name="Range",
        required=False,
        description="One byte range: `bytes=a-b` (inclusive), `bytes=a-` or `bytes=-n`",
    ),
]

_READ = {
    **responses.READ_BY_ID,
    416: ResponseSpec(
        data_container=ErrorBody,
        description="Range starts at or past the end (`range_not_satisfiable`, field `Range`)",
        generate_examples=False,
    ),
}
_TOO_LARGE = ResponseSpec(
    data_container=ErrorBody,
    description="Body larger than API_MAX_ARTIFACT_BYTES (`request_too_large`); nothing is kept",
    generate_examples=False,
)


def parse_range(header: str, size: int) -> tuple[int, int]:
    """``(start, length)`` of a ``Range`` header against an artifact of ``size`` bytes.

    Raises:
        InvalidRange: malformed, several ranges, or ``b < a`` (HTTP 400, field ``Range``).
        RangeNotSatisfiable: the range starts at or past ``size`` (HTTP 416
            ``range_not_satisfiable``, field ``Range``).
    """
    match = _RANGE.fullmatch(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        raise InvalidRange(f"Range must be bytes=a-b, bytes=a- or bytes=-n, got {header!r}",
                           field="Range")  # fmt: skip
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix: the last n bytes
        start = max(0, size - int(last))
        end = size - 1
    else:
        start = int(first)
        end = size - 1 if last == "" else min(int(last), size - 1)
        if last != "" and int(last) < start:
            raise InvalidRange(f"Range end precedes its start: {header!r}", field="Range")
    if start >= size or end < start:
        raise RangeNotSatisfiable(
            detail=f"range {header!r} is outside the artifact's {size} bytes",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return start, end - start + 1


class ArtifactController(Controller):
    """Artifacts: ``POST /v1/artifacts``, ``GET`` and ``HEAD /v1/artifacts/{id}``."""

    path = "/v1/artifacts"
    tags = ["artifacts"]

    @post(
        "/",
        status_code=201,
        summary="Upload an artifact (raw body, any content type)",
        description="The body is stored as is; at most API_MAX_ARTIFACT_BYTES (413 past it).",
        request_max_body_size=None,  # counted here against API_MAX_ARTIFACT_BYTES, streamed
        responses={413: _TOO_LARGE, **responses.COMMON},
        before_request=guards.no_query,
    )
    async def upload(
        self,
        request: Request[Any, Any, Any],
        artifacts: NamedDependency[ArtifactService],
        settings: NamedDependency[Settings],
    ) -> ArtifactBody:
        """Stream the request body into a new artifact; 201 with its id, size and SHA-256."""
        limit = settings.api_max_artifact_bytes
        declared = request.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestEntityTooLarge(detail=_too_large(limit))

        async def body() -> AsyncIterator[bytes]:
            received = 0
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    raise RequestEntityTooLarge(detail=_too_large(limit))
                yield chunk

        info = await artifacts.put(body())
        return ArtifactBody(artifact_id=info.artifact_id, size=info.size, sha256=info.sha256)

    @get(
        "/{id:str}",
        summary="Download an artifact, whole or one byte range",
        responses=_READ,
        before_request=guards.no_query,
    )
    async def download(
        self,
        id: ResourceId,
        artifacts: NamedDependency[ArtifactService],
        range_header: RangeHeader = None,
    ) -> Stream:
        """200 with the bytes, or 206 with one range (``Content-Range``); 416 outside it."""
        size = await artifacts.stat(id)
        headers = {"Accept-Ranges": "bytes"}
        if range_header is None:
            stream = await artifacts.open(id)
            headers["Content-Length"] = str(size)
            return Stream(stream, media_type=OCTET_STREAM, headers=headers)
        start, length = parse_range(range_header, size)
        stream = await artifacts.open(id, start, length)
        headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
        headers["Content-Length"] = str(length)
        return Stream(stream, status_code=206, media_type=OCTET_STREAM, headers=headers)

    @head(
        "/{id:str}",
        summary="An artifact's size (Content-Length)",
        responses=responses.READ_BY_ID,
        before_request=guards.no_query,
    )
    async def size(
        self, id: ResourceId, artifacts: NamedDependency[ArtifactService]
    ) -> Response[None]:
        """200 with ``Content-Length`` = the artifact's size in bytes, no body."""
        size = await artifacts.stat(id)
        return Response(
            None,  # rendered as no bytes under the text media type; HEAD sends no body
            media_type=MediaType.TEXT,
            # GET's headers: its Content-Type replaces the text one
            headers={
                "Content-Type": OCTET_STREAM,
                "Content-Length": str(size),
                "Accept-Ranges": "bytes",
            },
        )


def _too_large(limit: int) -> str:
    return f"artifact larger than API_MAX_ARTIFACT_BYTES ({limit} bytes)"
