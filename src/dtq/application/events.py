"""The event stream's read side (issue 16 item 1): pages of the transition outbox, and the
bounded-interval poll that follows it.

The outbox itself is written by the store with every transition (``EventRepository``); this
service only reads it, in ``(created_at, id)`` order below the visibility horizon, so a reader
never passes over an event of a transaction that has not committed yet (ARCHITECTURE.md,
"Outbox and event stream").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from dtq.application.ports import Event, EventCursor, Store, Transaction
from dtq.domain.errors import JobNotFound, ValidationError
from dtq.domain.events import EVENT_TYPES

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_event_id(cursor: EventCursor) -> str:
    """The SSE ``id`` of an event: ``<microseconds since the epoch>-<event id hex>``."""
    micros = (cursor.created_at - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}-{cursor.id.hex}"


def event_document(event: Event) -> dict[str, Any]:
    """An event as the stream and the webhooks send it: ``id`` (:func:`format_event_id`),
    ``type``, ``job_id``, ``task_id`` (null for a job event), ``data``, ``created_at`` (ISO
    8601), ready for a JSON encoder."""
    return {
        "id": format_event_id(event.cursor),
        "type": event.type,
        "job_id": str(event.job_id),
        "task_id": None if event.task_id is None else str(event.task_id),
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }


def parse_event_id(value: str, *, field: str) -> EventCursor:
    """Parse an event id given back as ``Last-Event-ID`` or ``?after=``.

    Raises:
        ValidationError: not an id this stream issued (naming ``field``).
    """
    micros, _, hex_id = value.partition("-")
    try:
        if not micros.isascii() or not micros.isdigit() or len(micros) > 18 or len(hex_id) != 32:
            raise ValueError(value)
        return EventCursor(_EPOCH + timedelta(microseconds=int(micros)), UUID(hex=hex_id))
    except (ValueError, OverflowError):
        raise ValidationError(
            f"{value!r} is not an event id: pass the id of the last event received", field=field
        ) from None


def check_types(types: Sequence[str], *, field: str) -> tuple[str, ...]:
    """The event types of a filter, each one of ``EVENT_TYPES``.

    Raises:
        ValidationError: an unknown type (naming ``field``).
    """
    for kind in types:
        if kind not in EVENT_TYPES:
            raise ValidationError(
                f"unknown event type {kind!r}; expected some of {', '.join(EVENT_TYPES)}",
                field=field,
            )
    return tuple(dict.fromkeys(types))


@dataclass(frozen=True, slots=True)
class EventStreamPolicy:
    """How the stream reads the outbox.

    Attributes:
        settle: seconds an event must be old (database clock) before it is served: longer
            than the time from the outbox insert to COMMIT plus the clock offset between
            database nodes (``EVENTS_SETTLE``).
        poll_interval: seconds between reads when the stream is caught up
            (``EVENTS_POLL_INTERVAL``).
        heartbeat: seconds of silence after which ``follow`` yields an empty batch, so the
            caller can send a keep-alive.
        page_size: most events read per statement.
    """

    settle: float = 1.0
    poll_interval: float = 0.25
    heartbeat: float = 15.0
    page_size: int = 500


class EventService:
    """Reads the outbox for ``GET /v1/events``.

    Args:
        store: the system of record.
        policy: the stream's timings.
    """

    def __init__(self, *, store: Store, policy: EventStreamPolicy | None = None) -> None:
        self._store = store
        self.policy = policy or EventStreamPolicy()

    async def page(
        self,
        *,
        after: EventCursor | None,
        job_id: UUID | None = None,
        types: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The next committed events after ``after`` (one short transaction), oldest first."""
        size = limit or self.policy.page_size

        async def read(tx: Transaction) -> list[Event]:
            return await tx.events.page(
                after=after, job_id=job_id, types=types, settle=self.policy.settle, limit=size
            )

        return await self._store.run(read)

    def horizon(self, at: datetime) -> EventCursor:
        """Where to follow from so that no event is missed of a change that was not yet
        visible to a read made at database time ``at``: ``2 * settle`` before ``at`` (an
        event older than ``settle`` has committed, see the policy), before any event id of
        that instant. Events a little older than the read may come again: the follower's
        updates must be idempotent (a status set, not a count moved)."""
        return EventCursor(at - timedelta(seconds=2 * self.policy.settle), UUID(int=0))

    async def check_job(self, job_id: UUID) -> None:
        """Raise ``JobNotFound`` (field ``job_id``) unless the job exists."""

        async def read(tx: Transaction) -> bool:
            return await tx.jobs.get(job_id) is not None

        if not await self._store.run(read):
            raise JobNotFound(f"job {job_id} not found", field="job_id")

    async def follow(
        self,
        *,
        after: EventCursor | None,
        job_id: UUID | None = None,
        types: Sequence[str] | None = None,
        idle: float | None = None,
    ) -> AsyncIterator[list[Event]]:
        """Every event after ``after``, for ever, in order, each exactly once per follower.

        Reads a page; when it is full reads the next at once, else sleeps ``poll_interval``.
        Yields each non-empty batch, and an empty list after ``idle`` seconds of silence
        (default: the policy's ``heartbeat``), then again after each further ``idle``.
        A follower cancelled during a read (its client went away) stops at once, and the read
        finishes on its own: a query cancelled in flight would cost the pool its connection.
        ``types`` is applied to the pages read, not in the query, so the cursor moves over the
        events it leaves out and each read costs only the events committed since the last one,
        however rare the wanted types are. Store errors propagate (the caller's stream ends;
        the client resumes from its last id).
        """
        cursor = after
        quiet = 0.0
        silence = self.policy.heartbeat if idle is None else idle
        wanted = None if types is None else frozenset(types)
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            events = await outlasting_cancel(self.page(after=cursor, job_id=job_id))
            if events:
                cursor = events[-1].cursor
                chosen = events if wanted is None else [e for e in events if e.type in wanted]
                if chosen:
                    quiet = 0.0
                    yield chosen
                if len(events) >= self.policy.page_size:
                    continue
            await asyncio.sleep(self.policy.poll_interval)
            quiet += loop.time() - began
            if quiet >= silence:
                quiet = 0.0
                yield []


_finishing: set[asyncio.Task[Any]] = set()  # reads whose follower went away, until they end


async def outlasting_cancel(read: Coroutine[Any, Any, T]) -> T:
    """Await ``read`` in a task of its own that a cancel of the caller does not reach: for the
    store reads of a stream whose client may go away at any moment (a query cancelled in
    flight costs the pool its connection). The caller's ``CancelledError`` is raised at once;
    the read ends on its own, its outcome dropped."""
    task = asyncio.ensure_future(read)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _finishing.add(task)
        task.add_done_callback(_finished)
        raise


def _finished(task: asyncio.Task[Any]) -> None:
    _finishing.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: an outage after the follower left is nobody's to report
