"""Traces (issue 16 item 5) on PostgreSQL and Redis: the trace context of a submit request is
stored with the job (``jobs.trace_context``) and reaches every claim of its tasks, the
dependents promoted by a completion included, and a claim read back after an unknown commit."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import KeyLayout, RedisQueue
from dtq.application.commands import ReportOutcome
from dtq.entrypoints import tracing
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready, services_on

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    await redis_client.set(KeyLayout(redis_prefix).epoch, "fixture|0")
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


async def test_the_submit_context_is_stored_and_reaches_every_claim_of_the_job(
    services: Services, client: httpx.AsyncClient, spans: InMemorySpanExporter
) -> None:
    body = {
        "tasks": [
            {"name": "a", "kind": "k"},
            {"name": "b", "kind": "k", "depends_on": ["a"]},
            {"name": "c", "kind": "k", "depends_on": ["a"]},
        ]
    }
    response = await client.post("/v1/jobs", json=body, headers={"traceparent": TRACEPARENT})
    assert response.status_code == 201, response.text
    [submit] = spans.get_finished_spans()
    assert submit.context is not None
    span_id = f"{submit.context.span_id:016x}"
    job = await services.store.run(lambda tx: tx.jobs.get(UUID(response.json()["job_id"])))
    assert job is not None and job.trace_context is not None
    assert job.trace_context.startswith(f"00-{TRACE_ID}-{span_id}-")

    [a] = await claim_ready(services)
    assert a.trace_context == job.trace_context
    assert await services.worker.execution.complete_many([a], ["done"]) == [ReportOutcome.RECORDED]
    dependents = await claim_ready(services)
    assert sorted(claim.task.name for claim in dependents) == ["b", "c"]
    assert {claim.trace_context for claim in dependents} == {job.trace_context}

    recovered = await services.worker.execution.recover_claims(
        {claim.task.id: claim.run.id for claim in dependents}, "w1"
    )
    assert {claim.trace_context for claim in recovered} == {job.trace_context}


async def test_without_tracing_nothing_is_stored_and_claims_carry_nothing(
    services: Services, client: httpx.AsyncClient
) -> None:
    response = await client.post(
        "/v1/tasks", json={"kind": "k"}, headers={"traceparent": TRACEPARENT}
    )
    assert response.status_code == 201, response.text
    job = await services.store.run(lambda tx: tx.jobs.get(UUID(response.json()["job_id"])))
    [claim] = await claim_ready(services)
    assert job is not None
    assert (job.trace_context, claim.trace_context) == (None, None)
