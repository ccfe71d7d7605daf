"""Dashboard sessions on the memory store (issue 16 item 3): a session is a row every
orchestrator on the store honours (two ``SessionService`` instances stand for two orchestrators,
a new instance for a restart); the row holds no secret; logout, revocation and expiry end it;
the lookup cache bounds the reads; the retention pass deletes expired rows; the shared keys."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.ports import Transaction
from dtq.application.retention import RetentionPolicy, RetentionService
from dtq.application.sessions import SESSION_TTL, SessionService
from dtq.application.tokens import TokenService
from dtq.domain.sessions import DashboardSession, hash_session_id
from dtq.domain.tokens import Forbidden, Scope, Unauthenticated

T = TypeVar("T")


class CountingStore(InMemoryStore):
    """The memory store, counting the transactions run on it."""

    runs = 0

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:  # type: ignore[override]
        self.runs += 1
        return await super().run(fn)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> CountingStore:
    return CountingStore(clock)


@pytest.fixture
def tokens(store: CountingStore, clock: FakeClock) -> TokenService:
    return TokenService(store=store, clock=clock)


def orchestrator(store: CountingStore, clock: FakeClock, **bounds: float) -> SessionService:
    """One orchestrator's session service on the shared store (its own cache and keys)."""
    return SessionService(store=store, clock=clock, **bounds)  # type: ignore[arg-type]


async def secret(
    tokens: TokenService, name: str, *scopes: Scope, expires_in: float | None = None
) -> str:
    created = await tokens.create(name, frozenset(scopes or (Scope.READ,)), expires_in=expires_in)
    return created.secret


def stored(store: InMemoryStore) -> list[DashboardSession]:
    """The committed session rows."""
    return list(store._tables.dashboard.sessions.values())


async def test_a_session_opened_on_one_orchestrator_is_honoured_by_another_and_after_restart(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a, b = orchestrator(store, clock), orchestrator(store, clock)
    opened = await a.open(await secret(tokens, "ops", Scope.READ, Scope.ADMIN))

    on_b = await b.resolve(opened.cookie)
    restarted = await orchestrator(store, clock).resolve(opened.cookie)

    assert on_b == restarted == opened.session
    assert on_b is not None and on_b.principal.name == "ops"
    assert on_b.principal.scopes == {Scope.READ, Scope.ADMIN}


async def test_the_row_holds_the_cookies_hash_and_the_token_id_never_a_secret(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    token_secret = await secret(tokens, "ops")
    opened = await orchestrator(store, clock).open(token_secret)

    [row] = stored(store)
    [token] = await tokens.list_tokens()
    assert row.id_hash == hash_session_id(opened.cookie)
    assert row.token_id == token.id
    assert row.csrf == opened.session.csrf
    assert row.expires_at == row.created_at + timedelta(seconds=SESSION_TTL)
    assert opened.cookie not in repr(row) and token_secret not in repr(row)
    assert token.secret_hash not in repr(row)


async def test_logout_ends_the_session_here_at_once_and_elsewhere_within_the_cache_ttl(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a, b = orchestrator(store, clock), orchestrator(store, clock)
    opened = await a.open(await secret(tokens, "ops"))
    assert await b.resolve(opened.cookie) is not None  # b has it cached now

    assert await a.close(opened.cookie) is True

    assert await a.resolve(opened.cookie) is None
    assert await b.resolve(opened.cookie) is not None  # b's cached second
    clock.advance(1.0)
    assert await b.resolve(opened.cookie) is None
    assert stored(store) == []
    assert await a.close(opened.cookie) is False  # idempotent


async def test_a_revoked_token_ends_its_sessions_at_their_next_lookup(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a = orchestrator(store, clock)
    opened = await a.open(await secret(tokens, "leaver"))
    assert await a.resolve(opened.cookie) is not None

    await tokens.revoke("leaver")
    clock.advance(1.0)

    assert await a.resolve(opened.cookie) is None
    assert stored(store) == []  # deleted as it was found


async def test_a_session_expires_after_its_ttl_and_never_outlives_its_token(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a = orchestrator(store, clock, ttl=60.0)
    long_lived = await a.open(await secret(tokens, "ops"))
    short_lived = await a.open(await secret(tokens, "temp", expires_in=30.0))

    clock.advance(29.0)
    assert await a.resolve(short_lived.cookie) is not None
    clock.advance(1.0)  # the token's expiry: the cached lookup does not outlive it either
    assert await a.resolve(short_lived.cookie) is None
    assert await a.resolve(long_lived.cookie) is not None
    clock.advance(30.0)
    assert await a.resolve(long_lived.cookie) is None
    assert stored(store) == []


async def test_a_login_needs_a_valid_token_with_the_scope_and_stores_nothing_otherwise(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a = orchestrator(store, clock)
    writer = await secret(tokens, "writer", Scope.SUBMIT)
    revoked = await secret(tokens, "gone")
    await tokens.revoke("gone")

    for bad in (None, "", "not-a-token", "dtq_" + "x" * 43, revoked):
        with pytest.raises(Unauthenticated):
            await a.open(bad)
    with pytest.raises(Forbidden):
        await a.open(writer)
    assert stored(store) == []


async def test_a_lookup_is_one_read_a_second_and_a_cookie_that_cannot_be_an_id_costs_none(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a, b = orchestrator(store, clock), orchestrator(store, clock)
    opened = await a.open(await secret(tokens, "ops"))

    before = store.runs
    for _ in range(5):
        assert await b.resolve(opened.cookie) is not None
    assert store.runs == before + 1
    clock.advance(1.0)
    await b.resolve(opened.cookie)
    assert store.runs == before + 2
    for forged in (None, "", "forged", opened.cookie + "x", 42, "é" * 43):
        assert await b.resolve(forged) is None
    assert store.runs == before + 2
    assert await b.resolve("A" * 43) is None  # the shape of an id: one read, not cached
    assert await b.resolve("A" * 43) is None
    assert store.runs == before + 4


async def test_the_cache_holds_at_most_its_size(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a = orchestrator(store, clock, cache_size=2)
    token_secret = await secret(tokens, "ops")
    for _ in range(3):
        await a.open(token_secret)
    assert a.cached == 2
    assert orchestrator(store, clock, cache_ttl=0).cached == 0


async def test_the_retention_pass_deletes_expired_sessions(
    store: CountingStore, clock: FakeClock, tokens: TokenService
) -> None:
    a = orchestrator(store, clock, ttl=60.0)
    token_secret = await secret(tokens, "ops")
    for _ in range(3):
        await a.open(token_secret)
    clock.advance(30.0)
    live = await a.open(token_secret)
    retention = RetentionService(store=store, policy=RetentionPolicy(), batch_jobs=1, max_pages=1)

    assert (await retention.prune_once()).sessions == 0
    clock.advance(30.0)
    report = await retention.prune_once()  # a page of 10 sessions: all three fit
    assert report.sessions == 3 and report.pruned and not report.more
    assert [s.id_hash for s in stored(store)] == [hash_session_id(live.cookie)]


async def test_every_orchestrator_gets_the_same_shared_key_created_once(
    store: CountingStore, clock: FakeClock
) -> None:
    a, b = orchestrator(store, clock), orchestrator(store, clock)

    first = await a.shared_key("login_csrf")
    before = store.runs
    again = await a.shared_key("login_csrf")

    assert again == first == await b.shared_key("login_csrf")
    assert store.runs == before + 1  # a's second call was cached; b read it once
    assert len(first) == 43
    assert await a.shared_key("anonymous_csrf") != first
