"""The ``ApiTokenRepository`` contract (``tx.tokens``, issue 15 item 3), run against the in-memory
fake and against PostgreSQL, like ``test_store_contract.py``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar
from uuid import uuid4

import psycopg
import pytest

from dtq.application.ports import Store, Transaction
from dtq.domain.tokens import ApiToken, Scope, TokenNameTaken, hash_secret, new_secret

T = TypeVar("T")


async def read(store: Store, fn: Callable[[Transaction], Awaitable[T]]) -> T:
    return await store.run(fn)


async def new_token(store: Store, name: str, *scopes: Scope, **fields: object) -> ApiToken:
    now = await read(store, lambda tx: tx.now())
    token = ApiToken(
        id=uuid4(),
        name=name,
        secret_hash=hash_secret(new_secret()),
        scopes=frozenset(scopes or (Scope.READ,)),
        created_at=now,
        **fields,  # type: ignore[arg-type]
    )
    await read(store, lambda tx: tx.tokens.add(token))
    return token


async def test_a_token_reads_back_by_hash_and_by_name_as_written(store: Store) -> None:
    now = await read(store, lambda tx: tx.now())
    token = await new_token(
        store, "ci", Scope.SUBMIT, Scope.WORKER, expires_at=now + timedelta(days=90)
    )

    by_hash = await read(store, lambda tx: tx.tokens.get_by_hash(token.secret_hash))
    by_name = await read(store, lambda tx: tx.tokens.get_by_name("ci"))

    assert by_hash == token
    assert by_name == token
    assert await read(store, lambda tx: tx.tokens.get_by_hash(hash_secret("other"))) is None
    assert await read(store, lambda tx: tx.tokens.get_by_name("nobody")) is None


async def test_a_taken_name_is_refused_and_writes_nothing(store: Store) -> None:
    first = await new_token(store, "ci")

    with pytest.raises(TokenNameTaken):
        await new_token(store, "ci", Scope.ADMIN)

    assert await read(store, lambda tx: tx.tokens.list_all()) == [first]


async def test_list_all_is_ordered_by_name_and_includes_revoked_ones(store: Store) -> None:
    b = await new_token(store, "b")
    a = await new_token(store, "a")
    now = await read(store, lambda tx: tx.now())
    await read(store, lambda tx: tx.tokens.set_revoked(b.id, now))

    listed = await read(store, lambda tx: tx.tokens.list_all())

    assert [t.name for t in listed] == ["a", "b"]
    assert listed[0] == a
    assert listed[1].revoked_at is not None


async def test_set_revoked_writes_once_and_keeps_the_first_time(store: Store) -> None:
    token = await new_token(store, "ci")
    now = await read(store, lambda tx: tx.now())

    first = await read(store, lambda tx: tx.tokens.set_revoked(token.id, now))
    second = await read(
        store, lambda tx: tx.tokens.set_revoked(token.id, now + timedelta(seconds=5))
    )
    unknown = await read(store, lambda tx: tx.tokens.set_revoked(uuid4(), now))

    assert (first, second, unknown) == (True, False, False)
    stored = await read(store, lambda tx: tx.tokens.get_by_name("ci"))
    assert stored is not None and stored.revoked_at == now


async def test_a_rolled_back_transaction_leaves_no_token(store: Store) -> None:
    now = await read(store, lambda tx: tx.now())
    token = ApiToken(
        id=uuid4(),
        name="gone",
        secret_hash="0" * 64,
        scopes=frozenset({Scope.READ}),
        created_at=now,
    )

    async def add_then_fail(tx: Transaction) -> None:
        await tx.tokens.add(token)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await store.run(add_then_fail)

    assert await read(store, lambda tx: tx.tokens.list_all()) == []


@pytest.mark.integration
async def test_the_database_holds_the_hash_never_the_secret(pg_store: Store, pg_dsn: str) -> None:
    secret = new_secret()
    now = await read(pg_store, lambda tx: tx.now())
    token = ApiToken(
        id=uuid4(),
        name="ci",
        secret_hash=hash_secret(secret),
        scopes=frozenset({Scope.READ}),
        created_at=now,
    )
    await read(pg_store, lambda tx: tx.tokens.add(token))

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT api_tokens::text FROM api_tokens").fetchall()

    assert len(rows) == 1
    assert secret not in rows[0][0] and secret[4:] not in rows[0][0]
    assert hash_secret(secret) in rows[0][0]
