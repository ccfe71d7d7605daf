"""Bulk operations on PostgreSQL with SERIALIZABLE (issue 14 item 6, "Bad input and races"):
bulk retry racing completions, single retries and a worker draining what it reopens; a bulk
cancel of 100,000 tasks through the HTTP API as a background operation.

After the race: nothing is lost (every task ends ``completed``), every run is accounted for
(each task has exactly the runs its history explains, none left ``running``), no task was
retried twice, and the counts add up (``matched == changed + skipped``; every failed task was
retried exactly once, by the bulk operation or by the single retry that beat it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest

from dtq.adapters.clock import SystemClock
from dtq.adapters.cockroach import CockroachStore
from dtq.application.bulk import BulkAction, BulkService
from dtq.application.commands import Claim, SubmitJob, TaskSpec
from dtq.application.control import ControlService
from dtq.application.filters import TaskFilter
from dtq.domain.errors import NotRetryable
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready

pytestmark = pytest.mark.integration

JOBS = 60
FAILED = TaskFilter(statuses=frozenset({TaskStatus.FAILED}))


async def stage(services: Services) -> tuple[list[UUID], list[Claim]]:
    """``JOBS`` jobs of two independent tasks: ``f`` failed for good (one failed run), ``r``
    running (claimed, its run live). Returns the failed ids and the running claims."""
    execution = services.worker.execution
    failed: list[UUID] = []
    for _ in range(JOBS):
        await services.api.submit.submit_job(
            SubmitJob(tasks=(TaskSpec("f", "echo", max_attempts=1), TaskSpec("r", "echo")))
        )
    running: list[Claim] = []
    while len(failed) + len(running) < 2 * JOBS:
        for claim in await claim_ready(services):
            if claim.task.name == "f":
                await execution.fail(claim, "boom", permanent=True)
                failed.append(claim.task.id)
            else:
                running.append(claim)
    return failed, running


async def test_bulk_retry_vs_concurrent_completion(
    services: Services, pg_store: CockroachStore
) -> None:
    failed, running = await stage(services)
    execution = services.worker.execution
    control = ControlService(store=pg_store, queue=services.queue, batch_size=25)
    bulk = BulkService(store=pg_store, control=control, clock=SystemClock(), batch_size=25)
    walking = asyncio.Event()

    async def complete_running() -> None:  # the worker finishing the running tasks
        for start in range(0, len(running), 5):
            await execution.complete_many(running[start : start + 5])
            walking.set()
            await asyncio.sleep(0)

    async def retry_some_alone() -> int:  # an operator retrying a few by hand meanwhile
        await walking.wait()
        retried = 0
        for task_id in failed[::7]:
            try:
                await services.api.control.retry_task(task_id)
                retried += 1
            except NotRetryable:
                pass  # the bulk operation came first
        return retried

    drained: list[UUID] = []
    stop = asyncio.Event()

    async def drain() -> None:  # a worker running what the retries push, while they push it
        while not stop.is_set() or len(drained) < len(failed):
            claims = [c for c in await claim_ready(services, "w2") if c.task.name == "f"]
            if claims:
                await execution.complete_many(claims)
                drained.extend(c.task.id for c in claims)

    drainer = asyncio.create_task(drain())
    outcome, _, alone = await asyncio.gather(
        bulk.run(BulkAction.RETRY, FAILED), complete_running(), retry_some_alone()
    )
    stop.set()
    await asyncio.wait_for(drainer, timeout=60)

    assert outcome.matched == outcome.changed + outcome.skipped
    assert outcome.changed + alone == len(failed)  # each failed task retried exactly once
    assert sorted(drained) == sorted(failed)  # and run exactly once afterwards
    for task_id in failed:
        view = await services.api.queries.get_task(task_id)
        assert view.task.status is TaskStatus.COMPLETED
        assert [r.status for r in view.runs] == [RunStatus.FAILED, RunStatus.SUCCEEDED]
    for claim in running:
        view = await services.api.queries.get_task(claim.task.id)
        assert view.task.status is TaskStatus.COMPLETED
        assert [(r.id, r.status) for r in view.runs] == [(claim.run.id, RunStatus.SUCCEEDED)]
    jobs = {(await services.api.queries.get_task(t)).task.job_id for t in failed}
    for job_id in jobs:
        assert (await services.api.queries.get_job(job_id)).job.status is JobStatus.COMPLETED


SEED = (
    "INSERT INTO jobs (id, name, status, created_at, updated_at)"
    " SELECT gen_random_uuid(), 'bulk', 'pending', now() - make_interval(secs => g), now()"
    " FROM generate_series(1, 100) AS g",
    "INSERT INTO tasks (id, job_id, name, kind, status, created_at, updated_at, job_position)"
    " SELECT gen_random_uuid(), j.id, 't' || p, 'bulk', 'queued', j.created_at, now(), p"
    " FROM jobs AS j, generate_series(0, 999) AS p",
    "ANALYZE tasks",
)


async def wait_done(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """Poll the operation until it has ended; every body seen, in order."""
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["status"] == "running":
        await asyncio.sleep(0.5)
        response = await client.get(url)
        assert response.status_code == 200
        seen.append(response.json())
    return seen


async def test_bulk_cancel_of_100000_tasks_runs_in_the_background(
    pg_dsn: str, pg_store: CockroachStore, client: httpx.AsyncClient
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement)
    body = {"kind": "bulk", "status": ["queued"]}

    dry = await client.post("/v1/tasks/cancel", json={**body, "dry_run": True})
    started = time.perf_counter()
    accepted = await client.post("/v1/tasks/cancel", json=body)
    answered = time.perf_counter() - started
    assert dry.status_code == 200 and dry.json()["matched"] == 100_000
    assert accepted.status_code == 202
    seen = await wait_done(client, accepted.headers["location"])
    took = time.perf_counter() - started

    done = seen[-1]
    assert done["status"] == "succeeded", done
    assert (done["matched"], done["changed"], done["skipped"]) == (100_000, 100_000, 0)
    progress = [s["matched"] for s in seen]
    assert progress == sorted(progress)  # the counts only grow
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        counts: dict[Any, Any] = dict(
            conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall()
        )
        jobs: dict[Any, Any] = dict(
            conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
        )
    assert counts == {"cancelled": 100_000}
    assert jobs == {"cancelled": 100}
    print(f"\n100,000-task bulk cancel: accepted in {answered:.3f} s, done in {took:.1f} s")
