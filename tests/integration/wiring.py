"""The production container with real adapters plugged in, for the integration tests.

``services_on`` overrides the store (and optionally the queue) of a memory-backend container, so
a test runs the real wiring of every service over PostgreSQL (and Redis, when given), with a
short execution policy; ``api_client`` serves that container's API over httpx's ASGI transport
on the test's own event loop, where the pool and the Redis client live (Litestar's test client
would run the app on a portal thread's loop).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
from dependency_injector import providers

from dtq.adapters.cockroach import sql, txconn
from dtq.application.commands import Claim, ExecutionPolicy
from dtq.application.ports import Queue, Store
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import build_container
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry

#: Leases, backoff and the stale threshold short enough for tests that wait them out.
#: How :func:`counting_statements` records a store try's last request: the outbox's
#: ``INSERT_EVENTS`` (its parameter bound on the client) and ``COMMIT``.
OUTBOX_WITH_COMMIT = f"{' '.join(sql.INSERT_EVENTS.split())}; {sql.COMMIT}"
_OPENING = f"{sql.BEGIN_WITH_NOW}; "

POLICY = ExecutionPolicy(lease_duration=2.0, retry_backoff=0.1, stale_running_after=0.5)


def services_on(
    store: Store,
    *,
    queue: Queue | None = None,
    policy: ExecutionPolicy = POLICY,
    settings: Settings | None = None,
) -> Services:
    """Every bundle of one container whose store is ``store`` (and queue ``queue``, else the
    in-memory one), under ``policy``; ``settings`` default to no API authentication."""
    if settings is None:
        settings = Settings(api_auth="none")  # explicitly: the production default is "tokens"
    c = build_container(settings, backend="memory")
    c.store.override(providers.Object(store))
    if queue is not None:
        c.queue.override(providers.Object(queue))
    c.policy.override(providers.Object(policy))
    return Services(
        settings=settings,
        store=c.store(),
        queue=c.queue(),
        api=c.api_services(),
        worker=c.worker_services(),
        reconciler=c.reconciler_services(),
    )


@asynccontextmanager
async def api_client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of ``services``' HTTP API (base URL ``http://dtq``)."""
    registry = new_registry()
    app = create_app(services.api, services.settings, OrchestratorMetrics(registry), registry)
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's scope types
    async with httpx.AsyncClient(transport=transport, base_url="http://dtq") as http:
        yield http


async def claim_ready(services: Services, worker: str = "w1") -> list[Claim]:
    """Pop what waits on the default ready list (up to 16 ids) and claim it as ``worker``."""
    ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=16)
    return await services.worker.execution.claim_many(ids, worker)


@contextlib.contextmanager
def counting_statements() -> Iterator[list[str]]:
    """Every request sent through ``psycopg.AsyncConnection.execute`` while open, in order,
    its whitespace runs collapsed to one space (the texts of ``dtq.adapters.cockroach.sql``).

    A store try binds some statements on the client and sends several in one request (its
    BEGIN with its first statement, queued inserts with the next one, the outbox insert with
    the COMMIT); each bound statement is recorded by its template (its values, ids and times,
    differ from one try to the next), so a request of several reads as their templates joined
    by ``"; "`` (:func:`opened_with`, :data:`OUTBOX_WITH_COMMIT`). A bound statement that runs
    prepared (``EXECUTE dtq_<n>(...)``, ``txconn.ClientStatements``) is recorded by its template
    too, and the ``PREPARE`` requests themselves (one per statement and connection, sent between
    two tries) are not recorded."""
    sent: list[str] = []
    real = psycopg.AsyncConnection.execute
    real_bind = txconn.bind_on_client
    templates: dict[str, str] = {}

    def bind_on_client(conn: Any, query: Any, params: Any) -> str | None:
        bound = real_bind(conn, query, params)
        if bound is not None:
            templates[" ".join(bound.split())] = " ".join(query.split())
        return bound

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = " ".join(str(query).split())
        if text.startswith("PREPARE dtq_"):  # once per statement and connection, between tries
            return await real(self, query, *args, **kwargs)
        for bound in sorted(templates, key=len, reverse=True):
            text = text.replace(bound, templates[bound])
        sent.append(text)
        return await real(self, query, *args, **kwargs)

    txconn.bind_on_client = bind_on_client
    psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.AsyncConnection.execute = real  # type: ignore[method-assign]
        txconn.bind_on_client = real_bind


def guarded(query: str) -> str:
    """How :func:`counting_statements` records ``query``, a single-row compare-and-set,
    queued with ``TryConnection.send_guarded`` (wrapped to fail its transaction on no row)."""
    return " ".join(txconn.guarded(query).split())


def opened_with(query: str) -> str:
    """How :func:`counting_statements` records ``query`` sent as a try's first statement,
    with the BEGIN (``sql.BEGIN_WITH_NOW``) in the same request."""
    return _OPENING + " ".join(query.split())
