"""A finished success survives a long database outage (issue 12; README "the lease is kept
alive until the success is committed").

The completion loop runs on the memory adapters; its pauses between attempts advance a fake
clock instead of sleeping, so an outage of minutes takes milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import structlog
from prometheus_client import CollectorRegistry

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.queries import QueryService
from dtq.domain.status import TaskStatus
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.worker import completions
from dtq.entrypoints.worker.claims import LEASE_LOST, Held, Meters, Shared
from dtq.entrypoints.worker.completions import REPORT_ATTEMPTS, Completions
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.worker import Options
from tests.unit.conftest import memory_container
from tests.unit.runtime_harness import POLICY


@dataclass
class Drill:
    clock: FakeClock
    store: InMemoryStore
    queries: QueryService
    completions: Completions
    held: Held
    attempts: list[float]  # fake seconds since the outage began, at each failed attempt
    settled: list[Held]


@pytest.fixture
async def drill(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Drill]:
    """A claimed task whose success waits for a commit while the store is down."""
    clock = FakeClock()
    settings = Settings(worker_id="w-outage")
    container = memory_container(clock, POLICY, settings)
    store = container.store()
    assert isinstance(store, InMemoryStore)
    await container.submit().submit_job(SubmitJob(tasks=(TaskSpec(name="t", kind="echo"),)))
    ids = await container.queue().pop_many(["default"], timeout=0.05, max_count=1)
    [claim] = await container.execution().claim_many(ids, "w-outage")
    shared = Shared(
        config=WorkerConfig.resolve(settings, Options(poll_timeout=0.05)),
        execution=container.execution(),
        meters=Meters(WorkerMetrics(CollectorRegistry())),
        log=structlog.get_logger("test"),
    )
    settled: list[Held] = []
    batcher = Completions(shared, turn=asyncio.Lock(), settled=settled.append)
    start = clock.now()
    attempts: list[float] = []
    real_delay = completions.backoff_delay

    def fake_delay(failures: int) -> float:
        attempts.append((clock.now() - start).total_seconds())
        clock.advance(real_delay(failures))
        return 0.0

    monkeypatch.setattr(completions, "backoff_delay", fake_delay)
    held = Held(claim)
    held.result = {"done": True}
    loop = asyncio.create_task(batcher.loop())
    try:
        yield Drill(clock, store, container.queries(), batcher, held, attempts, settled)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


async def test_a_success_is_committed_after_a_minutes_long_database_outage(drill: Drill) -> None:
    outage = 120.0  # fake seconds; the old helper gave up after 5 tries (about 6 s)
    drill.store.available = False
    drill.completions.add(drill.held)
    await _until(lambda: bool(drill.attempts) and drill.attempts[-1] >= outage)
    drill.store.available = True

    await asyncio.wait_for(drill.completions.wait_idle(), 5)

    task = (await drill.queries.get_task(drill.held.claim.task.id)).task
    assert task.status is TaskStatus.COMPLETED
    assert task.result == {"done": True}
    assert drill.settled == [drill.held]
    assert len(drill.attempts) > REPORT_ATTEMPTS


async def test_on_shutdown_a_failing_success_is_given_up_after_the_bounded_tries(
    drill: Drill,
) -> None:
    drill.store.available = False
    drill.completions.add(drill.held)
    await _until(lambda: len(drill.attempts) >= REPORT_ATTEMPTS + 3)

    drill.completions.stop_retrying()  # what the session's shutdown does
    await asyncio.wait_for(drill.completions.wait_idle(), 5)

    assert drill.settled == [drill.held]
    assert len(drill.attempts) <= REPORT_ATTEMPTS + 4


async def test_a_success_whose_lease_was_lost_is_given_up_after_the_bounded_tries(
    drill: Drill,
) -> None:
    drill.store.available = False
    drill.completions.add(drill.held)
    await _until(lambda: len(drill.attempts) >= 1)

    drill.held.interrupted = LEASE_LOST  # what the lease renewal marks on a committing claim
    await asyncio.wait_for(drill.completions.wait_idle(), 5)

    assert drill.settled == [drill.held]
    assert len(drill.attempts) == REPORT_ATTEMPTS - 1
