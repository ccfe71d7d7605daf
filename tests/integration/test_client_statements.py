"""Statements bound on the client run prepared by name (``txconn.ClientStatements``, issue 17
item 4): once a pool connection has sent a query as text, the store prepares it between two
tries and later tries send ``EXECUTE dtq_<n>(<literals>)``; a query the server refuses to
prepare stays text; a prepared statement the server lost re-runs the try as text."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from dtq.adapters.cockroach import sql, txconn
from dtq.adapters.cockroach.arrays import UuidArray
from dtq.adapters.cockroach.pool import StoreConnection
from dtq.adapters.cockroach.repositories import PgTransaction
from dtq.adapters.cockroach.store import PREPARED_LOST, CockroachStore, Pool, open_pool
from dtq.application.ports import Transaction
from tests.integration.test_store_concurrency import new_job, new_task

pytestmark = pytest.mark.integration

_SERVER_STATEMENTS = (
    "SELECT name, statement FROM pg_prepared_statements WHERE name LIKE 'dtq\\_%' ORDER BY name"
)


@pytest.fixture
async def one_connection(pg_dsn: str) -> AsyncIterator[Pool]:
    """A pool of exactly one connection, so every try runs on the same session."""
    pool = await open_pool(pg_dsn, min_size=1, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(autouse=True)
def _prepares_on() -> Iterator[None]:
    """Each test starts (and leaves) with client-side statements preparable, no loss counted."""
    txconn.ClientStatements.enabled, txconn.ClientStatements.losses = True, 0
    yield
    txconn.ClientStatements.enabled, txconn.ClientStatements.losses = True, 0


@contextlib.contextmanager
def _requests() -> Iterator[list[str]]:
    """The raw text of every request sent through ``AsyncConnection.execute`` while open."""
    sent: list[str] = []
    real = psycopg.AsyncConnection.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return await real(self, query, *args, **kwargs)

    psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.AsyncConnection.execute = real  # type: ignore[method-assign]


async def _server_statements(pool: Pool) -> list[tuple[str, str]]:
    async with pool.connection() as conn:
        cur = await conn.execute(_SERVER_STATEMENTS, prepare=False)
        return [(str(r[0]), str(r[1])) for r in await cur.fetchall()]


_BY_KIND = "SELECT count(*) FROM tasks WHERE kind = %s"
_BY_KIND_NAME = txconn.statement_name(_BY_KIND)


async def _kind_count(tx: Transaction, kind: str) -> int:
    """A try whose first statement is bound on the client (it rides with the BEGIN)."""
    assert isinstance(tx, PgTransaction)
    cur = await tx.conn.execute(_BY_KIND, (kind,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_query_bound_as_text_runs_prepared_from_the_next_try(
    one_connection: Pool,
) -> None:
    store = CockroachStore(one_connection)
    with _requests() as sent:
        assert await store.run(lambda tx: _kind_count(tx, "a")) == 0
        first = list(sent)
        sent.clear()
        assert await store.run(lambda tx: _kind_count(tx, "b")) == 0
    assert first[0].startswith(sql.BEGIN_WITH_NOW)
    assert "FROM tasks WHERE kind = 'a'" in first[0]
    # between the tries: the PREPARE, alone and outside the transaction; then the EXECUTE
    prepare = f"PREPARE {_BY_KIND_NAME} AS SELECT count(*) FROM tasks WHERE kind = $1"
    assert sent[0] == prepare
    assert sent[1] == f"{sql.BEGIN_WITH_NOW}; EXECUTE {_BY_KIND_NAME}('b')"
    assert await _server_statements(one_connection) == [(_BY_KIND_NAME, prepare)]


async def test_a_name_is_the_same_statement_on_every_session(
    one_connection: Pool, pg_dsn: str
) -> None:
    """Names come from the statement's text, not from a per-connection counter: two sessions
    that prepared the same statements in a different order hold them under the same names, so
    behind a pooler a name never stands for another statement."""
    by_name = "SELECT count(*) FROM tasks WHERE name = %s"

    async def count(tx: Transaction, query: str) -> int:
        assert isinstance(tx, PgTransaction)
        row = await (await tx.conn.execute(query, ("x",))).fetchone()
        assert row is not None
        return int(row[0])

    other = await open_pool(pg_dsn, min_size=1, max_size=1)
    try:
        for pool, order in ((one_connection, (_BY_KIND, by_name)), (other, (by_name, _BY_KIND))):
            store = CockroachStore(pool)
            for query in (*order, order[0]):  # the third try prepares what the first two noted
                await store.run(functools.partial(count, query=query))
        first, second = await _server_statements(one_connection), await _server_statements(other)
    finally:
        await other.close()
    assert len(first) == 2
    assert sorted(first) == sorted(second)


async def test_a_name_the_session_has_already_is_used(one_connection: Pool) -> None:
    reasons: list[str] = []
    store = CockroachStore(one_connection, on_retry=reasons.append)
    async with one_connection.connection() as conn:  # as another client of a pooled session
        await conn.execute(f"PREPARE {_BY_KIND_NAME} AS {txconn.numbered(_BY_KIND)}")
    with _requests() as sent:
        await store.run(lambda tx: _kind_count(tx, "a"))
        await store.run(lambda tx: _kind_count(tx, "b"))
    assert sent[-2] == f"{sql.BEGIN_WITH_NOW}; EXECUTE {_BY_KIND_NAME}('b')"
    assert reasons == []


async def test_a_prepared_query_answers_what_its_text_answers(one_connection: Pool) -> None:
    """``GET_TASKS`` takes a binary ``uuid[]`` (``%b``): as a text literal and as the argument
    of its prepared statement it finds the same rows."""
    store = CockroachStore(one_connection)
    job = new_job(datetime(2026, 1, 1, tzinfo=UTC))
    tasks = [new_task(job, name, job.created_at) for name in "ab"]

    async def add(tx: Transaction) -> None:
        await tx.jobs.add(job, tasks, [])

    await store.run(add)
    ids = UuidArray(t.id for t in tasks)
    rows: list[list[Any]] = []

    async def read(tx: Transaction) -> None:
        assert isinstance(tx, PgTransaction)
        rows.append(await (await tx.conn.execute(sql.GET_TASKS, (ids,))).fetchall())

    with _requests() as sent:
        await store.run(read)  # as text
        await store.run(read)  # prepared
    assert any(text.startswith(f"{sql.BEGIN_WITH_NOW}; EXECUTE dtq_") for text in sent)
    assert len(rows[0]) == 2
    assert rows[1] == rows[0]


async def test_a_query_the_server_refuses_to_prepare_stays_text(one_connection: Pool) -> None:
    store = CockroachStore(one_connection)

    async def untyped(tx: Transaction) -> bool:
        assert isinstance(tx, PgTransaction)
        row = await (await tx.conn.execute("SELECT %s IS NULL", (None,))).fetchone()
        assert row is not None
        return bool(row[0])

    with _requests() as sent:
        for _ in range(3):
            assert await store.run(untyped) is True
    refused = [text for text in sent if text.startswith("PREPARE")]
    name = txconn.statement_name("SELECT %s IS NULL")
    assert refused == [f"PREPARE {name} AS SELECT $1 IS NULL"]  # tried once, never again
    assert sent[-2] == f"{sql.BEGIN_WITH_NOW}; SELECT NULL IS NULL"
    assert await _server_statements(one_connection) == []


async def test_a_lost_prepared_statement_re_runs_the_try_as_text(one_connection: Pool) -> None:
    reasons: list[str] = []
    store = CockroachStore(one_connection, base_backoff=0.001, on_retry=reasons.append)
    await store.run(lambda tx: _kind_count(tx, "a"))
    await store.run(lambda tx: _kind_count(tx, "a"))  # prepares, then runs by name
    async with one_connection.connection() as conn:
        assert isinstance(conn, StoreConnection)
        assert conn.statements.name_of(_BY_KIND) == _BY_KIND_NAME
        await conn.execute("DEALLOCATE ALL", prepare=False)  # e.g. a pooler's new session
    with _requests() as sent:
        assert await store.run(lambda tx: _kind_count(tx, "c")) == 0
        assert await store.run(lambda tx: _kind_count(tx, "d")) == 0
    assert reasons == [PREPARED_LOST]
    assert sent == [
        f"{sql.BEGIN_WITH_NOW}; EXECUTE {_BY_KIND_NAME}('c')",
        "ROLLBACK",
        f"{sql.BEGIN_WITH_NOW}; SELECT count(*) FROM tasks WHERE kind = 'c'",
        "COMMIT",
        # one loss forgets this connection's names only: prepared again on its next try
        f"PREPARE {_BY_KIND_NAME} AS SELECT count(*) FROM tasks WHERE kind = $1",
        f"{sql.BEGIN_WITH_NOW}; EXECUTE {_BY_KIND_NAME}('d')",
        "COMMIT",
    ]
    assert txconn.ClientStatements.enabled is True


async def test_repeated_losses_turn_the_names_off_for_the_process(one_connection: Pool) -> None:
    store = CockroachStore(one_connection, base_backoff=0.001)
    txconn.ClientStatements.losses = txconn.MAX_LOSSES - 1
    await store.run(lambda tx: _kind_count(tx, "a"))
    await store.run(lambda tx: _kind_count(tx, "a"))  # prepares, then runs by name
    async with one_connection.connection() as conn:
        await conn.execute("DEALLOCATE ALL", prepare=False)
    with _requests() as sent:
        assert await store.run(lambda tx: _kind_count(tx, "c")) == 0
        assert await store.run(lambda tx: _kind_count(tx, "d")) == 0
    assert txconn.ClientStatements.enabled is False
    assert sent[-2:] == [
        f"{sql.BEGIN_WITH_NOW}; SELECT count(*) FROM tasks WHERE kind = 'd'",
        "COMMIT",
    ]


async def test_past_the_cap_a_connection_prepares_no_more_queries(
    one_connection: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txconn, "MAX_PREPARED", 1)
    store = CockroachStore(one_connection)

    async def by_name(tx: Transaction) -> int:
        assert isinstance(tx, PgTransaction)
        cur = await tx.conn.execute("SELECT count(*) FROM tasks WHERE name = %s", ("n",))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    for _ in range(2):
        await store.run(lambda tx: _kind_count(tx, "a"))
        await store.run(by_name)
    assert await _server_statements(one_connection) == [
        (_BY_KIND_NAME, f"PREPARE {_BY_KIND_NAME} AS SELECT count(*) FROM tasks WHERE kind = $1")
    ]


async def test_an_execute_the_server_refuses_re_runs_the_try_as_text(one_connection: Pool) -> None:
    """A class-42 refusal of an ``EXECUTE``'s arguments (here a name that stands for a statement
    of another parameter type) turns the names off and re-runs the try as text."""
    reasons: list[str] = []
    store = CockroachStore(one_connection, base_backoff=0.001, on_retry=reasons.append)
    by_id = "SELECT count(*) FROM tasks WHERE id = %s"
    async with one_connection.connection() as conn:
        assert isinstance(conn, StoreConnection)
        await conn.execute(
            "PREPARE dtq_by_attempt AS SELECT count(*) FROM tasks WHERE attempt = $1"
        )
        conn.statements._names[by_id] = "dtq_by_attempt"  # an integer parameter, a uuid argument

    async def count(tx: Transaction) -> int:
        assert isinstance(tx, PgTransaction)
        row = await (await tx.conn.execute(by_id, (uuid4(),))).fetchone()
        assert row is not None
        return int(row[0])

    with _requests() as sent:
        assert await store.run(count) == 0
    assert reasons == [PREPARED_LOST]
    assert sent[0].startswith(f"{sql.BEGIN_WITH_NOW}; EXECUTE dtq_by_attempt(")
    assert sent[2].startswith(f"{sql.BEGIN_WITH_NOW}; SELECT count(*) FROM tasks WHERE id = ")
    assert txconn.ClientStatements.enabled is False
