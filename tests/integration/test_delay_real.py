"""Delayed submit on PostgreSQL and Redis (issue 14 item 2): the due time is stored by the SQL,
the delayed root and the delayed dependent wait in the Redis scheduled set until due."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import RedisQueue, tagged_prefix
from dtq.application.commands import ExecutionPolicy, SubmitJob, TaskSpec
from dtq.domain.policy import RetryPolicy
from dtq.domain.status import TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import services_on

pytestmark = pytest.mark.integration

POLICY = ExecutionPolicy(lease_duration=5.0, retry_backoff=0.1, stale_running_after=1.0)


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    await redis_client.set(f"{tagged_prefix(redis_prefix)}epoch", "fixture|0")
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix), policy=POLICY)


def members(raw: Sequence[object]) -> list[str]:
    return [m.decode() if isinstance(m, bytes) else str(m) for m in raw]


async def test_delayed_root_and_dependent_wait_for_their_time(
    services: Services, redis_client: Redis, redis_prefix: str
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(
            tasks=(
                TaskSpec("a", "echo", delay=timedelta(milliseconds=400)),
                TaskSpec("b", "echo", depends_on=("a",), delay=timedelta(seconds=1.2)),
            )
        )
    )
    a, b = result.task_ids["a"], result.task_ids["b"]
    view = await services.api.queries.get_job(result.job_id)
    times = {t.name: t.scheduled_at for t in view.tasks}
    assert times["b"] - times["a"] == timedelta(milliseconds=800)
    scheduled = await redis_client.zrange(f"{tagged_prefix(redis_prefix)}queue:scheduled", 0, -1)
    assert members(scheduled) == [f"default|{a}"]
    assert await services.queue.pop_many(["default"], timeout=0.05, max_count=4) == []

    reconcile = services.reconciler.reconcile
    assert await reconcile.promote_scheduled() == 0
    await asyncio.sleep(0.5)
    assert await reconcile.promote_scheduled() == 1
    ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=4)
    assert ids == [a]
    claims = await services.worker.execution.claim_many(ids, "w1")
    await services.worker.execution.complete_many(claims)

    # b's dependency completed at ~0.5 s, its own time is 1.2 s: scheduled, not pushed
    task_b = (await services.api.queries.get_task(b)).task
    assert task_b.status is TaskStatus.QUEUED and task_b.scheduled_at == times["b"]
    assert await services.queue.pop_many(["default"], timeout=0.05, max_count=4) == []
    scheduled = await redis_client.zrange(f"{tagged_prefix(redis_prefix)}queue:scheduled", 0, -1)
    assert members(scheduled) == [f"default|{b}"]
    await asyncio.sleep(0.8)
    assert await reconcile.promote_scheduled() == 1
    ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=4)
    assert [c.task.id for c in await services.worker.execution.claim_many(ids, "w1")] == [b]


async def test_retry_policy_and_timeout_are_stored_and_drive_the_retry(services: Services) -> None:
    policy = RetryPolicy(
        backoff="exponential", delay=timedelta(milliseconds=300), max_delay=timedelta(seconds=1)
    )
    result = await services.api.submit.submit_job(
        SubmitJob(
            tasks=(
                TaskSpec(
                    "a",
                    "echo",
                    max_attempts=3,
                    retry_policy=policy,
                    timeout=timedelta(seconds=90),
                ),
                TaskSpec("b", "echo"),
            )
        )
    )
    a, b = result.task_ids["a"], result.task_ids["b"]
    stored = (await services.api.queries.get_task(a)).task
    assert (stored.retry_policy, stored.timeout) == (policy, timedelta(seconds=90))
    plain = (await services.api.queries.get_task(b)).task
    assert (plain.retry_policy, plain.timeout) == (None, None)

    ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=4)
    claims = {c.task.id: c for c in await services.worker.execution.claim_many(ids, "w1")}
    assert claims[a].task.retry_policy == policy  # the claim's read carries it
    failed = await services.worker.execution.fail(claims[a], "boom")
    task = (await services.api.queries.get_task(a)).task
    assert failed.retry_at == task.scheduled_at
    assert task.scheduled_at - task.updated_at == timedelta(milliseconds=300)
