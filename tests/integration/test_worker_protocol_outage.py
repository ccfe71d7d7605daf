"""The HTTP worker protocol through a PostgreSQL outage: a heartbeat of a run the orchestrator
handed out renews its lease in Redis while the database is cut (as a native worker's does), and
the worker's success is recorded after the database returns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import httpx
import psycopg
import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.cockroach.store import Pool, open_pool
from dtq.adapters.redis import RedisQueue
from dtq.adapters.redis.keys import KeyLayout
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.api import create_app
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.integration.wiring import services_on
from tests.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.integration

W1 = {"X-Worker-Id": "w1"}


@pytest.fixture
async def proxied_pool(pg_pool: Pool, pg_dsn: str) -> AsyncIterator[tuple[Pool, CuttableProxy]]:
    """A pool on the emptied tables of ``pg_pool``, reached through a proxy the test can cut."""
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    proxy = CuttableProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    proxy.restore()
    info.update(host="127.0.0.1", port=str(proxy.port))
    pool = await open_pool(
        psycopg.conninfo.make_conninfo("", **info), min_size=1, max_size=4, acquire_timeout=1.0
    )
    try:
        yield pool, proxy
    finally:
        await pool.close()
        proxy.close()


async def test_a_heartbeat_keeps_the_lease_through_a_database_outage(
    proxied_pool: tuple[Pool, CuttableProxy],
    redis_client: Redis,
    redis_prefix: str,
) -> None:
    # Given a run claimed over HTTP, then the database cut
    pool, proxy = proxied_pool
    await redis_client.set(f"{redis_prefix}epoch", "fixture|0")  # an established data set
    services = services_on(
        CockroachStore(pool, base_backoff=0.001),
        queue=RedisQueue(redis_client, prefix=redis_prefix),
    )
    registry = new_registry()
    app = create_app(services.api, services.settings, OrchestratorMetrics(registry), registry)
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's scope types
    submitted = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    [task_id] = submitted.task_ids.values()
    lease_key = KeyLayout(redis_prefix).lease(task_id)
    async with httpx.AsyncClient(transport=transport, base_url="http://dtq", timeout=30) as http:
        claimed = await http.post(
            "/v1/worker/claim", json={"worker_id": "w1", "kinds": ["k"], "wait": "2s"}
        )
        [task] = claimed.json()["tasks"]
        run = f"/v1/worker/runs/{task['run_id']}"
        before = int(await redis_client.hget(lease_key, "deadline_ms") or 0)
        proxy.cut()

        # When the worker, and another worker id, send heartbeats during the outage
        beat = await http.post(f"{run}/heartbeat", json={}, headers=W1)
        foreign = await http.post(f"{run}/heartbeat", json={}, headers={"X-Worker-Id": "w2"})
        during = await http.post(f"{run}/result", json={"result": 1}, headers=W1)
        after = int(await redis_client.hget(lease_key, "deadline_ms") or 0)
        proxy.restore()
        done = None
        for _ in range(50):  # the pool reconnects within seconds
            done = await http.post(f"{run}/result", json={"result": 1}, headers=W1)
            if done.status_code != 503:
                break

    # Then the lease was extended from Redis alone, the other worker refused, and the success
    # held through the outage is recorded once the database is back
    assert beat.status_code == 200, beat.text
    assert after > before
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (409, "run_not_owned")
    assert during.status_code == 503
    assert done is not None
    assert done.json()["outcome"] == "recorded", done.text
    view = await services.api.queries.get_task(UUID(task["task_id"]))
    assert (view.task.status, view.task.result) == ("completed", 1)
