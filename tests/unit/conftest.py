"""Fixtures for the unit suite: every port faked in memory, time driven by a FakeClock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import ExecutionPolicy, SubmitJob, SubmitResult, TaskSpec
from dtq.application.execution import ExecutionService
from dtq.application.queries import QueryService
from dtq.application.reconcile import ReconcileService
from dtq.application.registry import WorkerRegistryService
from dtq.application.submit import SubmitService

POLICY = ExecutionPolicy(
    lease_duration=30.0, retry_backoff=5.0, stale_running_after=60.0, max_reclaims=2
)


@dataclass
class App:
    """The application services wired to in-memory adapters."""

    clock: FakeClock
    store: InMemoryStore
    queue: InMemoryQueue
    submit: SubmitService
    queries: QueryService
    execution: ExecutionService
    reconcile: ReconcileService
    registry: WorkerRegistryService

    async def submit_tasks(self, *specs: TaskSpec, **job: object) -> SubmitResult:
        return await self.submit.submit_job(SubmitJob(tasks=tuple(specs), **job))  # type: ignore[arg-type]


def build_app(policy: ExecutionPolicy = POLICY, *, marker_ttl: float = 60.0) -> App:
    clock = FakeClock()
    store = InMemoryStore(clock)
    queue = InMemoryQueue(clock, marker_ttl=marker_ttl)
    return App(
        clock=clock,
        store=store,
        queue=queue,
        submit=SubmitService(store=store, queue=queue),
        queries=QueryService(store=store),
        execution=ExecutionService(store=store, queue=queue, policy=policy),
        reconcile=ReconcileService(store=store, queue=queue, policy=policy),
        registry=WorkerRegistryService(store=store),
    )


@pytest.fixture
def app() -> App:
    return build_app()
