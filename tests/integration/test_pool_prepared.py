"""The store pool's prepared statements survive a rolled-back transaction (issue 17: the drain's
40001 re-runs roll back a third of the store's tries, and psycopg's connection forgot every
prepared statement, with a ``DEALLOCATE ALL``, on each)."""

from __future__ import annotations

import pytest
from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from dtq.adapters.cockroach.pool import Pool, StoreConnection

pytestmark = pytest.mark.integration

_PROBE = "SELECT count(*) FROM tasks WHERE kind = %s"
_SERVER_STATEMENTS = "SELECT count(*) FROM pg_prepared_statements"


class _Boom(Exception):
    pass


async def _rolled_back(conn: AsyncConnection[TupleRow]) -> None:
    """One transaction running the probe, then rolled back by an exception."""
    async with conn.transaction():
        await conn.execute(_PROBE, ("k",))
        raise _Boom


async def _prepared_on_server(conn: AsyncConnection[TupleRow]) -> int:
    row = await (await conn.execute(_SERVER_STATEMENTS, prepare=False)).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_rollback_keeps_the_connections_prepared_statements(pg_pool: Pool) -> None:
    async with pg_pool.connection() as conn:
        assert isinstance(conn, StoreConnection)
        await conn.execute(_PROBE, ("k",), prepare=True)
        assert await _prepared_on_server(conn) == 1
        with pytest.raises(_Boom):
            await _rolled_back(conn)
        assert await _prepared_on_server(conn) == 1  # no DEALLOCATE ALL
        # still known to the client: executed as prepared, no new statement
        row = await (await conn.execute(_PROBE, ("k",))).fetchone()
        assert row == (0,)
        assert await _prepared_on_server(conn) == 1


async def test_deallocate_all_still_clears_the_cache(pg_pool: Pool) -> None:
    async with pg_pool.connection() as conn:
        await conn.execute(_PROBE, ("k",), prepare=True)
        await conn.execute("DEALLOCATE ALL")
        assert await _prepared_on_server(conn) == 0
        # the client forgot it too: prepared again instead of naming a missing statement
        row = await (await conn.execute(_PROBE, ("k",), prepare=True)).fetchone()
        assert row == (0,)


async def test_the_stores_rollback_statement_keeps_them_too(pg_pool: Pool) -> None:
    """A failed store try ends with an explicit ``ROLLBACK`` statement (``store._roll_back``),
    which psycopg's cache would take as a reason to forget everything, as its own rollback."""
    async with pg_pool.connection() as conn:
        await conn.execute(_PROBE, ("k",), prepare=True)
        await conn.execute("BEGIN", prepare=False)
        await conn.execute(_PROBE, ("k",))
        await conn.execute("ROLLBACK", prepare=False)
        assert await _prepared_on_server(conn) == 1
        row = await (await conn.execute(_PROBE, ("k",))).fetchone()
        assert row == (0,)
        assert await _prepared_on_server(conn) == 1


async def test_pool_connections_carry_the_tcp_bounds(pg_pool: Pool) -> None:
    """libpq took the bounds (an unknown parameter would have refused the connection)."""
    from dtq.adapters.cockroach.pool import TCP_BOUNDS

    async with pg_pool.connection() as conn:
        params = conn.info.get_parameters()

    assert {name: params.get(name) for name in TCP_BOUNDS} == {
        name: str(value) for name, value in TCP_BOUNDS.items()
    }
