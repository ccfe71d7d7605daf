"""``PgWebhookRepository``: webhooks and their delivery state on one transaction (issue 16
item 2; table ``webhooks``, migration 0050)."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from psycopg.rows import TupleRow
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach import sql
from dtq.adapters.cockroach.txconn import Conn
from dtq.domain.webhooks import Webhook


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def webhook_from_row(row: TupleRow) -> Webhook:
    """Map a row of the ``sql.WEBHOOKS_*`` reads (``_WEBHOOK_COLUMNS`` order)."""
    return Webhook(
        id=row[0],
        url=row[1],
        events=tuple(row[2]),
        secret=row[3],
        created_at=row[4].astimezone(UTC),
        cursor_at=row[5].astimezone(UTC),
        cursor_id=row[6],
        attempts=int(row[7]),
        next_attempt_at=_utc(row[8]),
        last_status=None if row[9] is None else int(row[9]),
        last_error=row[10],
        last_attempt_at=_utc(row[11]),
        delivered=int(row[12]),
    )


class PgWebhookRepository:
    """``WebhookRepository`` on one transaction: primary-key statements only."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def add(self, webhook: Webhook) -> None:
        """Insert the webhook (one statement)."""
        await self._conn.execute(
            sql.WEBHOOKS_INSERT,
            (
                webhook.id,
                webhook.url,
                list(webhook.events),
                webhook.secret,
                webhook.created_at,
                webhook.cursor_at,
                webhook.cursor_id,
                Int8(webhook.attempts),
                webhook.next_attempt_at,
                None if webhook.last_status is None else Int8(webhook.last_status),
                webhook.last_error,
                webhook.last_attempt_at,
                Int8(webhook.delivered),
            ),
        )

    async def get(self, webhook_id: UUID) -> Webhook | None:
        """The webhook, or None (a point read)."""
        row = await (await self._conn.execute(sql.WEBHOOKS_GET, (webhook_id,))).fetchone()
        return None if row is None else webhook_from_row(row)

    async def list_all(self) -> list[Webhook]:
        """Every webhook, oldest first."""
        cur = await self._conn.execute(sql.WEBHOOKS_LIST)
        return [webhook_from_row(row) for row in await cur.fetchall()]

    async def delete(self, webhook_id: UUID) -> bool:
        """Delete it; True when a row was deleted."""
        cur = await self._conn.execute(sql.WEBHOOKS_DELETE, (webhook_id,))
        return await cur.fetchone() is not None

    async def replace(self, expected: Webhook, new: Webhook) -> bool:
        """See the port: one conditional ``UPDATE`` (``sql.WEBHOOKS_REPLACE``)."""
        cur = await self._conn.execute(
            sql.WEBHOOKS_REPLACE,
            (
                new.cursor_at,
                new.cursor_id,
                Int8(new.attempts),
                new.next_attempt_at,
                None if new.last_status is None else Int8(new.last_status),
                new.last_error,
                new.last_attempt_at,
                Int8(new.delivered),
                expected.id,
                expected.cursor_at,
                expected.cursor_id,
                expected.next_attempt_at,
            ),
        )
        return await cur.fetchone() is not None
