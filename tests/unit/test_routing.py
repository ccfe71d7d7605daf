"""Kind-aware routing (issue 15 item 2) on the memory adapters.

A worker receives only the kinds it registered: what it pops from a tier and does not serve is
routed, at claim, to the routed list of its (priority, kind), which only workers of that kind pop.
A mixed fleet drains a job of both kinds with nothing failed as unknown; a kind no worker serves
stays ``queued`` (and is explained as ``queued_no_worker``), never duplicated by the reconciler.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from uuid import UUID

import pytest

from dtq.application.commands import TaskSpec
from dtq.domain.status import JobStatus, TaskStatus
from dtq.worker import Options, Runtime, Task
from tests.unit.api_harness import running_api
from tests.unit.conftest import App
from tests.unit.runtime_harness import SETTINGS, Harness, build_harness

pytestmark = pytest.mark.timeout(30)

FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05, concurrency=4)


def runtime_of(*kinds: str, ran: dict[str, str], worker: str) -> Runtime:
    """A runtime with a handler for each of ``kinds`` that records who ran which task name."""
    runtime = Runtime(FAST)
    for kind in kinds:

        async def handle(task: Task) -> None:
            ran[task.payload["name"]] = worker

        runtime.register(kind, handle)
    return runtime


# -- the claim ---------------------------------------------------------------------------------


async def test_a_claim_with_kinds_routes_the_task_of_another_kind(app: App) -> None:
    submitted = await app.submit_tasks(TaskSpec("a1", "a"), TaskSpec("b1", "b"))
    a1, b1 = submitted.task_ids["a1"], submitted.task_ids["b1"]
    popped = await app.queue.pop_many(["default"], 0, 10, kinds={"a"})
    assert popped == [a1, b1]

    claims = await app.execution.claim_many(popped, "w-a", {"a"})

    assert [c.task.id for c in claims] == [a1]
    assert app.queue.routed_ids("default", "b") == [b1]
    assert app.queue.has_marker(b1) and not app.queue.has_marker(a1)
    view = await app.queries.get_task(b1)
    assert view.task.status is TaskStatus.QUEUED and view.runs == []  # no run was opened
    # only a worker serving "b" gets it, and claims it
    assert await app.queue.pop_many(["default"], 0, 10, kinds={"a"}) == []
    again = await app.queue.pop_many(["default"], 0, 10, kinds={"b"})
    assert [c.task.id for c in await app.execution.claim_many(again, "w-b", {"b"})] == [b1]
    assert not app.queue.has_marker(b1)


async def test_a_claim_without_kinds_claims_every_kind(app: App) -> None:
    submitted = await app.submit_tasks(TaskSpec("b1", "b"))
    popped = await app.queue.pop_many(["default"], 0, 10)

    claims = await app.execution.claim_many(popped, "w-any")

    assert [c.task.id for c in claims] == [submitted.task_ids["b1"]]
    assert app.queue.routed_ids("default", "b") == []


async def test_a_finished_task_of_another_kind_is_not_routed(app: App) -> None:
    submitted = await app.submit_tasks(TaskSpec("b1", "b"))
    b1 = submitted.task_ids["b1"]
    popped = await app.queue.pop_many(["default"], 0, 10)
    await app.execution.complete_many(await app.execution.claim_many(popped, "w-b"))

    assert await app.execution.claim_many([b1], "w-a", {"a"}) == []  # a stale duplicate
    assert app.queue.routed_ids("default", "b") == []
    assert not app.queue.has_marker(b1)


# -- a mixed fleet ------------------------------------------------------------------------------


async def drain_with(h: Harness, ran: dict[str, str]) -> None:
    """Run a worker of kind ``a`` and one of kind ``b`` until the harness's jobs are done."""
    worker_a = runtime_of("a", ran=ran, worker="w-a")
    worker_b = runtime_of("b", ran=ran, worker="w-b")
    async with (
        h.running(worker_a, settings=replace(SETTINGS, worker_id="w-a")),
        h.running(worker_b, settings=replace(SETTINGS, worker_id="w-b")),
    ):
        while len(ran) < 20:
            await asyncio.sleep(0.01)


async def test_two_workers_with_different_kinds_drain_a_job_of_both() -> None:
    h = build_harness()
    specs = [
        TaskSpec(f"{kind}{i}", kind, payload={"name": f"{kind}{i}"})
        for i in range(10)
        for kind in ("a", "b")
    ]
    # a DAG across the kinds: b_i waits for a_i
    specs = [
        replace(spec, depends_on=(f"a{spec.name[1:]}",)) if spec.kind == "b" else spec
        for spec in specs
    ]
    submitted = await h.submit_tasks(*specs)
    ran: dict[str, str] = {}

    await asyncio.wait_for(drain_with(h, ran), 20)

    job = await h.wait_job(submitted.job_id)
    assert job.job.status is JobStatus.COMPLETED
    assert ran == {spec.name: f"w-{spec.kind}" for spec in specs}  # each on its kind's worker
    assert h.counter("worker_unknown_kind_total") == 0


async def test_after_a_queue_flush_the_reconciler_re_enqueue_routes_again() -> None:
    h = build_harness()
    specs = [
        TaskSpec(f"{kind}{i}", kind, payload={"name": f"{kind}{i}"})
        for i in range(10)
        for kind in ("a", "b")
    ]
    submitted = await h.submit_tasks(*specs)
    # a worker of kind "a" alone routes every "b" task away, then Redis loses everything
    ran: dict[str, str] = {}
    async with h.running(runtime_of("a", ran=ran, worker="w-a")):
        while len(h.queue.routed_ids("default", "b")) < 10 or len(ran) < 10:
            await asyncio.sleep(0.01)
    h.queue.flush()
    assert h.queue.ready_ids("default") == [] and h.queue.routed_ids("default", "b") == []

    assert await h.reconcile.enqueue_due() == 10  # the ten "b" tasks, onto their tier
    await asyncio.wait_for(drain_with(h, ran), 20)

    job = await h.wait_job(submitted.job_id)
    assert job.job.status is JobStatus.COMPLETED
    assert ran == {spec.name: f"w-{spec.kind}" for spec in specs}
    assert h.counter("worker_unknown_kind_total") == 0


# -- a kind no worker serves ---------------------------------------------------------------------


async def test_a_kind_no_worker_serves_stays_queued_and_is_never_duplicated() -> None:
    h = build_harness(marker_ttl=0.2)
    task_id = await h.one("mystery", max_attempts=3)
    ran: dict[str, str] = {}
    async with h.running(runtime_of("known", ran=ran, worker="w-k")):
        while h.queue.routed_ids("default", "mystery") != [task_id]:
            await asyncio.sleep(0.01)
        # marker TTLs run out several times; the reconciler loop (every 20 ms) finds the id on
        # its routed list each time and only restores the marker
        await asyncio.sleep(0.8)
        view = await h.task(task_id)
        routed = h.queue.routed_ids("default", "mystery")

    assert view.task.status is TaskStatus.QUEUED and view.runs == []
    assert routed == [task_id]
    assert h.queue.ready_ids("default") == []
    assert h.counter("worker_unknown_kind_total") == 0


# -- explain reads the list the task is in --------------------------------------------------------


async def test_explain_finds_a_routed_task_on_the_routed_list_of_its_kind() -> None:
    async with running_api() as api:
        await api.services.worker.registry.heartbeat(
            "w-echo", "host", {"kinds": ["echo"], "priorities": ["default"]}
        )
        response = await api.client.post("/v1/tasks", json={"kind": "b"})
        task_id = UUID(response.json()["task_id"])
        popped = await api.queue.pop_many(["default"], 0, 4, kinds={"echo"})
        assert await api.services.worker.execution.claim_many(popped, "w-echo", {"echo"}) == []

        unserved = (await api.client.get(f"/v1/tasks/{task_id}/explain")).json()
        await api.services.worker.registry.heartbeat(
            "w-b", "host", {"kinds": ["b"], "priorities": ["default"]}
        )
        served = (await api.client.get(f"/v1/tasks/{task_id}/explain")).json()

    assert unserved["reason"] == "queued_no_worker"
    assert served["reason"] == "queued"
    assert served["details"]["routed"] is True
    assert (served["details"]["position"], served["details"]["ready_depth"]) == (0, 1)
    assert "routed to the workers of kind 'b'" in served["message"]
