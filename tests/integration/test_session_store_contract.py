"""The ``DashboardSessionRepository`` contract (``tx.sessions``, issue 16 item 3), run against
the in-memory fake and against PostgreSQL, like ``test_token_store_contract.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar
from uuid import uuid4

from dtq.application.ports import Store, Transaction
from dtq.domain.sessions import DashboardSession, hash_session_id, new_session_id
from dtq.domain.tokens import ApiToken, Scope, hash_secret, new_secret

T = TypeVar("T")


async def run(store: Store, fn: Callable[[Transaction], Awaitable[T]]) -> T:
    return await store.run(fn)


async def new_token(store: Store, name: str = "ops") -> ApiToken:
    now = await run(store, lambda tx: tx.now())
    token = ApiToken(
        id=uuid4(),
        name=name,
        secret_hash=hash_secret(new_secret()),
        scopes=frozenset({Scope.READ, Scope.ADMIN}),
        created_at=now,
    )
    await run(store, lambda tx: tx.tokens.add(token))
    return token


async def new_session(
    store: Store, token: ApiToken, *, lasts: float = 3600.0, token_id: object = None
) -> DashboardSession:
    now = await run(store, lambda tx: tx.now())
    session = DashboardSession(
        id_hash=hash_session_id(new_session_id()),
        token_id=token.id if token_id is None else token_id,  # type: ignore[arg-type]
        csrf=new_session_id(),
        created_at=now,
        expires_at=now + timedelta(seconds=lasts),
    )
    await run(store, lambda tx: tx.sessions.add(session))
    return session


async def test_a_session_reads_back_with_its_token_as_written(store: Store) -> None:
    token = await new_token(store)
    session = await new_session(store, token)

    found = await run(store, lambda tx: tx.sessions.get(session.id_hash))

    assert found is not None
    read_session, read_token = found
    assert read_session == session
    assert read_session.expires_at.utcoffset() == timedelta(0)
    assert read_token.id == token.id and read_token.name == "ops"
    assert read_token.scopes == token.scopes and read_token.revoked_at is None


async def test_an_unknown_session_or_one_whose_token_is_gone_reads_as_none(store: Store) -> None:
    token = await new_token(store)
    orphan = await new_session(store, token, token_id=uuid4())

    assert await run(store, lambda tx: tx.sessions.get(hash_session_id("nope"))) is None
    assert await run(store, lambda tx: tx.sessions.get(orphan.id_hash)) is None


async def test_a_revoked_tokens_session_still_reads_back_for_the_caller_to_judge(
    store: Store,
) -> None:
    token = await new_token(store)
    session = await new_session(store, token)

    async def revoke(tx: Transaction) -> bool:
        return await tx.tokens.set_revoked(token.id, await tx.now())

    assert await run(store, revoke)
    found = await run(store, lambda tx: tx.sessions.get(session.id_hash))
    assert found is not None and found[1].revoked_at is not None


async def test_delete_is_idempotent(store: Store) -> None:
    session = await new_session(store, await new_token(store))

    assert await run(store, lambda tx: tx.sessions.delete(session.id_hash)) is True
    assert await run(store, lambda tx: tx.sessions.delete(session.id_hash)) is False
    assert await run(store, lambda tx: tx.sessions.get(session.id_hash)) is None


async def test_delete_expired_takes_the_oldest_up_to_the_limit_and_nothing_live(
    store: Store,
) -> None:
    token = await new_token(store)
    expired = [await new_session(store, token, lasts=-100.0 + i) for i in range(3)]
    live = await new_session(store, token)

    async def prune(tx: Transaction, limit: int) -> int:
        return await tx.sessions.delete_expired(await tx.now(), limit)

    assert await run(store, lambda tx: prune(tx, 2)) == 2
    assert await run(store, lambda tx: tx.sessions.get(expired[0].id_hash)) is None
    assert await run(store, lambda tx: tx.sessions.get(expired[2].id_hash)) is not None
    assert await run(store, lambda tx: prune(tx, 10)) == 1
    assert await run(store, lambda tx: prune(tx, 10)) == 0
    assert await run(store, lambda tx: tx.sessions.get(live.id_hash)) is not None


async def test_a_key_is_the_first_candidate_stored_whoever_asks_later(store: Store) -> None:
    first = await run(store, lambda tx: tx.sessions.key("login_csrf", "k1"))
    second = await run(store, lambda tx: tx.sessions.key("login_csrf", "k2"))
    other = await run(store, lambda tx: tx.sessions.key("anonymous_csrf", "k3"))

    assert first == second == "k1"
    assert other == "k3"


async def test_writers_racing_on_a_new_key_all_get_the_same_one(store: Store) -> None:
    def writer(candidate: str) -> Callable[[Transaction], Awaitable[str]]:
        return lambda tx: tx.sessions.key("race", candidate)

    found = await asyncio.gather(*(run(store, writer(f"k{i}")) for i in range(4)))

    assert len(set(found)) == 1
    assert found[0] in {f"k{i}" for i in range(4)}
