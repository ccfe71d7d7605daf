"""Retention on PostgreSQL with SERIALIZABLE (issue 14 item 8): the SQL of the retention pass,
tombstone replays over the HTTP API, two orchestrators pruning at once, and pruning racing a
replayed idempotent submit.

Jobs are run to their end through the real services, then made old by moving their
timestamps back in SQL (the database clock cannot be advanced).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from dtq.adapters.cockroach.retention import PgRetentionRepository
from dtq.adapters.cockroach.sql import FINISHED_JOBS_AFTER
from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import PrunedJobs
from dtq.application.retention import RetentionPolicy, RetentionService
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready

pytestmark = pytest.mark.integration

DAY = 86400.0
POLICY = RetentionPolicy(completed=7 * DAY, failed=30 * DAY, idempotency_key_ttl=7 * DAY)
Pool = AsyncConnectionPool[Any]


def retention(services: Services, **bounds: int) -> RetentionService:
    return RetentionService(store=services.store, policy=POLICY, **bounds)


async def age(pool: Pool, job_ids: Sequence[UUID], days: float) -> None:
    """Move every timestamp of the jobs, their tasks and runs ``days`` into the past."""
    back = timedelta(days=days)
    ids = list(job_ids)
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET created_at = created_at - %s, updated_at = updated_at - %s"
            " WHERE id = ANY(%s::uuid[])",
            (back, back, ids),
        )
        await conn.execute(
            "UPDATE task_runs SET started_at = started_at - %s, finished_at = finished_at - %s"
            " WHERE task_id IN (SELECT id FROM tasks WHERE job_id = ANY(%s::uuid[]))",
            (back, back, ids),
        )
        await conn.execute(
            "UPDATE tasks SET created_at = created_at - %s, updated_at = updated_at - %s,"
            " scheduled_at = scheduled_at - %s, started_at = started_at - %s,"
            " finished_at = finished_at - %s WHERE job_id = ANY(%s::uuid[])",
            (back, back, back, back, back, ids),
        )


async def count(pool: Pool, table: str) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute(f"SELECT count(*) FROM {table}")).fetchone()
    assert row is not None
    return int(row[0])


async def rows_left(pool: Pool) -> dict[str, int]:
    tables = ("jobs", "tasks", "task_dependencies", "task_runs", "idempotency_tombstones")
    return {table: await count(pool, table) for table in tables}


def chain(key: str | None = None, body: str = "h1") -> SubmitJob:
    return SubmitJob(
        tasks=(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",))),
        idempotency_key=key,
        request_hash=body if key else None,
    )


async def run_to_end(services: Services) -> None:
    """Claim and complete whatever becomes ready until nothing is left."""
    while claims := await claim_ready(services):
        await services.worker.execution.complete_many(claims)


async def completed(services: Services, cmd: SubmitJob | None = None) -> SubmitResult:
    result = await services.api.submit.submit_job(cmd or chain())
    await run_to_end(services)
    return result


async def failed(services: Services) -> SubmitResult:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("f", "echo", max_attempts=1),))
    )
    [claim] = await claim_ready(services)
    await services.worker.execution.fail(claim, "ValueError: boom")
    return result


# --- by age, per status -----------------------------------------------------------------------


async def test_jobs_are_pruned_by_age_per_status_with_their_tasks_edges_and_runs(
    services: Services, pg_pool: Pool
) -> None:
    done, lost = await completed(services), await failed(services)
    fresh = await completed(services)
    await age(pg_pool, [done.job_id, lost.job_id], days=8)
    service = retention(services)

    report = await service.prune_once()

    assert (report.jobs, report.tasks, report.runs) == (1, 2, 2)
    assert await rows_left(pg_pool) == {
        "jobs": 2,
        "tasks": 3,
        "task_dependencies": 1,
        "task_runs": 3,
        "idempotency_tombstones": 0,
    }
    await age(pg_pool, [lost.job_id], days=23)
    assert (await service.prune_once()).jobs == 1
    assert (await services.api.queries.get_job(fresh.job_id)).job.id == fresh.job_id
    assert await count(pg_pool, "jobs") == 1


async def test_a_failed_job_with_a_task_still_running_is_kept(
    services: Services, pg_pool: Pool
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "echo")))
    )
    claims = {c.task.name: c for c in await claim_ready(services)}
    await services.worker.execution.fail(claims["a"], "ValueError: boom")
    await age(pg_pool, [result.job_id], days=40)  # b started 40 days ago and still runs
    service = retention(services)

    assert (await service.prune_once()).jobs == 0

    await services.worker.execution.complete_many([claims["b"]])  # b ends now
    assert (await service.prune_once()).jobs == 0
    await age(pg_pool, [result.job_id], days=31)
    assert (await service.prune_once()).jobs == 1


# --- tombstones through the HTTP API ----------------------------------------------------------


async def test_a_pruned_jobs_key_answers_its_ids_then_expires(
    services: Services, client: httpx.AsyncClient, pg_pool: Pool
) -> None:
    body = {"tasks": [{"name": "a", "kind": "echo"}, {"name": "b", "kind": "echo"}]}
    headers = {"Idempotency-Key": "order-1"}
    created = await client.post("/v1/jobs", json=body, headers=headers)
    assert created.status_code == 201, created.text
    await run_to_end(services)
    await age(pg_pool, [UUID(created.json()["job_id"])], days=8)
    service = retention(services)
    assert (await service.prune_once()).tombstones_written == 1

    replay = await client.post("/v1/jobs", json=body, headers=headers)
    other = await client.post("/v1/jobs", json={"tasks": body["tasks"][:1]}, headers=headers)

    assert (replay.status_code, replay.json()) == (200, created.json())
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"
    assert (await rows_left(pg_pool))["jobs"] == 0
    async with pg_pool.connection() as conn:
        await conn.execute(
            "UPDATE idempotency_tombstones SET pruned_at = pruned_at - interval '7 days'"
        )
    assert (await service.prune_once()).tombstones == 1
    fresh = await client.post("/v1/jobs", json=body, headers=headers)
    assert fresh.status_code == 201 and fresh.json()["job_id"] != created.json()["job_id"]


# --- races ------------------------------------------------------------------------------------


async def test_two_orchestrators_pruning_at_once_delete_each_job_once(
    services: Services, pg_pool: Pool
) -> None:
    jobs = [
        await completed(services, chain(key=f"k{i}" if i % 3 == 0 else None)) for i in range(24)
    ]
    await age(pg_pool, [j.job_id for j in jobs], days=8)
    first, second = retention(services, batch_jobs=5), retention(services, batch_jobs=5)

    reports = await asyncio.gather(first.prune_once(), second.prune_once())

    assert sum(r.jobs for r in reports) == 24
    assert sum(r.tasks for r in reports) == sum(r.runs for r in reports) == 48
    assert sum(r.tombstones_written for r in reports) == 8
    assert await rows_left(pg_pool) == {
        "jobs": 0,
        "tasks": 0,
        "task_dependencies": 0,
        "task_runs": 0,
        "idempotency_tombstones": 8,
    }


async def test_pruning_racing_a_replayed_submit_gives_one_answer_and_creates_nothing(
    services: Services, pg_pool: Pool
) -> None:
    for round_ in range(6):
        cmd = chain(key=f"race-{round_}")
        original = await completed(services, cmd)
        await age(pg_pool, [original.job_id], days=8)
        service = retention(services)
        prune, replay = service.prune_once(), services.api.submit.submit_job(cmd)
        if round_ % 2:
            replayed, report = await asyncio.gather(replay, prune)
        else:
            report, replayed = await asyncio.gather(prune, replay)

        assert (replayed.job_id, replayed.task_ids, replayed.created) == (
            original.job_id,
            original.task_ids,
            False,
        )
        assert report.jobs == 1
        again = await services.api.submit.submit_job(cmd)  # after the prune: the tombstone
        assert (again.job_id, again.created) == (original.job_id, False)
        assert await count(pg_pool, "jobs") == 0
        assert await count(pg_pool, "idempotency_tombstones") == round_ + 1


# --- bounds and the plan ----------------------------------------------------------------------


async def test_each_transaction_deletes_whole_jobs_within_the_task_bound(
    services: Services, pg_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = [await completed(services) for _ in range(5)]
    await age(pg_pool, [j.job_id for j in jobs], days=8)
    calls: list[PrunedJobs] = []
    original = PgRetentionRepository.delete_jobs

    async def recording(self: PgRetentionRepository, ids: list[UUID], **kw: Any) -> PrunedJobs:
        result = await original(self, ids, **kw)
        calls.append(result)
        return result

    monkeypatch.setattr(PgRetentionRepository, "delete_jobs", recording)

    report = await retention(services, batch_jobs=4, batch_tasks=5, max_pages=1).prune_once()

    assert report.jobs == 4
    assert [(c.jobs, c.tasks) for c in calls] == [(2, 4), (2, 4)]
    assert (await retention(services).prune_once()).jobs == 1


async def test_the_candidate_listing_is_a_range_scan_of_its_index(pg_pool: Pool) -> None:
    async with pg_pool.connection() as conn:
        await conn.execute("SET enable_seqscan = off")
        cur = await conn.execute(
            "EXPLAIN " + FINISHED_JOBS_AFTER,
            ("completed", datetime.now(UTC), datetime.now(UTC) - timedelta(days=30), uuid4(), 100),
        )
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
        await conn.execute("RESET enable_seqscan")
    assert "idx_jobs_status_updated_id" in plan, plan
    assert "Sort" not in plan, plan
