"""``TryConnection``: the connection of one store try, whose first request carries its BEGIN.

A store try (``CockroachStore.run``) used to open with a request of its own (``BEGIN``). Here
``BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT now()`` is prepended to the try's first statement,
which is then bound on the client (a simple query of several statements takes no parameters),
so the transaction, its timestamp and the first statement's answer come back in one round trip.
A first statement that cannot be bound on the client goes as before, after the BEGIN request.

Both dialects run a multi-statement simple query in order and stop at its first error; the
statements after ``BEGIN`` run in the transaction it opened. Bound on the client, the first
statement is parsed and planned on every try instead of running a prepared plan: its cost on
the server, against a round trip saved on both sides (benchmarks/PROFILE.md, sixth pass).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, AsyncCursor
from psycopg.rows import TupleRow

from dtq.adapters.cockroach import sql


class Conn(Protocol):
    """What the repositories use of a connection: ``execute`` (psycopg's signature)."""

    async def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool = False
    ) -> AsyncCursor[TupleRow]:
        """Send one statement (or, without parameters, a simple query) and return its cursor."""
        ...


def bind_on_client(conn: AsyncConnection[TupleRow], query: Any, params: Any) -> str | None:
    """``query`` with ``params`` bound on the client as SQL literals, or None if they cannot be.

    A ``%b`` placeholder (a binary parameter) is bound as ``%s`` (text): the statements cast
    every array parameter (``%b::uuid[]``), so the text literal reads as the same value.

    Raises:
        nothing: a parameter psycopg cannot render as text gives None (the caller sends the
            statement with bound parameters instead).
    """
    if not isinstance(query, str):
        return None
    if params is None:
        return query
    try:
        return AsyncClientCursor(conn).mogrify(_PLACEHOLDER.sub(_as_text, query), params)
    except (psycopg.Error, TypeError, ValueError):
        return None


#: ``%%`` (a literal percent sign, kept) or ``%b`` (a binary placeholder, bound as text).
_PLACEHOLDER = re.compile(r"%([%b])")


def _as_text(match: re.Match[str]) -> str:
    return "%%" if match.group(1) == "%" else "%s"


class TryConnection:
    """One try's connection: after :meth:`open_lazily`, the first ``execute`` opens the
    transaction in its own round trip and hands the transaction timestamp to ``on_now``.

    Args:
        conn: the pool connection (autocommit; no transaction open).
        on_now: called with the transaction timestamp once the BEGIN has answered.

    Attributes:
        raw: the pool connection.
    """

    def __init__(self, conn: AsyncConnection[TupleRow], on_now: Callable[[datetime], None]) -> None:
        self.raw = conn
        self._on_now = on_now
        self._opening = False

    @property
    def opening(self) -> bool:
        """True while the BEGIN waits for the try's first statement."""
        return self._opening

    def open_lazily(self) -> None:
        """Send the BEGIN with the next statement (:meth:`execute`); no I/O now."""
        self._opening = True

    def take_opening(self) -> str:
        """The BEGIN still owed (``sql.BEGIN_WITH_NOW`` and ``"; "``) for a request that ends
        the try before any statement opened it, or ``""``; either way none is owed after."""
        opening, self._opening = self._opening, False
        return f"{sql.BEGIN_WITH_NOW}; " if opening else ""

    async def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool = False
    ) -> AsyncCursor[TupleRow]:
        """psycopg's ``execute``; the first one after :meth:`open_lazily` carries the BEGIN.

        The returned cursor is positioned on ``query``'s own result, as psycopg's would be.
        ``sql.NOW`` as the first statement is answered by the BEGIN's ``now()`` itself.
        """
        if not self._opening:
            return await self.raw.execute(query, params, prepare=prepare, binary=binary)
        self._opening = False
        if query == sql.NOW:
            cur = await self.raw.execute(sql.BEGIN_WITH_NOW, prepare=False)
            cur.nextset()  # positioned on now(): the caller reads it
            return cur
        bound = None if binary else bind_on_client(self.raw, query, params)
        if bound is None:
            await self._begin()
            return await self.raw.execute(query, params, prepare=prepare, binary=binary)
        cur = await self.raw.execute(f"{sql.BEGIN_WITH_NOW}; {bound}", prepare=False)
        cur.nextset()
        await self._take_now(cur)
        cur.nextset()
        return cur

    async def _begin(self) -> None:
        cur = await self.raw.execute(sql.BEGIN_WITH_NOW, prepare=False)
        cur.nextset()
        await self._take_now(cur)

    async def _take_now(self, cur: AsyncCursor[TupleRow]) -> None:
        row = await cur.fetchone()
        if row is None:  # pragma: no cover - SELECT now() always answers a row
            raise RuntimeError("BEGIN did not return the transaction timestamp")
        self._on_now(row[0])
