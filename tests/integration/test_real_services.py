"""The application services and the HTTP API on PostgreSQL + Redis (the real adapters).

These repeat, on the production adapters, flows the unit suite checks on the fakes: the API's
submit/read round trip, concurrent claimers, concurrent completions inside one job (the
serialization-retry path), and repair after Redis loses its data mid-run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from uuid import UUID

import httpx
import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import RedisQueue, tagged_prefix
from dtq.application.commands import Claim, SubmitJob, TaskSpec
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from dtq.worker import Options, Runtime
from tests.integration.conftest import delete_prefix_keys
from tests.integration.wiring import POLICY, services_on
from tests.single import claim_one, complete_one, pop_one

pytestmark = pytest.mark.integration


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    """The production container with the real adapters of the fixtures plugged in, on a Redis
    whose data set is long established (its epoch began at the Unix epoch): a fresh prefix
    would otherwise look like a Redis that just lost its data, and hold reclaims back."""
    await redis_client.set(f"{tagged_prefix(redis_prefix)}epoch", "fixture|0")
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix))


async def drain(services: Services, worker: str, *, rounds: int = 200) -> list[Claim]:
    """Pop, claim and complete until the ready list stays empty."""
    done: list[Claim] = []
    for _ in range(rounds):
        ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=16)
        if not ids:
            return done
        claims = await services.worker.execution.claim_many(ids, worker)
        await services.worker.execution.complete_many(claims)
        done.extend(claims)
    return done


async def test_api_round_trip_on_postgres_and_redis(services: Services) -> None:
    registry = new_registry()
    app = create_app(services.api, services.settings, OrchestratorMetrics(registry), registry)
    assert await services.api.health.check() == {"store": None, "queue": None}
    # httpx's ASGI transport runs the app on this test's event loop, where the pool and the
    # Redis client live (Litestar's test client would run it on a portal thread's loop).
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's scope types
    async with httpx.AsyncClient(transport=transport, base_url="http://dtq") as client:
        body = {
            "tasks": [
                {"name": "a", "kind": "echo", "payload": {"n": 1}},
                {"name": "b", "kind": "echo", "payload": {"n": 2}, "depends_on": ["a"]},
            ]
        }
        created = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k-1"})
        assert created.status_code == 201
        replay = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k-1"})
        assert replay.status_code == 200
        assert replay.json() == created.json()
        await drain(services, "w1")
        await drain(services, "w1")
        job = (await client.get(f"/v1/jobs/{created.json()['job_id']}")).json()
        assert job["status"] == "completed"
        task = (await client.get(f"/v1/tasks/{created.json()['tasks']['b']}")).json()
        assert [r["status"] for r in task["runs"]] == ["succeeded"]


async def test_eight_concurrent_claimers_claim_each_of_200_tasks_exactly_once(
    services: Services,
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(200)))
    )
    claimed: list[Claim] = []

    async def claimer(worker: str) -> None:
        while ids := await services.queue.pop_many(["default"], timeout=0.05, max_count=4):
            claimed.extend(await services.worker.execution.claim_many(ids, worker))

    await asyncio.gather(*(claimer(f"w{i}") for i in range(8)))
    counts = Counter(c.task.id for c in claimed)
    assert set(counts) == set(result.task_ids.values())
    assert set(counts.values()) == {1}
    assert await pop_one(services.queue, ["default"], timeout=0) is None


async def test_concurrent_completions_in_one_job_take_the_retry_path(
    services: Services, pg_store: CockroachStore
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(
            tasks=(
                *(TaskSpec(f"t{i}", "echo") for i in range(40)),
                TaskSpec("join", "echo", depends_on=tuple(f"t{i}" for i in range(40))),
            )
        )
    )
    ids = await services.queue.pop_many(["default"], timeout=0, max_count=100)
    claims = await services.worker.execution.claim_many(ids, "w1")
    assert len(claims) == 40
    before = pg_store.retries
    # eight workers report their batches of five at once; each batch probes the join's
    # dependencies, which the others are writing: SERIALIZABLE must make some of them retry
    batches = [claims[i : i + 5] for i in range(0, 40, 5)]
    outcomes = await asyncio.gather(*(services.worker.execution.complete_many(b) for b in batches))
    assert {o.value for batch in outcomes for o in batch} == {"recorded"}
    assert pg_store.retries > before, "no serialization retry was needed: the test proves nothing"
    view = await services.api.queries.get_job(result.job_id)
    status = {t.name: t.status for t in view.tasks}
    assert status["join"] is TaskStatus.QUEUED  # promoted exactly once all 40 completed
    assert await pop_one(services.queue, ["default"], timeout=0) == result.task_ids["join"]


async def test_redis_loss_mid_run_is_repaired_by_reconcile_and_reclaim(
    services: Services, redis_wipe: Callable[[], Awaitable[None]]
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(30)))
    )
    ids = await services.queue.pop_many(["default"], timeout=0, max_count=10)
    in_flight = await services.worker.execution.claim_many(ids, "w-dead")  # this worker then dies
    await redis_wipe()  # ready list, markers and leases are gone
    assert (
        await services.reconciler.reconcile.reclaim_stale() == 0
    )  # a pass notices: reclaims held back
    await asyncio.sleep(max(POLICY.stale_running_after, POLICY.lease_ttl) + 0.2)
    report = await services.reconciler.reconcile.reconcile_once()
    assert report.reclaimed == len(in_flight)  # each reclaimed task is pushed by the reclaim
    assert report.enqueued == 30 - len(in_flight)  # the never-claimed rest by enqueue_due
    await drain(services, "w-alive")
    view = await services.api.queries.get_job(result.job_id)
    assert view.job.status is JobStatus.COMPLETED
    dead = [await services.api.queries.get_task(c.task.id) for c in in_flight]
    for task_view in dead:
        assert [r.status for r in task_view.runs] == [RunStatus.DEAD, RunStatus.SUCCEEDED]
        assert task_view.runs[0].attempt_number == task_view.runs[1].attempt_number == 1


async def test_stale_report_after_reclaim_is_refused_on_postgres(services: Services) -> None:
    result = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "echo"),)))
    task_id: UUID = result.task_ids["a"]
    popped = await pop_one(services.queue, ["default"], timeout=0)
    assert popped is not None
    stale = await claim_one(services.worker.execution, popped, "w1")
    assert stale is not None
    await services.queue.delete_leases([(task_id, stale.run.id)])
    await asyncio.sleep(POLICY.stale_running_after + 0.2)
    assert await services.reconciler.reconcile.reclaim_stale() == 1
    popped = await pop_one(services.queue, ["default"], timeout=0)
    assert popped is not None
    fresh = await claim_one(services.worker.execution, popped, "w2")
    assert fresh is not None
    assert (await complete_one(services.worker.execution, stale)).value == "stale"
    assert (await complete_one(services.worker.execution, fresh)).value == "recorded"


async def test_batch_with_a_reclaimed_claim_records_the_others_on_postgres(
    services: Services,
) -> None:
    """The claim-time compare-and-set fails for the whole batch; the checked path, in the same
    transaction, records the live claims and refuses the stale one."""
    await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(3)))
    )
    ids = await services.queue.pop_many(["default"], timeout=0, max_count=3)
    claims = await services.worker.execution.claim_many(ids, "w1")
    assert len(claims) == 3
    stale = claims[1]
    await services.queue.delete_leases([(stale.task.id, stale.run.id)])
    await asyncio.sleep(POLICY.stale_running_after + 0.2)
    assert await services.reconciler.reconcile.reclaim_stale() == 1
    outcomes = await services.worker.execution.complete_many(claims)
    assert [o.value for o in outcomes] == ["recorded", "stale", "recorded"]
    for claim, status in zip(claims, ("completed", "queued", "completed"), strict=True):
        view = await services.api.queries.get_task(claim.task.id)
        assert view.task.status.value == status


async def test_redis_loss_reclaims_no_healthy_run_on_postgres_and_redis(
    services: Services, redis_wipe: Callable[[], Awaitable[None]]
) -> None:
    """Issue 12 bug 3 on the real services: a wipe of every key (what FLUSHDB does, limited to
    this test's prefix on the shared server) must not reclaim runs whose workers are alive."""
    await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(4)))
    )
    ids = await services.queue.pop_many(["default"], timeout=0, max_count=4)
    claims = await services.worker.execution.claim_many(ids, "w-alive")
    assert len(claims) == 4
    await asyncio.sleep(POLICY.stale_running_after + 0.2)  # long runs by the stale threshold
    await redis_wipe()
    report = await services.reconciler.reconcile.reconcile_once()
    assert report.reclaimed == 0 and report.queue_reset and report.reclaim_deferred
    for claim in claims:  # the live workers' next heartbeat re-creates their leases
        assert (await services.worker.execution.heartbeat(claim)).value == "extended"
    await asyncio.sleep(POLICY.lease_ttl + 0.2)
    for claim in claims:
        await services.worker.execution.heartbeat(claim)
    report = await services.reconciler.reconcile.reconcile_once()
    assert report.reclaimed == 0 and not report.reclaim_deferred
    for claim in claims:
        view = await services.api.queries.get_task(claim.task.id)
        assert view.task.status is TaskStatus.RUNNING and view.task.reclaims == 0
        assert [r.status for r in view.runs] == [RunStatus.RUNNING]


async def test_a_reconciler_on_another_prefix_leaves_a_live_workers_runs_alone(
    pg_store: CockroachStore, redis_client: Redis, redis_prefix: str
) -> None:
    """Two deployments on one database, their Redis key prefixes different (one mistyped):
    neither finds the other's leases, so without a guard each reconciler reclaimed the other's
    healthy runs (dead runs, tasks run twice). Runs of a live worker registered with another
    prefix are held back, reported by prefix; a dead worker's runs are still reclaimed."""
    other = f"{redis_prefix}other:"
    deployments = []
    try:
        for prefix in (redis_prefix, other):
            await redis_client.set(f"{tagged_prefix(prefix)}epoch", "fixture|0")
            deployments.append(
                services_on(
                    pg_store,
                    queue=RedisQueue(redis_client, prefix=prefix),
                    settings=Settings(api_auth="none", redis_key_prefix=prefix),
                )
            )
        mine, theirs = deployments
        await mine.api.submit.submit_job(
            SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(2)))
        )
        ids = await mine.queue.pop_many(["default"], timeout=0, max_count=2)
        live = await claim_one(mine.worker.execution, ids[0], "a")
        dead = await claim_one(mine.worker.execution, ids[1], "b")
        assert live is not None and dead is not None
        await mine.worker.registry.heartbeat("a", "host", {})  # alive; "b" never registered
        await asyncio.sleep(POLICY.stale_running_after + 0.2)
        report = await theirs.reconciler.reconcile.reconcile_once()
        assert report.reclaimed == 1  # the unregistered worker's run: no sign it is alive
        assert report.reclaims_held == {tagged_prefix(redis_prefix): 1}
        view = await mine.api.queries.get_task(live.task.id)
        assert view.task.status is TaskStatus.RUNNING and view.task.reclaims == 0
        assert (await complete_one(mine.worker.execution, live)).value == "recorded"
        assert (await complete_one(mine.worker.execution, dead)).value == "stale"
    finally:
        await delete_prefix_keys(redis_client, other)


async def test_a_native_worker_stopped_cleanly_removes_its_registry_row(
    services: Services,
) -> None:
    runtime = Runtime(Options(poll_timeout=0.1, shutdown_grace=0.2))
    runtime.register("echo", lambda task: None)
    stop = asyncio.Event()
    config = runtime.configure(Settings(worker_id="native-1", worker_heartbeat_interval=1.0))
    worker = asyncio.create_task(runtime.run(services.worker, config, stop=stop))
    async with asyncio.timeout(10):
        while not (live := await services.api.queries.list_workers(120.0)):
            await asyncio.sleep(0.02)

    stop.set()
    await asyncio.wait_for(worker, timeout=10)

    assert [(w.id, w.metadata["kinds"]) for w in live] == [("native-1", ["echo"])]
    assert await services.api.queries.list_workers(120.0) == []
