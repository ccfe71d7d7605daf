"""The store's pool through a database outage (issue 12): calls fail within the acquire timeout
while the database is away, and the pool is whole again within seconds of its return."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from dtq.adapters.clock import SystemClock
from dtq.adapters.cockroach.store import CockroachStore, open_pool
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.application.health import HealthService
from dtq.domain.errors import BackendUnavailable
from tests.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.integration

#: ``open_pool``'s default acquire timeout, plus a margin for a loaded machine.
FAIL_FAST_BOUND = 3.0 + 1.5
RESUME_BOUND = 2.5
OUTAGE = 10.0


@pytest.fixture
async def proxied_store(pg_dsn: str) -> AsyncIterator[tuple[CockroachStore, CuttableProxy]]:
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    proxy = CuttableProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    proxy.restore()
    info.update(host="127.0.0.1", port=str(proxy.port))
    pool = await open_pool(psycopg.conninfo.make_conninfo("", **info), min_size=2, max_size=4)
    try:
        yield CockroachStore(pool, base_backoff=0.001), proxy
    finally:
        await pool.close()
        proxy.close()


async def test_calls_fail_fast_during_an_outage_and_resume_soon_after(
    proxied_store: tuple[CockroachStore, CuttableProxy],
) -> None:
    store, proxy = proxied_store
    await store.ping()

    proxy.cut()
    failures: list[float] = []
    cut_at = time.monotonic()
    # 10 s: psycopg_pool's own reconnect backoff (1, 2, 4, 8 s...) would next try at ~15 s.
    while time.monotonic() - cut_at < OUTAGE:
        started = time.monotonic()
        with pytest.raises((BackendUnavailable, TimeoutError)):
            await asyncio.wait_for(store.ping(), FAIL_FAST_BOUND + 1)
        failures.append(time.monotonic() - started)
        await asyncio.sleep(0.2)

    proxy.restore()
    restored = time.monotonic()
    while True:
        try:
            await store.ping()
            break
        except BackendUnavailable:
            assert time.monotonic() - restored < 30, "the pool never came back"
            await asyncio.sleep(0.05)
    resumed = time.monotonic() - restored

    print(f"\npool outage: calls failed in at most {max(failures):.2f}s; resumed in {resumed:.2f}s")
    assert max(failures) < FAIL_FAST_BOUND
    assert resumed < RESUME_BOUND


async def test_healthz_answers_within_two_seconds_when_the_database_is_a_black_hole(
    proxied_store: tuple[CockroachStore, CuttableProxy],
) -> None:
    store, proxy = proxied_store
    health = HealthService(store=store, queue=InMemoryQueue(SystemClock()))
    assert (await health.check())["store"] is None

    proxy.stall()  # connections are accepted, no byte is passed on
    took: list[float] = []
    for _ in range(3):
        started = time.monotonic()
        checks = await health.check()
        took.append(time.monotonic() - started)
        assert checks["store"] is not None and checks["queue"] is None, checks
    proxy.restore()

    print(f"\nblack-hole /healthz checks took {', '.join(f'{t:.2f}s' for t in took)}")
    assert max(took) < 2.0
