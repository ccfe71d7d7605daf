"""``PgEventRepository``: the transition outbox on one transaction (issue 16 item 1).

``add_many`` only buffers; ``CockroachStore`` sends the buffer as the try's last statement, in
the COMMIT's round trip (:meth:`PgEventRepository.take_insert`), so a transaction gains exactly
one statement (``INSERT_EVENTS``) and no round trip when it changed any status. A try that is
re-run starts with a new, empty buffer (the rolled-back try's events are gone with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach import sql, txconn
from dtq.adapters.cockroach.rows import decode_json, encode_rows
from dtq.adapters.cockroach.txconn import Conn
from dtq.application.ports import Event, EventCursor
from dtq.domain.events import NewEvent

#: The cursor before every event.
_START = EventCursor(datetime(1970, 1, 1, tzinfo=UTC), UUID(int=0))


class PgEventRepository:
    """``EventRepository`` on one transaction: a write buffer plus the stream's page read."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._buffer: list[NewEvent] = []

    def add_many(self, events: Sequence[NewEvent]) -> None:
        """Buffer ``events``; written by :meth:`flush` (no statement now)."""
        self._buffer.extend(events)

    def take_insert(self, conn: AsyncConnection[TupleRow]) -> str | None:
        """The buffer's ``INSERT_EVENTS`` with its parameter bound on the client (None when
        empty), and the buffer emptied: the store sends it together with ``COMMIT``.

        Raises:
            InvalidPayload: some event data is not JSON-encodable.
        """
        events, self._buffer = self._buffer, []
        if not events:
            return None
        rows = encode_rows([(e.job_id, e.task_id, e.type, e.data) for e in events])
        bound = txconn.bind_on_client(conn, sql.INSERT_EVENTS, (rows,))
        if bound is None:  # pragma: no cover - a text parameter always binds
            raise RuntimeError("the outbox insert could not be bound on the client")
        return bound

    async def page(
        self,
        *,
        after: EventCursor | None,
        job_id: UUID | None,
        types: Sequence[str] | None,
        settle: float,
        limit: int,
    ) -> list[Event]:
        """See the port: one keyset range scan below the visibility horizon."""
        start = after or _START
        where = ""
        params: list[object] = [float(settle), start.created_at, start.id]
        if job_id is not None:
            where += sql.EVENTS_PAGE_JOB
            params.append(job_id)
        if types is not None:
            where += sql.EVENTS_PAGE_TYPES
            params.append(list(types))
        params.append(Int8(limit))
        cur = await self._conn.execute(sql.EVENTS_PAGE.format(where=where), params)
        return [
            Event(
                id=row[1],
                job_id=row[2],
                task_id=row[3],
                type=row[4],
                data=decode_json(row[5]) or {},
                created_at=row[0].astimezone(UTC),
            )
            for row in await cur.fetchall()
        ]
