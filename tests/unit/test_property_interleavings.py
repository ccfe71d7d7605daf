"""Random interleavings of claim / succeed / fail / lose-lease / reconcile / reclaim over random
DAGs (DESIGN §2 invariants), checked after every step with hypothesis."""

from __future__ import annotations

import asyncio
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtq.application.commands import Claim, ExecutionPolicy, TaskSpec
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from tests.single import claim_one, complete_one, pop_one
from tests.unit.conftest import App, build_app

POLICY = ExecutionPolicy(
    lease_duration=10, retry_backoff=3, stale_running_after=20, max_reclaims=1000
)
ACTIONS = ("claim", "succeed", "fail", "lose_lease", "reconcile", "tick")


@st.composite
def dags(draw: st.DrawFn) -> list[TaskSpec]:
    size = draw(st.integers(min_value=1, max_value=8))
    specs = []
    for i in range(size):
        deps = draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=3)) if i else set()
        specs.append(
            TaskSpec(
                f"t{i}", "echo", depends_on=tuple(f"t{d}" for d in sorted(deps)), max_attempts=100
            )
        )
    return specs


async def check_invariants(app: App, job_id: UUID, deps: dict[str, tuple[str, ...]]) -> None:
    view = await app.queries.get_job(job_id)
    by_name = {t.name: t for t in view.tasks}
    for task in view.tasks:
        if task.status in (TaskStatus.RUNNING, TaskStatus.COMPLETED):
            assert all(by_name[d].status is TaskStatus.COMPLETED for d in deps[task.name]), (
                f"{task.name} started before its dependencies completed"
            )
        assert task.attempt <= task.max_attempts
        runs = (await app.queries.get_task(task.id)).runs
        live_runs = [r for r in runs if r.status is not RunStatus.DEAD]
        assert task.attempt == len(live_runs), "a dead run consumed retry budget"
        assert [r.started_at for r in runs] == sorted(r.started_at for r in runs)
        if task.status is TaskStatus.RUNNING:
            assert runs[-1].status is RunStatus.RUNNING and runs[-1].id == task.current_run_id


async def step(app: App, held: list[Claim], action: str, pick: int) -> None:
    """Apply one random action; ``held`` are the claims of live workers."""
    if action == "claim":
        task_id = await pop_one(app.queue, ["default"], timeout=0)
        claim = await claim_one(app.execution, task_id, f"w{pick}") if task_id else None
        if claim is not None:
            held.append(claim)
    elif action in ("succeed", "fail", "lose_lease") and held:
        claim = held.pop(pick % len(held))
        if action == "succeed":
            await complete_one(app.execution, claim)
        elif action == "fail":
            await app.execution.fail(claim, "boom")
        else:  # the worker dies: its lease is gone and it reports nothing
            await app.queue.delete_leases([(claim.task.id, claim.run.id)])
    elif action == "reconcile":
        await app.reconcile.reconcile_once()
    elif action == "tick":
        app.clock.advance(1 + pick)
        await app.reconcile.promote_scheduled()
    for claim in held:  # live workers keep heartbeating
        await app.execution.heartbeat(claim)


async def drain(app: App, job_id: UUID, deps: dict[str, tuple[str, ...]]) -> None:
    """Workers keep running and every handler now succeeds."""
    for _ in range(200):
        view = await app.queries.get_job(job_id)
        if view.job.status is JobStatus.COMPLETED:
            return
        task_id = await pop_one(app.queue, ["default"], timeout=0)
        if task_id is None:
            app.clock.advance(5)
            await app.reconcile.reconcile_once()
            continue
        claim = await claim_one(app.execution, task_id, "drain")
        if claim is not None:
            await complete_one(app.execution, claim)
        await check_invariants(app, job_id, deps)


async def scenario(specs: list[TaskSpec], steps: list[tuple[str, int]]) -> None:
    app = build_app(POLICY, marker_ttl=15)
    deps = {s.name: s.depends_on for s in specs}
    job = await app.submit_tasks(*specs)
    held: list[Claim] = []
    for action, pick in steps:
        await step(app, held, action, pick)
        await check_invariants(app, job.job_id, deps)
    for claim in held:
        await complete_one(app.execution, claim)
    await drain(app, job.job_id, deps)
    view = await app.queries.get_job(job.job_id)
    assert {t.status for t in view.tasks} == {TaskStatus.COMPLETED}
    assert view.job.status is JobStatus.COMPLETED


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=dags(),
    steps=st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(min_value=0, max_value=7)), max_size=40
    ),
)
def test_random_interleavings_keep_every_invariant(
    specs: list[TaskSpec], steps: list[tuple[str, int]]
) -> None:
    asyncio.run(scenario(specs, steps))
