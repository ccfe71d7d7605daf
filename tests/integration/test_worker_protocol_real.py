"""The HTTP worker protocol (issue 15 item 1) on PostgreSQL (SERIALIZABLE) + Redis: claims held
on the real blocking pop, reports fenced by the real SQL, concurrent claimers, and the Python
runtime's HTTP backend draining a job."""

from __future__ import annotations

import asyncio
from collections import Counter
from uuid import UUID

import httpx
import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.redis import RedisQueue
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from dtq.entrypoints.worker.http import open_http_worker_services
from dtq.worker import Options, Runtime, Task
from tests.integration.wiring import services_on

pytestmark = pytest.mark.integration

W1 = {"X-Worker-Id": "w1"}


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    await redis_client.set(f"{redis_prefix}epoch", "fixture|0")  # an established data set
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix))


def transport(services: Services) -> httpx.ASGITransport:
    registry = new_registry()
    app = create_app(services.api, services.settings, OrchestratorMetrics(registry), registry)
    return httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's scope types


@pytest.fixture
async def http(services: Services) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=transport(services), base_url="http://dtq", timeout=30)


async def claim(http: httpx.AsyncClient, worker: str = "w1", **body: object) -> httpx.Response:
    return await http.post(
        "/v1/worker/claim",
        json={"worker_id": worker, "kinds": ["k"], "wait": "2s", **body},
    )


async def test_a_dag_runs_over_the_protocol_with_fenced_replays(
    services: Services, http: httpx.AsyncClient
) -> None:
    submitted = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k", depends_on=("a",))))
    )
    [a] = (await claim(http)).json()["tasks"]
    run_a = f"/v1/worker/runs/{a['run_id']}"

    beat = await http.post(f"{run_a}/heartbeat", json={"progress": {"p": 1}}, headers=W1)
    done = await http.post(f"{run_a}/result", json={"result": {"n": 2}}, headers=W1)
    replay = await http.post(f"{run_a}/result", json={"result": {"n": 2}}, headers=W1)
    late = await http.post(f"{run_a}/heartbeat", json={}, headers=W1)
    [b] = (await claim(http)).json()["tasks"]
    finished = await http.post(
        f"/v1/worker/runs/{b['run_id']}/result", json={"result": "ok"}, headers=W1
    )

    assert (beat.status_code, beat.json()["cancel"]) == (200, False)
    assert [r.json()["outcome"] for r in (done, replay, finished)] == [
        "recorded",
        "duplicate",
        "recorded",
    ]
    assert (late.status_code, late.json()["error"]["code"]) == (409, "lease_lost")
    assert b["parents"] == {"a": {"n": 2}}
    job = await services.api.queries.get_job(submitted.job_id)
    assert job.job.status == "completed"
    assert {t.name: t.progress for t in job.tasks}["a"] == {"p": 1}


async def test_a_report_on_a_reclaimed_run_is_refused_by_the_sql_fence(
    services: Services, http: httpx.AsyncClient
) -> None:
    submitted = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    [a] = (await claim(http)).json()["tasks"]
    held = await services.api.remote.load(UUID(a["run_id"]), "w1")
    await services.worker.execution.hand_back(held, "taken away")
    run_a = f"/v1/worker/runs/{a['run_id']}"

    result = await http.post(f"{run_a}/result", json={"result": 1}, headers=W1)
    failure = await http.post(f"{run_a}/failure", json={"error": "x"}, headers=W1)

    assert (result.status_code, result.json()["error"]["code"]) == (409, "stale_run")
    assert (failure.status_code, failure.json()["error"]["code"]) == (409, "stale_run")
    [task] = (await services.api.queries.get_job(submitted.job_id)).tasks
    assert (task.status, task.result, task.attempt) == ("queued", None, 0)


async def test_concurrent_held_claims_take_each_task_once(
    services: Services, http: httpx.AsyncClient
) -> None:
    await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "k") for i in range(12)))
    )

    answers = await asyncio.gather(
        *(claim(http, worker=f"w{i}", max=3, wait="0s") for i in range(6))
    )

    claimed = [t["task_id"] for r in answers if r.status_code == 200 for t in r.json()["tasks"]]
    assert len(claimed) == 12
    assert max(Counter(claimed).values()) == 1


async def test_a_foreign_kind_goes_back_to_the_redis_ready_list_unclaimed(
    services: Services, http: httpx.AsyncClient
) -> None:
    submitted = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "other"),)))

    skipped = await claim(http, wait="300ms")
    taken = await claim(http, kinds=["other"])

    assert skipped.status_code == 204
    assert taken.json()["tasks"][0]["task_id"] == str(submitted.task_ids["a"])
    runs = (await services.api.queries.get_task(submitted.task_ids["a"])).runs
    assert len(runs) == 1


async def test_the_python_runtime_drains_a_job_over_http(services: Services) -> None:
    runtime = Runtime(Options(concurrency=4, poll_timeout=0.5, shutdown_grace=1.0))

    @runtime.handler("k")
    async def double(task: Task) -> int:
        return int(task.payload) * 2

    submitted = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "k", payload=i) for i in range(30)))
    )
    settings = Settings(worker_id="http-1", lease_duration=2.0)
    stop = asyncio.Event()
    async with open_http_worker_services(
        "http://dtq",
        worker_id="http-1",
        kinds=runtime.kinds,
        lease_duration=2.0,
        max_result_bytes=1024,
        transport=transport(services),
    ) as backend:
        worker = asyncio.create_task(runtime.run(backend, runtime.configure(settings), stop=stop))
        async with asyncio.timeout(30):
            while not (
                job := await services.api.queries.get_job(submitted.job_id)
            ).job.status.terminal:
                await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(worker, timeout=10)

    assert job.job.status == "completed"
    assert sorted(t.result for t in job.tasks) == [2 * i for i in range(30)]
    assert await services.api.queries.list_workers(120.0) == []  # its clean stop removed it


async def test_a_claiming_worker_is_live_in_the_registry_until_it_removes_its_row(
    services: Services, http: httpx.AsyncClient
) -> None:
    await claim(http, kinds=["k", "j"], priorities=["high"], wait="0s")

    [row] = await services.api.queries.list_workers(120.0)
    served = await services.api.fleet.submit_warnings([TaskSpec("a", "k", priority="high")])
    removed = await http.post("/v1/worker/registry/remove", json={"worker_id": "w1"})
    left = await services.api.queries.list_workers(120.0)

    assert (row.id, row.metadata) == ("w1", {"kinds": ["j", "k"], "priorities": ["high"]})
    assert served == []
    assert removed.status_code == 204
    assert left == []


async def test_registry_metadata_with_malformed_kinds_is_refused_and_not_stored(
    services: Services, http: httpx.AsyncClient
) -> None:
    refused = await http.post(
        "/v1/worker/registry",
        json={"worker_id": "h1", "metadata": {"priorities": [5], "kinds": [{}]}},
    )

    assert (refused.status_code, refused.json()["error"]["field"]) == (400, "metadata.kinds")
    assert await services.api.queries.list_workers(120.0) == []


async def test_concurrent_single_results_of_one_job_share_commits(
    services: Services, http: httpx.AsyncClient
) -> None:
    """Per-task commits of one job conflict under SERIALIZABLE; concurrent ``…/result``
    reports are coalesced into ``complete_many`` batches instead."""
    submitted = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "k") for i in range(20)))
    )
    claimed = (await claim(http, max=20, wait="0s")).json()["tasks"]
    calls: list[int] = []
    execution = services.api.remote._execution  # the service's own, to count its commits
    complete_many = execution.complete_many

    async def counted(claims: object, *args: object, **kwargs: object) -> object:
        calls.append(len(claims))  # type: ignore[arg-type]
        return await complete_many(claims, *args, **kwargs)  # type: ignore[arg-type]

    execution.complete_many = counted  # type: ignore[method-assign,assignment]
    answers = await asyncio.gather(
        *(
            http.post(f"/v1/worker/runs/{t['run_id']}/result", json={"result": 1}, headers=W1)
            for t in claimed
        )
    )

    assert [a.json()["outcome"] for a in answers] == ["recorded"] * 20
    assert sum(calls) == 20 and len(calls) < 20
    job = await services.api.queries.get_job(submitted.job_id)
    assert job.job.status == "completed"
