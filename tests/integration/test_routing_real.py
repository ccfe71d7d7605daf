"""Kind-aware routing on PostgreSQL (SERIALIZABLE) and Redis (issue 15 item 2).

A worker that pops a task of a kind it does not serve routes it at claim, without a statement of
its own; after Redis loses everything, the reconciler's re-enqueue puts the tasks back on their
tier and the same claim-time routing hands each kind to its workers again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID, uuid4

import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import KeyLayout, RedisQueue
from dtq.application.commands import Claim, SubmitJob, TaskSpec
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import counting_statements, services_on

pytestmark = pytest.mark.integration


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix))


async def submit(services: Services, **kinds: int) -> dict[str, UUID]:
    specs = tuple(
        TaskSpec(f"{kind}{i}", kind) for kind, count in kinds.items() for i in range(count)
    )
    return (await services.api.submit.submit_job(SubmitJob(tasks=specs))).task_ids


async def pop_and_claim(services: Services, worker: str, kinds: set[str]) -> list[Claim]:
    ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=50, kinds=kinds)
    return await services.worker.execution.claim_many(ids, worker, kinds)


async def test_routing_a_task_at_claim_adds_no_statement(
    services: Services, redis_client: Redis, redis_prefix: str
) -> None:
    alone = await submit(services, a=1)
    mixed = await submit(services, a=1, b=1)

    async def claim(ids: list[UUID]) -> list[Claim]:
        return await services.worker.execution.claim_many(ids, "w-a", {"a"})

    # two ids either way (a lone id is read with its job: test_idle_path_real): one claimed,
    # the other unknown here, of a kind this worker does not serve below
    with counting_statements() as for_one:
        assert len(await claim([alone["a0"], uuid4()])) == 1
    with counting_statements() as for_mixed:
        claims = await claim([mixed["a0"], mixed["b0"]])

    assert [c.task.id for c in claims] == [mixed["a0"]]
    assert for_mixed == for_one  # the kind is read from the rows the claim reads anyway
    routed = await redis_client.lrange(KeyLayout(redis_prefix).routed("default", "b"), 0, -1)
    assert routed == [str(mixed["b0"]).encode()]


async def test_after_a_redis_flush_the_reconciler_re_enqueue_routes_each_kind_to_its_workers(
    services: Services, redis_wipe: Callable[[], Awaitable[None]]
) -> None:
    ids = await submit(services, a=5, b=5)
    first = await pop_and_claim(services, "w-a", {"a"})  # routes the five "b" tasks
    assert sorted(c.task.kind for c in first) == ["a"] * 5

    await redis_wipe()  # Redis loses the routed list, the markers and the epoch
    report = await services.reconciler.reconcile.reconcile_once()
    assert report.enqueued == 5  # the queued "b" tasks, back on their tier

    assert await pop_and_claim(services, "w-a", {"a"}) == []  # popped and routed again
    second = await pop_and_claim(services, "w-b", {"b"})
    assert sorted(c.task.kind for c in second) == ["b"] * 5
    await services.worker.execution.complete_many([*first, *second])

    for task_id in ids.values():
        view = await services.api.queries.get_task(task_id)
        assert view.task.status is TaskStatus.COMPLETED and len(view.runs) == 1
    job = await services.api.queries.get_job(view.task.job_id)
    assert job.job.status is JobStatus.COMPLETED
