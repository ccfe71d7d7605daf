"""Explain on PostgreSQL and Redis (issue 14 item 7): the codes that read Redis through the
``RedisQueueInspector`` — queued (depth, position), delivery_in_flight (marker TTL), running
(lease holder and deadline), lease_lost (reclaim time) — through the real wiring and HTTP route,
on one Redis server and on a Redis Cluster (``redis_cluster``: the same answers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
import pytest
from redis.asyncio import Redis, RedisCluster

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import KeyLayout, RedisQueue
from dtq.application.commands import ExecutionPolicy
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import api_client, services_on
from tests.single import claim_one

pytestmark = pytest.mark.integration

POLICY = ExecutionPolicy(lease_duration=30.0, retry_backoff=0.1, stale_running_after=45.0)
MARKER_TTL = 15.0


@pytest.fixture(params=["redis", "redis_cluster"])
def redis_backend(request: pytest.FixtureRequest) -> tuple[Redis | RedisCluster, str]:
    """The client and key prefix of one Redis server, or of the local Redis Cluster."""
    name = "redis" if request.param == "redis" else "redis_cluster"
    client: Redis | RedisCluster = request.getfixturevalue(f"{name}_client")
    prefix: str = request.getfixturevalue(f"{name}_prefix")
    return client, prefix


@pytest.fixture
async def services(
    pg_store: CockroachStore, redis_backend: tuple[Redis | RedisCluster, str]
) -> Services:
    redis_client, redis_prefix = redis_backend
    queue = RedisQueue(redis_client, prefix=redis_prefix, marker_ttl=MARKER_TTL)
    services = services_on(pg_store, queue=queue, policy=POLICY)
    await services.worker.registry.heartbeat("w1", "host", {"kinds": ["echo"]})
    return services


@pytest.fixture
async def client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(services) as http:
        yield http


async def submit(client: httpx.AsyncClient) -> UUID:
    response = await client.post("/v1/tasks", json={"kind": "echo"})
    assert response.status_code == 201, response.text
    assert "warnings" not in response.json()  # w1 polls the default tier (no "priorities")
    return UUID(response.json()["task_id"])


async def explain(client: httpx.AsyncClient, task_id: UUID) -> dict[str, Any]:
    response = await client.get(f"/v1/tasks/{task_id}/explain")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_queued_tasks_show_the_depth_and_their_place_on_the_redis_list(
    client: httpx.AsyncClient,
) -> None:
    ids = [await submit(client) for _ in range(3)]

    bodies = [await explain(client, task_id) for task_id in ids]

    assert {b["reason"] for b in bodies} == {"queued"}
    assert [b["details"]["position"] for b in bodies] == [0, 1, 2]
    assert {b["details"]["ready_depth"] for b in bodies} == {3}
    assert all(b["details"]["marker_ttl"] == pytest.approx(MARKER_TTL, abs=2) for b in bodies)


async def test_a_popped_unclaimed_task_is_a_delivery_in_flight(
    client: httpx.AsyncClient, services: Services
) -> None:
    task_id = await submit(client)
    assert await services.queue.pop_many(["default"], timeout=0.1, max_count=1) == [task_id]

    body = await explain(client, task_id)

    assert (body["status"], body["reason"]) == ("queued", "delivery_in_flight")
    assert 0 < body["details"]["marker_ttl"] <= MARKER_TTL


async def test_a_claimed_task_is_running_under_its_redis_lease_then_lease_lost_without_it(
    client: httpx.AsyncClient,
    services: Services,
    redis_backend: tuple[Redis | RedisCluster, str],
) -> None:
    redis_client, redis_prefix = redis_backend
    task_id = await submit(client)
    await services.queue.pop_many(["default"], timeout=0.1, max_count=1)
    claim = await claim_one(services.worker.execution, task_id, "w1")
    assert claim is not None

    running = await explain(client, task_id)

    assert (running["status"], running["reason"]) == ("running", "running")
    assert (running["details"]["worker_id"], running["details"]["run_id"]) == (
        "w1",
        str(claim.run.id),
    )
    deadline = datetime.fromisoformat(running["details"]["lease_deadline"])
    assert timedelta(0) < deadline - datetime.now(UTC) <= timedelta(seconds=POLICY.lease_duration)
    assert running["details"]["lease_ttl"] > 0

    await redis_client.delete(KeyLayout(redis_prefix).lease(task_id))  # the lease is lost
    lost = await explain(client, task_id)

    assert (lost["status"], lost["reason"]) == ("running", "lease_lost")
    started = claim.task.started_at
    assert started is not None
    reclaim_after = datetime.fromisoformat(lost["details"]["reclaim_after"])
    assert reclaim_after == started + timedelta(seconds=POLICY.stale_running_after)
    assert lost["details"]["run_id"] == str(claim.run.id)
