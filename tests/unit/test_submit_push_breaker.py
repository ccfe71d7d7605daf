"""The push breaker of the submit service (ARCHITECTURE.md, "Group commit of submissions"):
after a push following a commit fails, the pushes of the open period are not sent (the jobs are
committed; the reconciler pushes their tasks), then one is tried again and a success closes it;
that trial gets no more than the breaker's trial bound, so a Redis that hangs costs it a fraction
of the client's reply timeout. The submits succeed throughout. Memory adapters; the breaker's clock
is a plain counter (the trial bound alone is real time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from uuid import UUID

import pytest
from dependency_injector import providers
from structlog.testing import capture_logs

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.breaker import PUSH_BREAKER_OPEN_FOR, Missed, PushBreaker, PushTimedOut
from dtq.application.commands import SubmitJob, SubmitResult, TaskSpec
from dtq.application.ports import CarriedTask
from dtq.application.reconcile import ReconcileService
from dtq.application.submit import SubmitService
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import build_container, open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.unit.conftest import POLICY

#: The trial bound of the tests' breakers, in seconds of real time (the default is longer).
TRIAL = 0.05


class FlakyQueue(InMemoryQueue):
    """The memory queue whose ``enqueue_many`` raises ``BackendUnavailable`` while ``down``, or
    never answers while ``down`` and ``hangs`` (a stopped Redis); one that answers first waits
    ``takes`` seconds. ``calls`` counts the pushes that reached it."""

    def __init__(self) -> None:
        super().__init__(FakeClock())
        self.down = True
        self.hangs = False
        self.takes = 0.0
        self.calls = 0

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        self.calls += 1
        if self.down and self.hangs:
            await asyncio.Event().wait()
        if self.down:
            raise BackendUnavailable("redis did not answer")
        if self.takes:
            await asyncio.sleep(self.takes)
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
    breaker = PushBreaker(open_for=1.0, trial_timeout=TRIAL, clock=seconds, watcher=seen)
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


async def test_a_trial_push_that_hangs_is_given_up_at_the_trial_bound_and_reopens(
    service: SubmitService, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> None:
    """Redis hangs: the trial push gets no answer. It is given up after the trial bound, not
    the client's reply timeout (here: never), and counts as a failed push; the breaker opens
    again and the submit is answered, its job committed."""
    await submit(service, 1)  # fails: opens
    queue.hangs = True
    seconds.now += PUSH_BREAKER_OPEN_FOR

    started = time.monotonic()
    async with asyncio.timeout(2):  # a trial without a bound waits for this queue forever
        trial = await service.submit_job(job())
    took = time.monotonic() - started
    later = await submit(service, 2)

    assert trial.created and all(r.created for r in later)
    assert took < 1.0
    assert queue.calls == 2  # the later two were skipped: open again
    assert seen.misses == {"failed": 2, "skipped": 2}
    assert len(seen.opens) == 2
    assert "no answer within 0.05 s" in seen.opens[1]


async def test_a_lane_whose_trial_push_hangs_goes_on_after_the_trial_bound(
    store: InMemoryStore, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> None:
    """A group is answered at its commit, then its lane pushes: the lane's trial push is given
    up at the bound, so the submission waiting for the lane is written (and skipped: the breaker
    opened again) instead of waiting on Redis."""
    breaker = PushBreaker(open_for=1.0, trial_timeout=TRIAL, clock=seconds, watcher=seen)
    service = SubmitService(store=store, queue=queue, pushes=breaker, lanes=1)
    await submit(service, 1)  # fails: opens
    queue.hangs = True
    seconds.now += PUSH_BREAKER_OPEN_FOR

    group = await asyncio.gather(*(service.submit_job(job()) for _ in range(5)))
    async with asyncio.timeout(2):  # a trial without a bound holds the lane forever
        behind = await service.submit_job(job())

    assert all(r.created for r in [*group, behind])
    assert len(store._tables.jobs) == 7
    assert queue.calls == 2  # the first push and the group's trial
    assert seen.misses == {"failed": 1 + 5, "skipped": 1}
    assert breaker.is_open


async def test_a_push_with_the_breaker_closed_is_not_held_to_the_trial_bound(
    store: InMemoryStore, queue: FlakyQueue, seconds: Seconds, seen: Recorder
) -> None:
    """A slow but working Redis: while the breaker is closed a push may take longer than the
    trial bound (only the client's reply timeout bounds it), so slowness alone never opens it."""
    breaker = PushBreaker(open_for=1.0, trial_timeout=TRIAL, clock=seconds, watcher=seen)
    service = SubmitService(store=store, queue=queue, pushes=breaker)
    queue.down = False
    queue.takes = 4 * TRIAL

    result = await service.submit_job(job())

    assert queue.ready_ids("default") == [result.task_ids["t"]]
    assert not breaker.is_open
    assert seen.misses == {}
    assert seen.opens == []


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
    with pytest.raises(BackendUnavailable):
        async with breaker.attempt(1):
            raise BackendUnavailable("down")
    seconds.now += 1.0
    with pytest.raises(asyncio.CancelledError):
        async with breaker.attempt(1):
            raise asyncio.CancelledError  # the trial's push was cancelled mid-flight

    async with breaker.attempt(1):  # the next push is the trial
        pass

    assert not breaker.is_open


async def test_a_trial_given_up_at_its_bound_raises_backend_unavailable(
    seconds: Seconds,
) -> None:
    """The breaker's own contract: the trial body is cut at ``trial_timeout`` and the cut is
    raised as a ``BackendUnavailable`` (``PushTimedOut``), which the caller already handles."""
    breaker = PushBreaker(open_for=1.0, trial_timeout=TRIAL, clock=seconds)
    with pytest.raises(BackendUnavailable):
        async with breaker.attempt(1):
            raise BackendUnavailable("down")
    seconds.now += 1.0

    with pytest.raises(PushTimedOut) as cut:
        async with asyncio.timeout(2), breaker.attempt(1):
            await asyncio.Event().wait()

    assert isinstance(cut.value, BackendUnavailable)
    assert isinstance(cut.value.__cause__, TimeoutError)
    assert breaker.is_open


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
