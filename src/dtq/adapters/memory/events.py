"""The transition outbox of the in-memory store (``EventRepository``, issue 16 item 1).

A try buffers its events; the store's commit appends them to the committed log, each with a
fresh id and a time that never goes backwards (the clock, or 1 µs after the last event when the
clock has not moved), so the log is always in ``(created_at, id)`` order. Commits are serialised,
so an event is visible exactly when it is in the log: ``settle`` is not needed here.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID

from dtq.application.ports import Event, EventCursor
from dtq.domain.events import NewEvent

_TICK = timedelta(microseconds=1)


class EventLog:
    """The committed events, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def append(self, events: Sequence[NewEvent], at: datetime) -> None:
        """Commit ``events`` in order, stamped from ``at`` on."""
        for new in events:
            last = self.events[-1].created_at if self.events else None
            stamp = at if last is None or at > last else last + _TICK
            self.events.append(
                Event(
                    id=uuid.uuid4(),
                    job_id=new.job_id,
                    task_id=new.task_id,
                    type=new.type,
                    data=dict(new.data),
                    created_at=stamp,
                )
            )

    def delete_jobs(self, job_ids: set[UUID]) -> None:
        """Drop the events of ``job_ids``."""
        self.events = [e for e in self.events if e.job_id not in job_ids]


class MemoryEvents:
    """``EventRepository`` for one try of a memory transaction."""

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self.buffer: list[NewEvent] = []

    def add_many(self, events: Sequence[NewEvent]) -> None:
        """Buffer ``events`` for this try's commit."""
        self.buffer.extend(events)

    async def page(
        self,
        *,
        after: EventCursor | None,
        job_id: UUID | None,
        types: Sequence[str] | None,
        settle: float,
        limit: int,
    ) -> list[Event]:
        """See the port (``settle`` is ignored: commits are serialised)."""
        log = self._log.events
        start = 0
        if after is not None:
            start = bisect.bisect_right(
                log, (after.created_at, after.id), key=lambda e: (e.created_at, e.id)
            )
        wanted = None if types is None else set(types)
        found: list[Event] = []
        for event in log[start:]:
            if len(found) >= limit:
                break
            if job_id is not None and event.job_id != job_id:
                continue
            if wanted is not None and event.type not in wanted:
                continue
            found.append(event)
        return found
