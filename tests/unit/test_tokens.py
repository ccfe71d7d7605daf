"""API tokens on the memory store (issue 15 item 3): create, list, revoke, expiry, the cache."""

from __future__ import annotations

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.tokens import TokenService
from dtq.domain.errors import BackendUnavailable
from dtq.domain.tokens import (
    SECRET_PREFIX,
    Forbidden,
    InvalidExpiry,
    InvalidScope,
    InvalidTokenName,
    Scope,
    TokenNameTaken,
    TokenNotFound,
    Unauthenticated,
    hash_secret,
    new_secret,
    parse_scopes,
)

READ = frozenset({Scope.READ})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> InMemoryStore:
    return InMemoryStore(clock)


@pytest.fixture
def tokens(store: InMemoryStore, clock: FakeClock) -> TokenService:
    return TokenService(store=store, clock=clock)


async def test_create_returns_a_high_entropy_secret_once_and_stores_only_its_hash(
    tokens: TokenService, store: InMemoryStore
) -> None:
    created = await tokens.create("ci", {Scope.SUBMIT, Scope.READ})

    assert created.secret.startswith(SECRET_PREFIX)
    assert len(created.secret) == len(SECRET_PREFIX) + 43  # 32 random bytes, URL-safe base64
    assert created.token.secret_hash == hash_secret(created.secret)
    assert created.token.scopes == {Scope.SUBMIT, Scope.READ}
    listed = await tokens.list_tokens()
    assert [t.name for t in listed] == ["ci"]
    assert created.secret not in repr(listed)
    other = await tokens.create("ci-2", READ)
    assert other.secret != created.secret


async def test_a_created_token_authenticates_with_its_scopes(tokens: TokenService) -> None:
    created = await tokens.create("reader", READ)

    principal = await tokens.authenticate(created.secret)

    assert principal.name == "reader"
    principal.require(Scope.READ)
    with pytest.raises(Forbidden, match="'admin' scope"):
        principal.require(Scope.ADMIN)


@pytest.mark.parametrize(
    "secret", [None, "", "not-a-dtq-token", SECRET_PREFIX + "x" * 43, SECRET_PREFIX + "y" * 500]
)
async def test_missing_foreign_or_unknown_secrets_are_refused(
    tokens: TokenService, secret: str | None
) -> None:
    await tokens.create("reader", READ)

    with pytest.raises(Unauthenticated) as refused:
        await tokens.authenticate(secret)

    if secret:
        assert secret not in refused.value.detail
        assert hash_secret(secret) not in refused.value.detail


async def test_a_name_is_unique(tokens: TokenService) -> None:
    await tokens.create("ci", READ)

    with pytest.raises(TokenNameTaken):
        await tokens.create("ci", {Scope.ADMIN})

    assert len(await tokens.list_tokens()) == 1


@pytest.mark.parametrize("name", ["", "-lead", "has space", "x" * 65, "ünï"])
async def test_bad_names_are_refused(tokens: TokenService, name: str) -> None:
    with pytest.raises(InvalidTokenName):
        await tokens.create(name, READ)


@pytest.mark.parametrize("expires_in", [0.0, -1.0, 3651 * 86400.0])
async def test_bad_lifetimes_are_refused(tokens: TokenService, expires_in: float) -> None:
    with pytest.raises(InvalidExpiry):
        await tokens.create("ci", READ, expires_in=expires_in)


async def test_no_scope_is_refused(tokens: TokenService) -> None:
    with pytest.raises(InvalidScope):
        await tokens.create("ci", frozenset())


def test_scopes_parse_from_a_comma_list_and_unknown_names_are_refused() -> None:
    assert parse_scopes("submit, READ,worker") == {Scope.SUBMIT, Scope.READ, Scope.WORKER}
    with pytest.raises(InvalidScope, match="'superuser'"):
        parse_scopes("read,superuser")
    with pytest.raises(InvalidScope):
        parse_scopes(" , ")


async def test_an_expired_token_is_refused_even_while_cached(
    tokens: TokenService, clock: FakeClock
) -> None:
    created = await tokens.create("short", READ, expires_in=0.5)
    await tokens.authenticate(created.secret)  # cached now, until its expiry at the latest

    clock.advance(0.6)

    with pytest.raises(Unauthenticated, match="expired"):
        await tokens.authenticate(created.secret)


async def test_a_revoked_token_is_refused_at_once_in_the_revoking_process(
    tokens: TokenService,
) -> None:
    created = await tokens.create("ci", READ)
    await tokens.authenticate(created.secret)

    revoked = await tokens.revoke("ci")

    assert revoked.newly and revoked.token.revoked_at is not None
    with pytest.raises(Unauthenticated, match="revoked"):
        await tokens.authenticate(created.secret)


async def test_another_process_sees_a_revocation_within_the_cache_bound(
    tokens: TokenService, store: InMemoryStore, clock: FakeClock
) -> None:
    other_api = TokenService(store=store, clock=clock)  # a second API process on the same store
    created = await tokens.create("ci", READ)
    await other_api.authenticate(created.secret)
    await tokens.revoke("ci")

    clock.advance(0.5)
    await other_api.authenticate(created.secret)  # still within the 1 s bound: cached
    clock.advance(0.6)

    with pytest.raises(Unauthenticated, match="revoked"):
        await other_api.authenticate(created.secret)


async def test_a_cache_hit_reads_nothing_from_the_store(
    store: InMemoryStore, clock: FakeClock
) -> None:
    tokens = TokenService(store=store, clock=clock, outage_grace=0)
    created = await tokens.create("ci", READ)
    await tokens.authenticate(created.secret)
    store.available = False  # any read would now raise BackendUnavailable

    assert (await tokens.authenticate(created.secret)).name == "ci"
    clock.advance(1.0)
    with pytest.raises(BackendUnavailable):
        await tokens.authenticate(created.secret)


async def test_during_an_outage_a_confirmed_token_is_accepted_for_the_grace_only(
    store: InMemoryStore, clock: FakeClock
) -> None:
    tokens = TokenService(store=store, clock=clock, outage_grace=60)
    created = await tokens.create("workers", READ)
    brief = await tokens.create("brief", READ, expires_in=30)
    await tokens.authenticate(created.secret)
    await tokens.authenticate(brief.secret)
    store.available = False

    clock.advance(20)
    during = await tokens.authenticate(created.secret)
    with pytest.raises(BackendUnavailable):  # never confirmed by this process
        await tokens.authenticate(new_secret())
    clock.advance(20)  # 40 s: past the brief token's expiry, within the grace
    with pytest.raises(BackendUnavailable):
        await tokens.authenticate(brief.secret)
    still = await tokens.authenticate(created.secret)
    clock.advance(21)  # 61 s since the database last said yes
    with pytest.raises(BackendUnavailable):
        await tokens.authenticate(created.secret)

    assert (during.name, still.name) == ("workers", "workers")


async def test_during_an_outage_a_token_revoked_here_is_not_accepted(
    store: InMemoryStore, clock: FakeClock
) -> None:
    tokens = TokenService(store=store, clock=clock, outage_grace=60)
    created = await tokens.create("ci", READ)
    await tokens.authenticate(created.secret)
    await tokens.revoke("ci")
    store.available = False
    clock.advance(2)

    with pytest.raises(BackendUnavailable):
        await tokens.authenticate(created.secret)


async def test_the_cache_holds_at_most_its_size(store: InMemoryStore, clock: FakeClock) -> None:
    tokens = TokenService(store=store, clock=clock, cache_size=3)
    secrets = [(await tokens.create(f"t{i}", READ)).secret for i in range(5)]

    for secret in secrets:
        await tokens.authenticate(secret)
        with pytest.raises(Unauthenticated):
            await tokens.authenticate(secret + "-unknown")  # refusals are cached too

    assert tokens.cached == 3


async def test_revoke_is_idempotent_and_keeps_the_first_time(
    tokens: TokenService, clock: FakeClock
) -> None:
    await tokens.create("ci", READ)
    first = await tokens.revoke("ci")
    clock.advance(5)

    again = await tokens.revoke("ci")

    assert not again.newly
    assert again.token.revoked_at == first.token.revoked_at
    (listed,) = await tokens.list_tokens()
    assert listed.revoked_at == first.token.revoked_at


async def test_revoking_an_unknown_name_is_refused(tokens: TokenService) -> None:
    with pytest.raises(TokenNotFound):
        await tokens.revoke("nobody")


async def test_a_create_rerun_after_a_conflict_stores_one_token_that_works(
    tokens: TokenService, store: InMemoryStore
) -> None:
    store.inject_conflicts(2)

    created = await tokens.create("retried", READ)

    assert store.retries == 2
    assert [t.name for t in await tokens.list_tokens()] == ["retried"]
    assert (await tokens.authenticate(created.secret)).name == "retried"
