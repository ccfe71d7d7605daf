"""Outages seen from the API (issue 12): a bounded ``/healthz`` (GET and HEAD) that names what is
down, and fast 503s with ``Retry-After`` when a backend is unavailable."""

from __future__ import annotations

import asyncio
import time

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.health import HealthService
from dtq.domain.errors import BackendUnavailable
from tests.unit.api_harness import running_api


class HangingStore(InMemoryStore):
    """A store whose ping never answers: a database behind a dropped network path."""

    async def ping(self) -> None:
        await asyncio.sleep(3600)


class DownQueue(InMemoryQueue):
    async def ping(self) -> None:
        raise BackendUnavailable("redis unreachable: connection refused")


async def test_a_hanging_ping_is_reported_as_down_within_the_bound() -> None:
    clock = FakeClock()
    health = HealthService(store=HangingStore(clock), queue=InMemoryQueue(clock), timeout=0.2)

    started = time.monotonic()
    checks = await health.check()
    elapsed = time.monotonic() - started

    assert elapsed < 1.0
    assert checks["queue"] is None
    assert checks["store"] == "TimeoutError: no answer within 0.2s"


async def test_both_pings_run_at_once_so_two_hangs_cost_one_timeout() -> None:
    class HangingQueue(InMemoryQueue):
        async def ping(self) -> None:
            await asyncio.sleep(3600)

    clock = FakeClock()
    health = HealthService(store=HangingStore(clock), queue=HangingQueue(clock), timeout=1.0)

    started = time.monotonic()
    checks = await health.check()

    assert time.monotonic() - started < 1.8  # one after the other would take 2 s
    assert checks["store"] is not None and checks["queue"] is not None


async def test_with_the_default_bound_a_hanging_backend_costs_under_two_seconds() -> None:
    clock = FakeClock()
    health = HealthService(store=HangingStore(clock), queue=InMemoryQueue(clock))

    started = time.monotonic()
    checks = await health.check()

    assert time.monotonic() - started < 2.0
    assert checks["store"] is not None and "no answer within" in checks["store"]


def test_a_non_positive_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        HealthService(store=InMemoryStore(FakeClock()), queue=InMemoryQueue(FakeClock()), timeout=0)


async def test_healthz_answers_503_in_time_with_retry_after_naming_what_is_down() -> None:
    clock = FakeClock()
    health = HealthService(store=HangingStore(clock), queue=DownQueue(clock), timeout=0.2)
    async with running_api(health=health) as api:
        started = time.monotonic()
        response = await api.client.get("/healthz")
        elapsed = time.monotonic() - started

    assert elapsed < 1.5
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    checks = response.json()["checks"]
    assert "no answer within" in checks["store"]
    assert "connection refused" in checks["queue"]


@pytest.mark.parametrize(("down", "status"), [(False, 200), (True, 503)])
async def test_head_healthz_gives_the_status_without_a_body(down: bool, status: int) -> None:
    clock = FakeClock()
    queue = DownQueue(clock) if down else InMemoryQueue(clock)
    async with running_api(health=HealthService(store=InMemoryStore(clock), queue=queue)) as api:
        response = await api.client.head("/healthz")

    assert response.status_code == status
    assert response.content == b""
    assert ("retry-after" in response.headers) is down


async def test_an_api_call_during_an_outage_is_a_503_json_with_retry_after() -> None:
    async with running_api() as api:
        api.store.available = False
        response = await api.client.post("/v1/tasks", json={"kind": "echo"})

    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"]
