"""The dashboard's reads on PostgreSQL and Redis (issue 16 item 3): ``QueryService.job_graph``
(counts, tasks and edges, or counts alone past the bound) and the overview (counts per status
on the listing's index, the Redis ready list's depth, throughput from ``finished_at``), and the
job page drawn from them through the real wiring."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import httpx
import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import RedisQueue
from dtq.domain.status import TaskStatus
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.dashboard.reads import read_overview
from tests.integration.wiring import api_client, claim_ready, services_on

pytestmark = pytest.mark.integration

DIAMOND: list[dict[str, Any]] = [
    {"name": "a", "kind": "echo"},
    {"name": "b", "kind": "echo", "depends_on": ["a"]},
    {"name": "c", "kind": "echo", "depends_on": ["a"]},
    {"name": "d", "kind": "echo", "depends_on": ["b", "c"]},
]


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    queue = RedisQueue(redis_client, prefix=redis_prefix, marker_ttl=15.0)
    return services_on(pg_store, queue=queue)


@pytest.fixture
async def client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(services) as http:
        yield http


async def submit_diamond(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={"tasks": DIAMOND})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def test_job_graph_reads_the_edges_and_stops_at_the_bound(
    services: Services, client: httpx.AsyncClient
) -> None:
    created = await submit_diamond(client)
    ids = {name: UUID(value) for name, value in created["tasks"].items()}
    queries = services.api.queries

    graph = await queries.job_graph(UUID(created["job_id"]), max_tasks=4)
    bounded = await queries.job_graph(UUID(created["job_id"]), max_tasks=3)

    assert graph.tasks is not None
    assert sorted(t.name for t in graph.tasks) == ["a", "b", "c", "d"]
    assert sorted(graph.edges) == sorted(
        [(ids["a"], ids["b"]), (ids["a"], ids["c"]), (ids["b"], ids["d"]), (ids["c"], ids["d"])]
    )
    assert graph.counts[TaskStatus.QUEUED] == 1 and graph.counts[TaskStatus.PENDING] == 3
    assert bounded.tasks is None and bounded.counts == graph.counts


async def test_the_overview_counts_reads_the_redis_depth_and_the_completions(
    services: Services, client: httpx.AsyncClient
) -> None:
    for _ in range(2):
        await submit_diamond(client)
    claims = await claim_ready(services)
    assert len(claims) == 2
    await services.worker.execution.complete_many(claims)

    view = await read_overview(services.api.queries, services.api.inspector, now=datetime.now(UTC))

    counts = {c.status: c.count for c in view.counts}
    assert counts[TaskStatus.COMPLETED] == 2
    assert counts[TaskStatus.QUEUED] == 4  # b and c of both jobs, promoted
    assert counts[TaskStatus.PENDING] == 2
    assert view.depths == [("default", 4)]
    assert sum(n for _, n in view.throughput) == 2


async def test_the_job_page_draws_the_dag_from_the_database(client: httpx.AsyncClient) -> None:
    created = await submit_diamond(client)

    page = await client.get(f"/ui/jobs/{created['job_id']}")

    assert page.status_code == 200
    nodes = re.findall(r'data-task="(\w)" data-status="(\w+)"', page.text)
    assert sorted(nodes) == [("a", "queued"), ("b", "pending"), ("c", "pending"), ("d", "pending")]
    assert page.text.count('class="edge"') == 4


async def test_job_counts_read_the_statuses_with_the_counts_and_the_database_time(
    services: Services, client: httpx.AsyncClient
) -> None:
    created = await submit_diamond(client)
    job_id = UUID(created["job_id"])
    [claim] = await claim_ready(services)
    await services.worker.execution.complete_many([claim])
    events = services.api.events

    small = await services.api.queries.job_counts(job_id, max_tasks=4)
    large = await services.api.queries.job_counts(job_id, max_tasks=3)
    horizon = events.horizon(small.at)

    assert small.statuses is not None
    assert small.statuses[UUID(created["tasks"]["a"])] == TaskStatus.COMPLETED
    assert sorted(small.statuses.values()).count(TaskStatus.QUEUED) == 2
    assert small.counts[TaskStatus.COMPLETED] == 1 and not small.finished
    assert large.statuses is None and large.counts == small.counts
    assert abs((datetime.now(UTC) - small.at).total_seconds()) < 60  # the database's clock
    # a stream of the job started at the read's horizon begins two settle margins before it
    assert (small.at - horizon.created_at).total_seconds() == 2 * events.policy.settle
    assert horizon.id.int == 0
