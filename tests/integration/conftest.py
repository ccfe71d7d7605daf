"""Fixtures for integration tests against real services.

Each service has its own section. A fixture for an unreachable service skips the test on a laptop
and fails it when ``CI`` is set (STYLE: real-service fixtures).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import psycopg
import pytest
import redis
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from redis.asyncio import Redis, RedisCluster
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from dtq.adapters.cockroach import txconn
from dtq.adapters.cockroach.migrate import apply_migrations
from dtq.adapters.cockroach.store import CockroachStore, Pool, open_pool
from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.adapters.redis import KeyLayout, RedisClient, connect_redis, tagged_prefix
from dtq.application.ports import Lease, Store
from dtq.entrypoints.bundles import Services
from tests.integration.redis_cluster import (
    ClusterUnavailable,
    LocalCluster,
    delete_slot_keys,
    start_cluster,
)
from tests.integration.wiring import api_client, services_on

# =================================================================================================
# Redis
# =================================================================================================

REDIS_URL = os.environ.get("DTQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _unavailable(message: str) -> None:
    """Skip on a laptop, fail in CI."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


async def delete_prefix_keys(client: Redis, prefix: str) -> None:
    """Delete every key under ``prefix`` and under its hash-tagged form (``tagged_prefix``, the
    queue's keys) by SCAN + DEL, on one server. Never FLUSHDB/FLUSHALL the shared server."""
    for start in dict.fromkeys((prefix, tagged_prefix(prefix))):
        batch: list[bytes | str] = []
        async for key in client.scan_iter(match=f"{start}*", count=500):
            batch.append(key)
            if len(batch) >= 500:
                await client.delete(*batch)
                batch.clear()
        if batch:
            await client.delete(*batch)


class RedisPeek:
    """Reads of the Redis queue's keys that no service needs, for tests: is a task's pending
    marker set, and what does its lease hash hold (the spec §5 key layout under ``prefix``, made
    a hash tag: ``KeyLayout``). Works on one server and on a Redis Cluster client."""

    def __init__(self, client: RedisClient, prefix: str) -> None:
        self._client = client
        self._keys = KeyLayout(prefix)

    async def has_marker(self, task_id: uuid.UUID) -> bool:
        """True while ``{tag}queue:pending:{task_id}`` exists."""
        return bool(await self._client.exists(self._keys.marker(task_id)))

    async def get_lease(self, task_id: uuid.UUID) -> Lease | None:
        """The lease hash ``{tag}lease:task:{task_id}``; None when absent or incomplete."""
        raw = await self._client.hgetall(self._keys.lease(task_id))
        fields = {_text(name): _text(value) for name, value in raw.items()}
        try:
            return Lease(
                task_id=task_id,
                worker_id=fields["worker_id"],
                run_id=uuid.UUID(fields["run_id"]),
                deadline_ms=int(fields["deadline_ms"]),
            )
        except (KeyError, ValueError):
            return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture
def redis_peek(redis_client: Redis, redis_prefix: str) -> RedisPeek:
    """``RedisPeek`` over this test's key prefix."""
    return RedisPeek(redis_client, redis_prefix)


@pytest.fixture(scope="session")
def redis_unreachable() -> str | None:
    """Probe Redis once per session (no retries): None when it answers, else why not.

    Saves every Redis test from waiting out the client's connection retries when it is down.
    """
    probe = redis.Redis.from_url(
        REDIS_URL, socket_connect_timeout=2.0, socket_timeout=2.0, retry=Retry(NoBackoff(), 0)
    )
    try:
        probe.ping()
    except (RedisError, OSError) as exc:
        return f"Redis unreachable at {REDIS_URL}: {exc}"
    finally:
        probe.close()
    return None


@pytest.fixture
async def redis_client(redis_unreachable: str | None) -> AsyncIterator[Redis]:
    """A client (``connect_redis``) for ``DTQ_TEST_REDIS_URL``, default
    ``redis://127.0.0.1:6379/0``; skips the test when Redis is unreachable (fails under ``CI``)."""
    if redis_unreachable:
        _unavailable(redis_unreachable)
    client = connect_redis(REDIS_URL)
    assert isinstance(client, Redis)  # one server: the cluster has its own fixtures
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        _unavailable(f"Redis unreachable at {REDIS_URL}: {exc}")
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def redis_prefix(redis_client: Redis) -> AsyncIterator[str]:
    """A key prefix unique to this test (``dtqtest:{uuid}:``); its keys are deleted afterwards."""
    prefix = f"dtqtest:{uuid.uuid4().hex}:"
    try:
        yield prefix
    finally:
        await delete_prefix_keys(redis_client, prefix)


@pytest.fixture
def redis_wipe(redis_client: Redis, redis_prefix: str) -> Callable[[], Awaitable[None]]:
    """Simulate losing Redis data for this test: delete the prefix's keys (not FLUSHALL)."""

    async def wipe() -> None:
        await delete_prefix_keys(redis_client, redis_prefix)

    return wipe


# =================================================================================================
# Redis Cluster (issue 17 item 6): a local three-master cluster, started once per session
# =================================================================================================


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A three-master Redis Cluster on free local ports (``redis_cluster.start_cluster``),
    stopped and removed after the session; skips when it cannot start (fails under ``CI``)."""
    try:
        cluster = start_cluster()
    except (ClusterUnavailable, OSError, subprocess.SubprocessError) as exc:
        _unavailable(f"local Redis Cluster unavailable: {exc}")
        raise  # unreachable: _unavailable skips or fails
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def redis_cluster_client(redis_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    """A ``connect_redis`` client for the cluster's seed list (a ``RedisCluster``), initialized
    (slot map and command table read) so that no test times the discovery."""
    client = connect_redis(redis_cluster.addr)
    assert isinstance(client, RedisCluster)
    try:
        await client.initialize()
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def redis_cluster_prefix(redis_cluster_client: RedisCluster) -> AsyncIterator[str]:
    """A key prefix unique to this test; its keys (one slot) are deleted afterwards."""
    prefix = f"dtqtest:{uuid.uuid4().hex}:"
    try:
        yield prefix
    finally:
        await delete_slot_keys(redis_cluster_client, prefix)


@pytest.fixture
def redis_cluster_wipe(
    redis_cluster_client: RedisCluster, redis_cluster_prefix: str
) -> Callable[[], Awaitable[None]]:
    """Simulate losing the cluster's data for this test: delete the prefix's keys."""

    async def wipe() -> None:
        await delete_slot_keys(redis_cluster_client, redis_cluster_prefix)

    return wipe


@pytest.fixture
def redis_cluster_peek(redis_cluster_client: RedisCluster, redis_cluster_prefix: str) -> RedisPeek:
    """``RedisPeek`` over this test's key prefix on the cluster."""
    return RedisPeek(redis_cluster_client, redis_cluster_prefix)


# =================================================================================================
# PostgreSQL / CockroachDB
# =================================================================================================

# Admin DSN of a server where the tests may create and drop databases. The default is the local
# PostgreSQL (trust auth). Point it at CockroachDB (e.g. postgresql://root@127.0.0.1:26257/defaultdb
# ?sslmode=disable) to run the same suites there; the fixtures detect it from ``SELECT version()``.
PG_ADMIN_URL = os.environ.get(
    "DTQ_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

# CockroachDB only: DTQ_TEST_CRDB_INJECT_RETRIES=1 opens every test connection with the session
# variable inject_retry_errors_enabled = true, so each statement inside an explicit transaction
# fails with SQLSTATE 40001 ("injected by inject_retry_errors_enabled"). CockroachDB stops
# injecting only after three retries through its ``cockroach_restart`` savepoint protocol;
# CockroachStore instead re-runs the function on a fresh transaction, so in that pass every try
# is refused and the stores end with BackendUnavailable: use it as a drill of the classification
# and backoff paths (store.retries grows, nothing is half-applied), not as a green run.
PG_INJECT_RETRIES = os.environ.get("DTQ_TEST_CRDB_INJECT_RETRIES") == "1"

#: Tables emptied between tests, children first.
PG_TABLES = (
    "task_runs",
    "task_dependencies",
    "tasks",
    "jobs",
    "workers",
    "api_tokens",
    "idempotency_tombstones",
    "events",
    "webhooks",
    "dashboard_sessions",
    "dashboard_keys",
)


def _admin_connect() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        _unavailable(f"database unreachable at {PG_ADMIN_URL}: {exc}")
        raise  # unreachable: _unavailable raises


def _is_cockroach(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute("SELECT version()").fetchone()
    return row is not None and "CockroachDB" in str(row[0])


def _create_database() -> tuple[str, str, bool]:
    """Create ``dtq_test_<random>``; return (name, DSN, is_cockroach)."""
    name = f"dtq_test_{secrets.token_hex(6)}"
    with _admin_connect() as admin:
        cockroach = _is_cockroach(admin)
        admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        if not cockroach:  # CockroachDB is SERIALIZABLE already
            admin.execute(
                pgsql.SQL(
                    "ALTER DATABASE {} SET default_transaction_isolation = 'serializable'"
                ).format(pgsql.Identifier(name))
            )
    extra = (
        {"options": "-c inject_retry_errors_enabled=true"}
        if cockroach and PG_INJECT_RETRIES
        else {}
    )
    return name, make_conninfo(PG_ADMIN_URL, dbname=name, **extra), cockroach


def _drop_database(name: str, cockroach: bool) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
        statement = (
            "DROP DATABASE IF EXISTS {} CASCADE"
            if cockroach
            else "DROP DATABASE IF EXISTS {} WITH (FORCE)"
        )
        admin.execute(pgsql.SQL(statement).format(pgsql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of a throwaway database with every migration applied, shared by the session.

    Created through ``DTQ_TEST_DATABASE_URL`` with ``default_transaction_isolation =
    'serializable'`` (so PostgreSQL raises the 40001s CockroachDB would), dropped at the end.
    Skips when the server is unreachable (fails under ``CI``).
    """
    name, dsn, cockroach = _create_database()
    try:
        apply_migrations(dsn)
        yield dsn
    finally:
        _drop_database(name, cockroach)


@pytest.fixture
def pg_empty_dsn() -> Iterator[str]:
    """DSN of a fresh, empty database (no migrations), dropped after the test."""
    name, dsn, cockroach = _create_database()
    try:
        yield dsn
    finally:
        _drop_database(name, cockroach)


@pytest.fixture
async def pg_pool(pg_dsn: str) -> AsyncIterator[Pool]:
    """An ``open_pool`` on the session database, its tables emptied first."""
    pool = await open_pool(pg_dsn, min_size=1, max_size=10)
    try:
        async with pool.connection() as conn:
            await conn.execute(f"TRUNCATE {', '.join(PG_TABLES)}")
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def one_connection(pg_pool: Pool, pg_dsn: str) -> AsyncIterator[Pool]:
    """A pool of exactly one connection (on the emptied tables of ``pg_pool``), so every try
    runs on the same session and its reading of the clock."""
    pool = await open_pool(pg_dsn, min_size=1, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def retries() -> list[str]:
    """Where a test's store records the reason of each re-run (``on_retry=retries.append``)."""
    return []


@pytest.fixture
def estimates_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimates of the transaction time on, no refusal counted (both restored after the test).

    A reading is kept from a request answered within 50 ms instead of 5: on a loaded machine
    (CI, two test processes) a quick request took longer than 5 ms, its reading was dropped and
    the next try read the clock. 50 ms is still half the tolerance of a check, and the 0.1 s
    request of the slow-request test is still too slow; the 5 ms bound itself is pinned in
    ``tests/unit/test_clock_anchor.py``.
    """
    monkeypatch.setattr(txconn.ClockAnchor, "refusals", 0)
    monkeypatch.setattr(txconn.ClockAnchor, "off_until", 0.0)
    monkeypatch.setattr(txconn, "READING_MAX_WAIT", 0.05)


@pytest.fixture
def pg_store(pg_pool: Pool) -> CockroachStore:
    """A ``CockroachStore`` on empty tables (fast backoff so retry tests stay quick)."""
    return CockroachStore(pg_pool, base_backoff=0.001)


@pytest.fixture
def memory_store() -> Store:
    """The in-memory fake (``dtq.adapters.memory.store.InMemoryStore``) on a fake clock."""
    return InMemoryStore(FakeClock())


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> Store:
    """Each ``Store`` implementation in turn, for the store contract suites (a test file may
    define its own ``store`` for another port)."""
    name = "memory_store" if request.param == "memory" else "pg_store"
    result: Store = request.getfixturevalue(name)
    return result


@pytest.fixture
def services(pg_store: CockroachStore) -> Services:
    """The container on PostgreSQL, its queue in memory (for tests about the SQL); a test file
    that needs Redis too overrides this fixture."""
    return services_on(pg_store)


@pytest.fixture
async def client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of ``services``' HTTP API."""
    async with api_client(services) as http:
        yield http
