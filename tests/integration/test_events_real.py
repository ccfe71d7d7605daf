"""The transition outbox and the event stream on PostgreSQL (SERIALIZABLE) and Redis (issue 16
item 1): one outbox statement per claim and per completion batch, the late-commit case the
settle horizon exists for, resumption across a rebuilt app and a Redis flush, and retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest
import uvicorn
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.cockroach.events import PgEventRepository
from dtq.adapters.redis import RedisQueue
from dtq.adapters.redis.keys import tagged_prefix
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.events import EventService, EventStreamPolicy
from dtq.application.ports import Event, EventCursor, Transaction
from dtq.domain.events import NewEvent
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.integration.test_store_contract import add, db_now, new_job, new_task
from tests.integration.wiring import claim_ready, counting_statements, services_on
from tests.sse import Message, collect

pytestmark = pytest.mark.integration

SETTINGS = Settings(api_auth="none", events_settle=0.3, events_poll_interval=0.02)


def outbox_inserts(sent: list[str]) -> int:
    return sum("INSERT INTO events" in text for text in sent)


async def every_event(store: CockroachStore) -> list[Event]:
    return await EventService(store=store, policy=EventStreamPolicy(settle=0.0001)).page(
        after=None, limit=10_000
    )


async def test_claim_and_completion_batches_each_gain_one_outbox_statement(
    pg_store: CockroachStore,
) -> None:
    services = services_on(pg_store)
    specs = tuple(TaskSpec(f"t{i}", "echo") for i in range(10))
    await services.api.submit.submit_job(SubmitJob(tasks=specs))

    with counting_statements() as claim_sent:
        claims = await claim_ready(services)
    with counting_statements() as complete_sent:
        await services.worker.execution.complete_many(claims)

    assert len(claims) == 10
    assert outbox_inserts(claim_sent) == 1 and outbox_inserts(complete_sent) == 1
    types = [e.type for e in await every_event(pg_store)]
    assert types.count("task.running") == 10 and types.count("task.completed") == 10
    assert types[-1] == "job.completed" and types.count("job.running") == 1


async def test_a_transaction_that_changes_no_status_sends_no_outbox_statement(
    pg_store: CockroachStore,
) -> None:
    async def read_only(tx: Transaction) -> None:
        await tx.jobs.get(uuid4())

    with counting_statements() as sent:
        await pg_store.run(read_only)
    assert outbox_inserts(sent) == 0


async def write_uncommitted(conn: psycopg.AsyncConnection[Any], job_id: UUID) -> None:
    """Begin a transaction on ``conn`` and write one outbox event, as a store try's last
    statement does; the caller commits."""
    await conn.execute("BEGIN")
    outbox = PgEventRepository(conn)
    outbox.add_many([NewEvent(job_id, None, "job.submitted", {"status": "pending"})])
    insert = outbox.take_insert(conn)
    assert insert is not None
    await conn.execute(insert, prepare=False)


async def follow_into(service: EventService, found: list[Event]) -> None:
    async for batch in service.follow(after=None):
        found.extend(batch)


async def test_an_event_committed_late_is_still_delivered_in_order(
    pg_store: CockroachStore, pg_dsn: str
) -> None:
    """T1 writes its event first but commits after T2. A reader serving every committed event
    at once passes over T1's (its time is older than T2's, which the reader's cursor has
    already passed); the settle horizon waits, so both arrive, T1's first."""
    early, late = uuid4(), uuid4()
    settled = EventService(store=pg_store, policy=EventStreamPolicy(settle=0.5, poll_interval=0.02))
    eager = EventService(store=pg_store, policy=EventStreamPolicy(settle=1e-6, poll_interval=0.02))
    got_settled: list[Event] = []
    got_eager: list[Event] = []
    readers = [
        asyncio.create_task(follow_into(settled, got_settled)),
        asyncio.create_task(follow_into(eager, got_eager)),
    ]
    t1 = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    t2 = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    try:
        await write_uncommitted(t1, early)
        await write_uncommitted(t2, late)
        await t2.execute("COMMIT")
        async with asyncio.timeout(5):
            while not got_eager:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # T1 commits 100+ ms after T2: within the settle margin
        await t1.execute("COMMIT")
        async with asyncio.timeout(5):
            while len(got_settled) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # give the eager reader every chance to see T1's event
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await t1.close()
        await t2.close()

    assert [e.job_id for e in got_settled] == [early, late]
    assert got_settled[0].created_at < got_settled[1].created_at
    assert [e.job_id for e in got_eager] == [late]  # the hazard is real without the horizon


@asynccontextmanager
async def serving(services: Services) -> AsyncIterator[str]:
    """The API of ``services`` under uvicorn on 127.0.0.1; yields its base URL."""
    registry = new_registry()
    app = create_app(services.api, services.settings, OrchestratorMetrics(registry), registry)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(5):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


def redis_services(store: CockroachStore, redis: Redis, prefix: str) -> Services:
    return services_on(store, queue=RedisQueue(redis, prefix=prefix), settings=SETTINGS)


async def run_all(services: Services, job_id: UUID, *, rounds: int = 50) -> None:
    """Reconcile, claim and complete until the job is completed."""
    for _ in range(rounds):
        await services.reconciler.reconcile.reconcile_once()
        claims = await claim_ready(services)
        if claims:
            await services.worker.execution.complete_many(claims)
        if (await services.api.queries.get_job(job_id)).job.status is JobStatus.COMPLETED:
            return
    raise AssertionError("the job did not finish")


async def test_a_stream_resumed_after_a_rebuilt_app_and_a_redis_flush_misses_nothing(
    pg_store: CockroachStore,
    redis_client: Redis,
    redis_prefix: str,
    redis_wipe: Callable[[], Any],
) -> None:
    await redis_client.set(f"{tagged_prefix(redis_prefix)}epoch", "fixture|0")
    first = redis_services(pg_store, redis_client, redis_prefix)
    chain = (
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("c", "echo", depends_on=("b",)),
    )
    submitted = await first.api.submit.submit_job(SubmitJob(tasks=chain))
    job = {"job_id": str(submitted.job_id)}
    async with serving(first) as url, httpx.AsyncClient(base_url=url) as client:
        claims = await claim_ready(first)
        await first.worker.execution.complete_many(claims)  # a done, b promoted
        seen = await collect(client, job, count=5)  # stop mid-stream, after a's claim
    await redis_wipe()  # the queue loses everything, b's delivery included

    second = redis_services(pg_store, redis_client, redis_prefix)
    await run_all(second, submitted.job_id)
    async with serving(second) as url, httpx.AsyncClient(base_url=url) as client:
        rest = await collect(client, job, count=9, headers={"Last-Event-ID": str(seen[-1].id)})

    stored = [e for e in await every_event(pg_store) if e.job_id == submitted.job_id]
    streamed: list[Message] = seen + rest
    assert [m.event for m in streamed] == [e.type for e in stored]
    assert len({m.id for m in streamed}) == len(streamed) == 14
    names = {v: k for k, v in submitted.task_ids.items()}
    order = [
        (m.event, names.get(UUID(m.data["task_id"])) if m.data["task_id"] else None)
        for m in streamed
    ]
    for name in "abc":
        mine = [event for event, task in order if task == name]
        assert mine[-3:] == ["task.queued", "task.running", "task.completed"], (name, mine)
    assert order[-1] == ("job.completed", None)


async def test_retention_deletes_a_pruned_jobs_events_on_postgres(pg_store: CockroachStore) -> None:
    now = await db_now(pg_store)
    old = now - timedelta(days=2)
    job = new_job(old)
    job.status = JobStatus.COMPLETED
    task = new_task(job, "a", old, status=TaskStatus.COMPLETED, finished_at=old)
    await add(pg_store, job, [task])
    kept = new_job(now)
    await add(pg_store, kept, [new_task(kept, "a", now)])
    assert {e.job_id for e in await every_event(pg_store)} == {job.id, kept.id}

    async def prune(tx: Transaction) -> int:
        pruned = await tx.retention.delete_jobs(
            [job.id], status=JobStatus.COMPLETED, finished_before=now, tombstone_at=None
        )
        return pruned.jobs

    assert await pg_store.run(prune) == 1
    assert {e.job_id for e in await every_event(pg_store)} == {kept.id}


async def test_the_page_read_refuses_nothing_it_should_serve(pg_store: CockroachStore) -> None:
    """Cursor edges: strictly after, equal times broken by id, the job and type filters."""
    now = await db_now(pg_store)
    job = new_job(now)
    await add(pg_store, job, [new_task(job, "a", now), new_task(job, "b", now)])
    service = EventService(store=pg_store, policy=EventStreamPolicy(settle=0.0001))
    events = await service.page(after=None, job_id=job.id)
    assert [e.type for e in events] == ["job.submitted", "task.queued", "task.queued"]
    assert await service.page(after=events[0].cursor, limit=1) == [events[1]]
    assert await service.page(after=events[-1].cursor) == []
    assert [e.id for e in await service.page(after=None, types=["job.submitted"])] == [events[0].id]
    before_all = EventCursor(events[0].created_at - timedelta(microseconds=1), events[0].id)
    assert await service.page(after=before_all, job_id=job.id) == events
    settled = replace(service.policy, settle=30.0)
    assert await EventService(store=pg_store, policy=settled).page(after=None) == []
