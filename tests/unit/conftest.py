"""Fixtures for the unit suite: every port faked in memory, time driven by a FakeClock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from dependency_injector import providers

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import ExecutionPolicy, SubmitJob, SubmitResult, TaskSpec
from dtq.application.execution import ExecutionService
from dtq.application.ports import Clock
from dtq.application.queries import QueryService
from dtq.application.reconcile import ReconcileService
from dtq.application.registry import WorkerRegistryService
from dtq.application.submit import SubmitService
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import Container, build_container

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


def memory_container(
    clock: Clock, policy: ExecutionPolicy, settings: Settings | None = None
) -> Container:
    """The production composition root on the memory backend, with ``clock`` and ``policy``
    overriding what the settings would give, so tests exercise the real wiring."""
    container = build_container(settings or Settings(), backend="memory")
    container.clock.override(providers.Object(clock))
    container.policy.override(providers.Object(policy))
    return container


def build_app(policy: ExecutionPolicy = POLICY, *, marker_ttl: float = 60.0) -> App:
    clock = FakeClock()
    c = memory_container(clock, policy, Settings(pending_marker_ttl=marker_ttl))
    store, queue = c.store(), c.queue()
    assert isinstance(store, InMemoryStore) and isinstance(queue, InMemoryQueue)
    return App(
        clock=clock,
        store=store,
        queue=queue,
        submit=c.submit(),
        queries=c.queries(),
        execution=c.execution(),
        reconcile=c.reconcile(),
        registry=c.registry(),
    )


@pytest.fixture
def app() -> App:
    return build_app()
