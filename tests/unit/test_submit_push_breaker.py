"""The push breaker of the submit service (ARCHITECTURE.md, "Group commit of submissions"):
after a push following a commit fails, the pushes of the open period are not sent (the jobs are
committed; the reconciler pushes their tasks), then one is tried again and a success closes it.
The submits succeed throughout. Memory adapters; the breaker's clock is a plain counter."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import UUID

import pytest
from dependency_injector import providers
from structlog.testing import capture_logs

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.breaker import PUSH_BREAKER_OPEN_FOR, Missed, PushBreaker
from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import CarriedTask
from dtq.application.reconcile import ReconcileService
from dtq.application.submit import SubmitService
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import build_container, open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.unit.conftest import POLICY


class FlakyQueue(InMemoryQueue):
    """The memory queue whose ``enqueue_many`` raises ``BackendUnavailable`` while ``down``;
    ``calls`` counts the pushes that reached it."""

    def __init__(self) -> None:
        super().__init__(FakeClock())
        self.down = True
        self.calls = 0

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        self.calls += 1
        if self.down:
            raise BackendUnavailable("redis did not answer")
        return await super().enqueue_many(items, carried=carried)


class Seconds:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A ``PushWatcher`` keeping what it was told."""

    def __init__(self) -> None:
        self.misses: dict[str, int] = {}
        self.opens: list[str] = []
        self.closes: list[int] = []

    def missed(self, reason: Missed, jobs: int) -> None:
        self.misses[reason] = self.misses.get(reason, 0) + jobs

    def opened(self, error: BackendUnavailable, open_for: float) -> None:
        self.opens.append(str(error))

    def closed(self, missed: int) -> None:
        self.closes.append(missed)


def job() -> SubmitJob:
    return SubmitJob(tasks=(TaskSpec("t", "echo"),))


@pytest.fixture
def queue() -> FlakyQueue:
    return FlakyQueue()


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore(FakeClock())


@pytest.fixture
def seconds() -> Seconds:
    return Seconds()


@pytest.fixture
def seen() -> Recorder:
    return Recorder()


@pytest.fixture
def service(
    store: InMemoryStore, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> SubmitService:
    breaker = PushBreaker(open_for=1.0, clock=seconds, watcher=seen)
    return SubmitService(store=store, queue=queue, pushes=breaker)


async def submit(service: SubmitService, n: int) -> list[SubmitResult]:
    return [await service.submit_job(job()) for _ in range(n)]


async def test_after_a_failed_push_the_next_submits_do_not_push() -> None:
    """The default service (its own breaker on ``time.monotonic``): one push reaches the
    failing queue, the next submits, well within the open period, push nothing."""
    queue = FlakyQueue()
    service = SubmitService(store=InMemoryStore(FakeClock()), queue=queue)

    results = [await service.submit_job(job()) for _ in range(5)]

    assert all(r.created for r in results)
    assert queue.calls == 1


async def test_skipped_submits_are_created_and_counted(
    service: SubmitService, store: InMemoryStore, queue: FlakyQueue, seen: Recorder
) -> None:
    results = await submit(service, 4)

    assert all(r.created for r in results)
    assert len(store._tables.jobs) == 4
    assert queue.calls == 1
    assert seen.misses == {"failed": 1, "skipped": 3}
    assert seen.opens == ["redis did not answer"]  # one warning, not one per submit


async def test_after_the_open_period_one_push_is_tried_again_and_a_failure_reopens(
    service: SubmitService, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> None:
    await submit(service, 2)
    seconds.now += 0.99
    await submit(service, 1)
    assert queue.calls == 1

    seconds.now += 0.02  # the period is over: half-open
    await submit(service, 1)
    assert queue.calls == 2
    await submit(service, 2)  # open again from the failed trial
    assert queue.calls == 2
    assert seen.misses == {"failed": 2, "skipped": 4}
    assert len(seen.opens) == 2


async def test_a_successful_trial_closes_the_breaker(
    service: SubmitService, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> None:
    first = await submit(service, 3)
    queue.down = False  # Redis answers again
    seconds.now += PUSH_BREAKER_OPEN_FOR

    trial = await submit(service, 1)
    later = await submit(service, 2)

    assert queue.calls == 4  # the first, the trial and both later ones
    assert sorted(queue.ready_ids("default")) == sorted(r.task_ids["t"] for r in [*trial, *later])
    assert seen.closes == [3]  # the jobs left to the reconciler
    assert all(r.task_ids["t"] not in queue.ready_ids("default") for r in first)


async def test_the_reconciler_pushes_the_skipped_tasks(
    service: SubmitService, store: InMemoryStore, queue: FlakyQueue
) -> None:
    results = await submit(service, 3)
    queue.down = False

    reconcile = ReconcileService(store=store, queue=queue, policy=POLICY)

    assert await reconcile.enqueue_due() == 3
    assert sorted(queue.ready_ids("default")) == sorted(r.task_ids["t"] for r in results)


async def test_a_group_is_counted_by_its_jobs(
    store: InMemoryStore, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> None:
    """Concurrent submits share a transaction and one push: skipped, it counts every job."""
    breaker = PushBreaker(open_for=1.0, clock=seconds, watcher=seen)
    service = SubmitService(store=store, queue=queue, pushes=breaker, lanes=1)
    await submit(service, 1)  # fails: opens

    results = await asyncio.gather(*(service.submit_job(job()) for _ in range(6)))

    assert all(r.created for r in results)
    assert queue.calls == 1
    assert seen.misses == {"failed": 1, "skipped": 6}


async def test_a_cancelled_trial_does_not_keep_the_breaker_open(
    queue: FlakyQueue, seconds: Seconds
) -> None:
    breaker = PushBreaker(open_for=1.0, clock=seconds)
    with pytest.raises(BackendUnavailable), breaker.attempt(1):
        raise BackendUnavailable("down")
    seconds.now += 1.0
    with pytest.raises(asyncio.CancelledError), breaker.attempt(1):
        raise asyncio.CancelledError  # the trial's push was cancelled mid-flight

    with breaker.attempt(1):  # the next push is the trial
        pass

    assert not breaker.is_open


async def test_the_container_counts_missed_pushes_in_the_metric_and_warns_once() -> None:
    """The composition root: the submit service's breaker reports through ``on_push_missed``
    (``orchestrator_submit_pushes_missed_total``) and logs one warning per open period."""
    settings = Settings()
    container = build_container(settings, backend="memory")
    container.memory_queue.override(providers.Object(FlakyQueue()))
    metrics = OrchestratorMetrics(new_registry())

    def count(reason: str, jobs: int) -> None:
        metrics.submit_pushes_missed.labels(reason=reason).inc(jobs)

    with capture_logs() as logs:
        async with open_services(
            settings, backend="memory", container=container, on_push_missed=count
        ) as services:
            for _ in range(3):
                assert (await services.api.submit.submit_job(job())).created

    def value(reason: str) -> float | None:
        return metrics.registry.get_sample_value(
            "orchestrator_submit_pushes_missed_total", {"reason": reason}
        )

    assert (value("failed"), value("skipped")) == (1.0, 2.0)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert "pushes skipped" in warnings[0]["event"]
    assert warnings[0]["error"] == "redis did not answer"


def test_the_missed_pushes_metric_reads_zero_before_any_miss() -> None:
    """Both series exist from the start, so ``increase()`` over the first miss sees it (a series
    that appears at 1 has no earlier sample to increase from)."""
    metrics = OrchestratorMetrics(new_registry())

    for reason in ("failed", "skipped"):
        assert (
            metrics.registry.get_sample_value(
                "orchestrator_submit_pushes_missed_total", {"reason": reason}
            )
            == 0.0
        )
