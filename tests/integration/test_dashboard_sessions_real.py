"""Dashboard sessions behind a load balancer (issue 16 item 3), on PostgreSQL: two orchestrator
apps on one database (each its own container, caches and keys, as two processes would have),
a browser moving between them with one cookie jar, and a third app standing for a restart.

Each app's ``SessionService`` gets a ``FakeClock`` for its cache's ages, so "past the lookup
cache's second" is a clock move, not a sleep; expiry is judged on the database clock, so an
expired session is made by moving its ``expires_at`` into the past in SQL.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import httpx
import pytest

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.cockroach.pool import Pool
from dtq.adapters.memory.clock import FakeClock
from dtq.application.retention import RetentionPolicy, RetentionService
from dtq.application.sessions import SessionService
from dtq.domain.tokens import Scope
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from tests.integration.wiring import api_client, counting_statements, services_on

pytestmark = pytest.mark.integration

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
TOKENS = Settings(api_auth="tokens")


@dataclass
class Orchestrator:
    """One orchestrator process: its services, its app's client, its cache clock."""

    services: Services
    http: httpx.AsyncClient
    clock: FakeClock


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def orchestrator(
    stack: AsyncExitStack, store: CockroachStore, settings: Settings = TOKENS
) -> Orchestrator:
    """A new orchestrator app on ``store`` (a fresh container: nothing shared in memory)."""
    clock = FakeClock()
    services = services_on(store, settings=settings)
    sessions = SessionService(store=store, clock=clock)
    services = replace(services, api=replace(services.api, sessions=sessions))
    http = await stack.enter_async_context(api_client(services))
    http.follow_redirects = False
    return Orchestrator(services, http, clock)


@pytest.fixture
async def a(stack: AsyncExitStack, pg_store: CockroachStore) -> Orchestrator:
    return await orchestrator(stack, pg_store)


@pytest.fixture
async def b(stack: AsyncExitStack, pg_store: CockroachStore) -> Orchestrator:
    return await orchestrator(stack, pg_store)


def carry(cookies: httpx.Cookies, to: Orchestrator) -> None:
    """The load balancer sends the browser (its cookie jar) to ``to``."""
    carried = list(cookies.jar)
    to.http.cookies.clear()
    for cookie in carried:
        to.http.cookies.set(cookie.name, cookie.value or "", path=cookie.path)


async def csrf_of(at: Orchestrator, path: str) -> str:
    page = await at.http.get(path)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found is not None
    return found.group(1)


async def token(at: Orchestrator, name: str, *scopes: Scope) -> str:
    return (await at.services.api.tokens.create(name, frozenset(scopes))).secret


async def login(at: Orchestrator, secret: str, *, form_from: Orchestrator | None = None) -> None:
    """Log in on ``at``, with the login form served by ``form_from`` (default ``at``)."""
    source = form_from or at
    csrf = await csrf_of(source, "/ui/login")
    carry(source.http.cookies, at)
    response = await at.http.post("/ui/login", data={"csrf": csrf, "token": secret, "next": "/ui"})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/ui"


async def submit(at: Orchestrator, secret: str) -> dict[str, Any]:
    response = await at.http.post(
        "/v1/tasks", json={"kind": "echo"}, headers={"Authorization": f"Bearer {secret}"}
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def logged_out(response: httpx.Response) -> bool:
    return response.status_code == 303 and response.headers["location"].startswith("/ui/login")


async def session_rows(pool: Pool) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT count(*) FROM dashboard_sessions")).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_login_on_one_orchestrator_works_on_the_other_actions_and_csrf_included(
    a: Orchestrator, b: Orchestrator
) -> None:
    ops = await token(a, "ops", Scope.READ, Scope.ADMIN, Scope.SUBMIT)
    created = await submit(a, ops)
    await login(a, ops)
    csrf = await csrf_of(a, f"/ui/tasks/{created['task_id']}")  # the form as A rendered it

    carry(a.http.cookies, b)
    assert (await b.http.get("/ui/workers")).status_code == 200
    cancel = await b.http.post(f"/ui/tasks/{created['task_id']}/cancel", data={"csrf": csrf})
    forged = await b.http.post(f"/ui/jobs/{created['job_id']}/cancel", data={"csrf": "x" * 43})

    assert cancel.status_code == 303, cancel.text
    view = await b.services.api.queries.get_task(UUID(created["task_id"]))
    assert view.task.status.value == "cancelled"
    assert forged.status_code == 403 and "CSRF token" in forged.text
    assert await csrf_of(b, "/ui/workers") == csrf  # one session, one CSRF token on both


def auth_statements(sent: list[str]) -> list[str]:
    """The statements about sessions, tokens or keys (not the page's own reads)."""
    names = ("dashboard_sessions", "api_tokens", "dashboard_keys")
    return [text for text in sent if any(name in text for name in names)]


async def test_a_page_costs_one_session_statement_and_none_within_the_cache_second(
    a: Orchestrator, b: Orchestrator
) -> None:
    await login(a, await token(a, "ops", Scope.READ))
    carry(a.http.cookies, b)

    with counting_statements() as first:
        assert (await b.http.get("/ui/workers")).status_code == 200
    with counting_statements() as cached:
        for _ in range(3):
            assert (await b.http.get("/ui/workers")).status_code == 200
    b.clock.advance(1.0)
    with counting_statements() as later:
        assert (await b.http.get("/ui/workers")).status_code == 200

    [lookup] = auth_statements(first)
    assert "FROM dashboard_sessions AS s JOIN api_tokens AS t" in lookup
    assert auth_statements(cached) == []
    assert auth_statements(later) == [lookup]


async def test_a_login_form_from_one_orchestrator_posts_to_the_other(
    a: Orchestrator, b: Orchestrator
) -> None:
    await login(b, await token(a, "ops", Scope.READ), form_from=a)

    assert (await b.http.get("/ui")).status_code == 200
    carry(b.http.cookies, a)
    assert (await a.http.get("/ui")).status_code == 200


async def test_logout_on_one_orchestrator_ends_the_session_on_both(
    a: Orchestrator, b: Orchestrator, pg_pool: Pool
) -> None:
    await login(a, await token(a, "ops", Scope.READ))
    cookies = httpx.Cookies(a.http.cookies)
    carry(cookies, b)
    csrf = await csrf_of(b, "/ui/workers")

    response = await b.http.post("/ui/logout", data={"csrf": csrf})
    assert response.status_code == 303
    a.clock.advance(1.0)  # past A's lookup cache

    carry(cookies, a)  # the old cookie, replayed
    carry(cookies, b)
    assert logged_out(await a.http.get("/ui/workers"))
    assert logged_out(await b.http.get("/ui/workers"))
    assert await session_rows(pg_pool) == 0


async def test_a_revoked_token_ends_its_session_on_every_orchestrator(
    a: Orchestrator, b: Orchestrator, pg_pool: Pool
) -> None:
    await login(a, await token(a, "leaver", Scope.READ))
    carry(a.http.cookies, b)
    assert (await b.http.get("/ui/workers")).status_code == 200

    await b.services.api.tokens.revoke("leaver")  # `dtq token revoke` on any process
    a.clock.advance(1.0)
    b.clock.advance(1.0)

    assert logged_out(await a.http.get("/ui/workers"))
    assert logged_out(await b.http.get("/ui/workers"))
    assert await session_rows(pg_pool) == 0  # deleted by the first lookup that saw it


async def test_a_restarted_orchestrator_keeps_the_session_and_the_login_key(
    stack: AsyncExitStack, pg_store: CockroachStore, a: Orchestrator
) -> None:
    secret = await token(a, "ops", Scope.READ)
    form = await csrf_of(a, "/ui/login")
    login_cookies = httpx.Cookies(a.http.cookies)
    await login(a, secret)

    restarted = await orchestrator(stack, pg_store)
    carry(a.http.cookies, restarted)
    assert (await restarted.http.get("/ui/workers")).status_code == 200
    carry(login_cookies, restarted)  # a login form opened before the restart still posts
    response = await restarted.http.post("/ui/login", data={"csrf": form, "token": secret})
    assert response.status_code == 303, response.text


async def test_an_expired_session_is_refused_everywhere_and_pruned_by_retention(
    a: Orchestrator, b: Orchestrator, pg_store: CockroachStore, pg_pool: Pool
) -> None:
    secret = await token(a, "ops", Scope.READ)
    await login(a, secret)
    expired = httpx.Cookies(a.http.cookies)
    a.http.cookies.clear()
    await login(a, secret)  # another browser's session, which stays live
    async with pg_pool.connection() as conn:
        await conn.execute(
            "UPDATE dashboard_sessions SET expires_at = now() - interval '1 second'"
            " WHERE created_at = (SELECT min(created_at) FROM dashboard_sessions)"
        )
    a.clock.advance(1.0)
    retention = RetentionService(store=pg_store, policy=RetentionPolicy())

    carry(expired, b)
    assert logged_out(await b.http.get("/ui"))  # and deleted as it was found
    carry(a.http.cookies, b)
    assert (await b.http.get("/ui")).status_code == 200
    async with pg_pool.connection() as conn:
        await conn.execute("UPDATE dashboard_sessions SET expires_at = now()")
    assert (await retention.prune_once()).sessions == 1
    assert await session_rows(pg_pool) == 0


async def test_without_tokens_a_page_from_one_orchestrator_posts_to_the_other(
    stack: AsyncExitStack, pg_store: CockroachStore
) -> None:
    open_settings = Settings(api_auth="none")
    first = await orchestrator(stack, pg_store, open_settings)
    second = await orchestrator(stack, pg_store, open_settings)
    created = await submit(first, "unused")
    csrf = await csrf_of(first, f"/ui/tasks/{created['task_id']}")

    response = await second.http.post(f"/ui/tasks/{created['task_id']}/cancel", data={"csrf": csrf})

    assert response.status_code == 303, response.text
