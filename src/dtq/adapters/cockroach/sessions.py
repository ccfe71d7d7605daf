"""``PgSessionRepository``: dashboard sessions and signing keys on one transaction (issue 16
item 3; tables ``dashboard_sessions`` and ``dashboard_keys``, migrations 0070-0072).

Every statement is a primary-key point read or write, but the expired-session delete, a bounded
range of ``idx_dashboard_sessions_expires``. The lookup a dashboard request costs is one
statement: the session joined with its token on both primary keys (the transaction's time
came with its BEGIN).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from psycopg.rows import TupleRow
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach.rows import token_from_row
from dtq.adapters.cockroach.txconn import Conn
from dtq.domain.errors import ConcurrentUpdate
from dtq.domain.sessions import DashboardSession
from dtq.domain.tokens import ApiToken

SESSIONS_INSERT: Final = (
    "INSERT INTO dashboard_sessions (id_hash, token_id, csrf, created_at, expires_at)"
    " VALUES (%s, %s, %s, %s, %s)"
)

# Two point reads in one statement: dashboard_sessions_pkey, then api_tokens_pkey.
SESSIONS_GET: Final = (
    "SELECT s.id_hash, s.token_id, s.csrf, s.created_at, s.expires_at,"
    " t.id, t.name, t.secret_hash, t.scopes, t.created_at, t.expires_at, t.revoked_at"
    " FROM dashboard_sessions AS s JOIN api_tokens AS t ON t.id = s.token_id"
    " WHERE s.id_hash = %s"
)

SESSIONS_DELETE: Final = "DELETE FROM dashboard_sessions WHERE id_hash = %s"

# A bounded range of idx_dashboard_sessions_expires (no DELETE ... LIMIT: CockroachDB only).
SESSIONS_DELETE_EXPIRED: Final = (
    "DELETE FROM dashboard_sessions WHERE id_hash IN ("
    "SELECT id_hash FROM dashboard_sessions WHERE expires_at <= %s"
    " ORDER BY expires_at LIMIT %s)"
)

KEYS_GET: Final = "SELECT secret FROM dashboard_keys WHERE name = %s"

KEYS_INSERT: Final = (
    "INSERT INTO dashboard_keys (name, secret) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
)


def session_from_row(row: TupleRow) -> DashboardSession:
    """Map the first five columns of ``SESSIONS_GET``."""
    return DashboardSession(
        id_hash=row[0],
        token_id=row[1],
        csrf=row[2],
        created_at=row[3].astimezone(UTC),
        expires_at=row[4].astimezone(UTC),
    )


class PgSessionRepository:
    """``DashboardSessionRepository`` on one transaction.

    Args:
        conn: the transaction's connection.
    """

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def add(self, session: DashboardSession) -> None:
        """Insert the session (one statement)."""
        await self._conn.execute(
            SESSIONS_INSERT,
            (
                session.id_hash,
                session.token_id,
                session.csrf,
                session.created_at,
                session.expires_at,
            ),
        )

    async def get(self, id_hash: str) -> tuple[DashboardSession, ApiToken] | None:
        """The session with its token, or None (one statement, see ``SESSIONS_GET``)."""
        row = await (await self._conn.execute(SESSIONS_GET, (id_hash,))).fetchone()
        if row is None:
            return None
        return session_from_row(row), token_from_row(row[5:12])

    async def delete(self, id_hash: str) -> bool:
        """Delete the session; True when a row was deleted."""
        cur = await self._conn.execute(SESSIONS_DELETE, (id_hash,))
        return cur.rowcount > 0

    async def delete_expired(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` sessions expired at ``before``; how many were."""
        cur = await self._conn.execute(SESSIONS_DELETE_EXPIRED, (before, Int8(limit)))
        return max(cur.rowcount, 0)

    async def key(self, name: str, candidate: str) -> str:
        """The stored key ``name``; when there is none, insert ``candidate`` (``ON CONFLICT DO
        NOTHING``) and read again: the first read is all a process costs once the key exists,
        so orchestrators starting together do not all write the same row."""
        row = await (await self._conn.execute(KEYS_GET, (name,))).fetchone()
        if row is None:
            await self._conn.execute(KEYS_INSERT, (name, candidate))
            row = await (await self._conn.execute(KEYS_GET, (name,))).fetchone()
            if row is None:  # a racing writer's row, not visible to this try: re-run it
                raise ConcurrentUpdate(f"the key {name!r} was created concurrently")
        secret: str = row[0]
        return secret
