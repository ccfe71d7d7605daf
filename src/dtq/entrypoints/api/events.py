"""``GET /v1/events``: the transition outbox as a Server-Sent Events stream (issue 16 item 1).

Each event is sent as ``id: <cursor>``, ``event: <type>`` and ``data: <JSON>`` (the event's
``id``, ``type``, ``job_id``, ``task_id``, ``data`` and ``created_at``). A client resumes after
the last event it received by sending its id back as ``Last-Event-ID`` (browsers' EventSource
does so on reconnect) or ``?after=``; the header wins. A comment line (``: keep-alive``) is sent
after ``heartbeat`` seconds without events so proxies keep the connection open. The query is
checked before the stream starts (400 naming the parameter, 404 for an unknown ``job_id``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any
from uuid import UUID

import msgspec
import structlog
from litestar import Controller, Request, get
from litestar.di import NamedDependency
from litestar.params import HeaderParameter, QueryParameter
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from dtq.application.events import (
    EventService,
    check_types,
    event_document,
    parse_event_id,
)
from dtq.application.ports import Event, EventCursor
from dtq.domain.errors import BackendUnavailable, ValidationError
from dtq.entrypoints.api import filters, guards, responses

_ENCODER = msgspec.json.Encoder()
_log = structlog.get_logger("dtq.api.events")

#: Milliseconds a browser's EventSource waits before it reconnects (``retry:``).
RECONNECT_MS = 1000
#: The stream's query parameters: any other (a misspelt ``?types=``) is a 400, not an
#: unfiltered stream.
EVENT_PARAMS = frozenset({"job_id", "kinds", "after"})


def event_message(event: Event) -> ServerSentEventMessage:
    """One event as an SSE message."""
    document = event_document(event)
    return ServerSentEventMessage(
        data=_ENCODER.encode(document).decode(), event=event.type, id=document["id"]
    )


async def _messages(
    events: EventService,
    after: EventCursor | None,
    job_id: UUID | None,
    types: Sequence[str] | None,
) -> AsyncIterator[ServerSentEventMessage]:
    yield ServerSentEventMessage(data=None, comment="dtq events", retry=RECONNECT_MS)
    try:
        async for batch in events.follow(after=after, job_id=job_id, types=types):
            if not batch:
                yield ServerSentEventMessage(data=None, comment="keep-alive")
            for event in batch:
                yield event_message(event)
    except BackendUnavailable as exc:
        # The headers are sent: end the stream; the client reconnects with its last id.
        _log.warning("event stream ended", reason=str(exc))
        yield ServerSentEventMessage(data=None, comment="database unavailable: reconnect")


class EventController(Controller):
    """The event stream: ``GET /v1/events``."""

    path = "/v1/events"
    tags = ["events"]

    @get(
        "/",
        summary="Stream task and job transitions (Server-Sent Events)",
        responses={400: responses.BAD_REQUEST, 404: responses.NOT_FOUND, **responses.COMMON},
    )
    async def stream(
        self,
        *,
        request: Request[Any, Any, Any],
        events: NamedDependency[EventService],
        job_id: Annotated[
            str | None,
            QueryParameter(description="Only this job's events (a UUID)", required=False),
        ] = None,
        kinds: Annotated[
            str | None,
            QueryParameter(
                description="Comma-separated event types, e.g. task.failed,job.completed",
                required=False,
            ),
        ] = None,
        after: Annotated[
            str | None,
            QueryParameter(description="Resume after this event id", required=False),
        ] = None,
        last_event_id: Annotated[
            str | None,
            HeaderParameter(
                name="Last-Event-ID", required=False, description="Resume after this event id"
            ),
        ] = None,
    ) -> ServerSentEvent:
        """Every transition after the given position, in order, for as long as the client
        stays connected. ``Last-Event-ID`` wins over ``after`` (an ``EventSource`` reconnecting
        sends the header to the url it was opened with). 400 for a malformed ``job_id``,
        ``kinds`` (an empty one included) or event id, an unknown parameter or one given twice,
        a ``Last-Event-ID`` given twice; 404 for an unknown job."""
        filters.check_names((k for k, _ in request.query_params.multi_items()), EVENT_PARAMS)
        guards.single_header(request.headers, "Last-Event-ID")
        cursor: EventCursor | None = None
        if last_event_id:
            cursor = parse_event_id(last_event_id, field="Last-Event-ID")
        elif after:
            cursor = parse_event_id(after, field="after")
        job: UUID | None = None
        if job_id is not None:
            try:
                job = UUID(job_id)
            except ValueError:
                raise ValidationError(f"{job_id!r} is not a UUID", field="job_id") from None
            await events.check_job(job)
        types = None
        if kinds is not None:
            types = check_types([k.strip() for k in kinds.split(",") if k.strip()], field="kinds")
            if not types:
                raise ValidationError("kinds names no event type", field="kinds")
        return ServerSentEvent(_messages(events, cursor, job, types))
