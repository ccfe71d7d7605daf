"""The job page's live updates (issue 16 item 3): ``GET /ui/jobs/{id}/events``, a Server-Sent
Events stream that follows the job's transition outbox as ``GET /v1/events?job_id=`` does (the
same :class:`~dtq.application.events.EventService`), behind the dashboard's session instead of
a bearer token (a browser's ``EventSource`` cannot send one).

It sends ``update`` messages, never the raw events, so a 10,000-task job costs the page what a
five-task job does::

    event: update
    id: <the last event id it covers>
    data: {"job_status": "running", "finished": false, "total": 5,
           "counts": {"pending": 1, "queued": 1, "running": 1, "completed": 2, ...},
           "tasks": {"<task id>": "completed", ...}, "more": false}

The events only say *when* to update; what an update says is read from the store, so the page
never shows a sum of deltas or a status older than its counts. ``counts`` and ``job_status``
come from one count by status on the job's index. ``tasks``: for a job small enough to be drawn
(``pages.MAX_DRAWN_TASKS``) every task's status, read in the same transaction; for a larger
one the last status, from the events, of each task that changed since the previous update (at
most ``MAX_TASKS_PER_UPDATE``; ``more`` says some were left out, and the page then re-reads
the page of tasks it shows, as it does once when the job finishes: the events lag the read by
the settle margin). The first update goes out at once; later ones at most every
``UPDATE_EVERY`` seconds while events flow, and one more when they stop. Each update's ``id``
is the position after the events it covers, so ``EventSource`` resumes with ``Last-Event-ID``
after a dropped connection and misses nothing. Without ``Last-Event-ID`` or ``?after=`` the
stream starts at the horizon of its first read (``EventService.horizon``); the page passes the
horizon of its own read as ``?after=``, so nothing between its render and the connection is
lost either.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any
from uuid import UUID

import msgspec
import structlog
from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromQuery as Query
from litestar.params import HeaderParameter
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from dtq.application.events import (
    EventService,
    format_event_id,
    outlasting_cancel,
    parse_event_id,
)
from dtq.application.ports import EventCursor
from dtq.application.queries import JobCounts, QueryService
from dtq.domain.errors import BackendUnavailable, JobNotFound
from dtq.domain.status import TaskStatus
from dtq.entrypoints.api.events import RECONNECT_MS
from dtq.entrypoints.api.params import ResourceId, parse_id
from dtq.entrypoints.dashboard import pages

#: Most seconds between two updates while events flow (each update reads the job's counts).
UPDATE_EVERY = 1.0
#: Most task statuses from events in one update (a job too large to draw).
MAX_TASKS_PER_UPDATE = 200
#: Seconds of silence after which a ``: keep-alive`` comment goes out.
KEEPALIVE = 15.0

_ENCODER = msgspec.json.Encoder()
_STATUSES = frozenset(s.value for s in TaskStatus)
_log = structlog.get_logger("dtq.dashboard.stream")


def update_message(
    snapshot: JobCounts, tasks: dict[str, str], more: bool, cursor: EventCursor
) -> ServerSentEventMessage:
    """One ``update`` message: the job's status and counts as read; every task's status as
    read when the snapshot has them, else ``tasks`` (those that changed, from the events)."""
    if snapshot.statuses is not None:
        tasks = {str(task_id): status.value for task_id, status in snapshot.statuses.items()}
        more = False
    data: dict[str, Any] = {
        "job_status": snapshot.job.status.value,
        "finished": snapshot.finished,
        "total": sum(snapshot.counts.values()),
        "counts": {status.value: n for status, n in snapshot.counts.items()},
        "tasks": tasks,
        "more": more,
    }
    return ServerSentEventMessage(
        data=_ENCODER.encode(data).decode(), event="update", id=format_event_id(cursor)
    )


class _Changes:
    """The task statuses seen since the last update, bounded."""

    def __init__(self) -> None:
        self.tasks: dict[str, str] = {}
        self.more = False
        self.dirty = False

    def add(self, event_type: str, task_id: UUID | None) -> None:
        self.dirty = True
        kind, _, status = event_type.partition(".")
        if kind != "task" or task_id is None or status not in _STATUSES:
            return
        key = str(task_id)
        if key in self.tasks or len(self.tasks) < MAX_TASKS_PER_UPDATE:
            self.tasks[key] = status
        else:
            self.more = True


async def job_updates(
    queries: QueryService,
    events: EventService,
    snapshot: JobCounts,
    after: EventCursor | None,
) -> AsyncIterator[ServerSentEventMessage]:
    """The stream's messages (see the module docstring) from ``snapshot`` (the first
    update), until the client goes away or the job is finished and every event of it has been
    served: once an update has said ``finished``, the server ends the stream at the first quiet
    moment more than twice the events' settle margin later (so the last transitions, which the
    stream serves only once they are ``settle`` old, are sent first)."""
    yield ServerSentEventMessage(data=None, comment="dtq job updates", retry=RECONNECT_MS)
    loop = asyncio.get_running_loop()
    job_id = snapshot.job.id
    catch_up = 2 * events.policy.settle
    try:
        cursor = after or events.horizon(snapshot.at)
        yield update_message(snapshot, {}, False, cursor)
        last = loop.time()
        finished_at = last if snapshot.finished else None
        changes = _Changes()
        async for batch in events.follow(after=cursor, job_id=job_id, idle=UPDATE_EVERY):
            for event in batch:
                cursor = event.cursor
                changes.add(event.type, event.task_id)
            now = loop.time()
            if changes.dirty and (not batch or now - last >= UPDATE_EVERY):
                snapshot = await read(queries, job_id)
                yield update_message(snapshot, changes.tasks, changes.more, cursor)
                changes, last = _Changes(), now
                if not snapshot.finished:
                    finished_at = None  # (re)opened, e.g. by a manual retry
                elif finished_at is None:
                    finished_at = now
            elif not batch and finished_at is not None and now - finished_at > catch_up:
                return  # finished, and every event of it served: close the stream
            elif not batch and now - last >= KEEPALIVE:
                yield ServerSentEventMessage(data=None, comment="keep-alive")
                last = now
    except BackendUnavailable as exc:
        # The headers are sent: end the stream; EventSource reconnects with its last id.
        _log.warning("job update stream ended", reason=str(exc))
        yield ServerSentEventMessage(data=None, comment="database unavailable: reconnect")
    except JobNotFound:
        yield ServerSentEventMessage(data=None, comment="the job is gone")


async def read(queries: QueryService, job_id: UUID) -> JobCounts:
    """The job's counts, with every task's status when the page draws them all; a client
    that goes away meanwhile does not cut the read short (``outlasting_cancel``)."""
    return await outlasting_cancel(queries.job_counts(job_id, max_tasks=pages.MAX_DRAWN_TASKS))


class StreamController(Controller):
    """``GET /ui/jobs/{id}/events`` (``read`` scope; no session: 401, never a redirect)."""

    path = "/ui"
    include_in_schema = False

    @get("/jobs/{id:str}/events", opt={"dashboard_stream": True})
    async def job_events(
        self,
        queries: NamedDependency[QueryService],
        events: NamedDependency[EventService],
        id: ResourceId,
        after: Query[str | None] = None,
        last_event_id: Annotated[
            str | None, HeaderParameter(name="Last-Event-ID", required=False)
        ] = None,
    ) -> ServerSentEvent:
        """The job's updates as ``text/event-stream``, after ``Last-Event-ID`` (which wins)
        or ``?after=``. 400 for a malformed id (naming ``id``, ``Last-Event-ID`` or
        ``after``), 404 for an unknown job, both before the stream starts."""
        job_id = parse_id(id)
        cursor: EventCursor | None = None
        if last_event_id:
            cursor = parse_event_id(last_event_id, field="Last-Event-ID")
        elif after:
            cursor = parse_event_id(after, field="after")
        snapshot = await read(queries, job_id)
        return ServerSentEvent(job_updates(queries, events, snapshot, cursor))
