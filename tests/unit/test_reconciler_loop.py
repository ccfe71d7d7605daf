"""The reconciler's loops: they survive failing passes, never overlap, and stop on the event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from dtq.application.commands import ReconcileReport
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.metrics import OrchestratorMetrics
from dtq.entrypoints.reconciler import Reconciler
from dtq.worker import Options, Runtime


class FakeReconcile:
    """Stands in for ReconcileService: scripted outcomes, records concurrency and calls."""

    def __init__(
        self,
        *,
        failing_passes: set[int] | None = None,
        pass_seconds: float = 0.0,
        promoted_per_call: int = 0,
        failing_promotions: set[int] | None = None,
    ) -> None:
        self.failing_passes = failing_passes or set()
        self.pass_seconds = pass_seconds
        self.promoted_per_call = promoted_per_call
        self.failing_promotions = failing_promotions or set()
        self.passes = 0
        self.promotions = 0
        self.active = 0
        self.max_active = 0
        self.limits: list[int] = []

    async def reconcile_once(self, limit: int = 500) -> ReconcileReport:
        self.passes += 1
        number = self.passes
        self.limits.append(limit)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.pass_seconds)
            if number in self.failing_passes:
                raise BackendUnavailable("database down")
            return ReconcileReport(enqueued=2, reclaimed=1, promoted=3)
        finally:
            self.active -= 1

    async def promote_scheduled(self, limit: int = 1000) -> int:
        self.promotions += 1
        if self.promotions in self.failing_promotions:
            raise BackendUnavailable("redis down")
        return self.promoted_per_call


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    return 0.0 if value is None else value


async def run_until(reconciler: Reconciler, condition: object, *, limit: float = 5.0) -> None:
    """Run the reconciler until ``condition()`` holds, then stop it and wait for it to end."""
    stop = asyncio.Event()
    task = asyncio.create_task(reconciler.run(stop))
    async with asyncio.timeout(limit):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)
        stop.set()
        await task


def make(
    fake: FakeReconcile,
    registry: CollectorRegistry,
    *,
    interval: float = 0.01,
    promote_interval: float = 0.01,
    batch: int = 50,
) -> Reconciler:
    return Reconciler(
        fake,  # type: ignore[arg-type]
        interval=interval,
        promote_interval=promote_interval,
        batch=batch,
        metrics=OrchestratorMetrics(registry),
    )


async def test_failing_passes_are_counted_and_the_loop_keeps_going() -> None:
    registry = CollectorRegistry()
    fake = FakeReconcile(failing_passes={1, 3, 4})

    await run_until(make(fake, registry), lambda: fake.passes >= 6)

    assert sample(registry, "orchestrator_reconcile_runs_total") == fake.passes
    assert sample(registry, "orchestrator_reconcile_errors_total") == 3
    succeeded = fake.passes - 3
    assert sample(registry, "orchestrator_reconcile_enqueued_total") == 2 * succeeded
    assert sample(registry, "orchestrator_reconcile_reclaimed_total") == 1 * succeeded


async def test_every_pass_is_timed_including_failed_ones() -> None:
    registry = CollectorRegistry()
    fake = FakeReconcile(failing_passes={2})

    await run_until(make(fake, registry), lambda: fake.passes >= 3)

    assert sample(registry, "orchestrator_reconcile_duration_seconds_count") == fake.passes


async def test_passes_never_overlap_when_a_pass_outlasts_the_interval() -> None:
    registry = CollectorRegistry()
    fake = FakeReconcile(pass_seconds=0.03)

    await run_until(make(fake, registry, interval=0.005), lambda: fake.passes >= 4)

    assert fake.max_active == 1


async def test_the_batch_size_is_passed_to_each_pass() -> None:
    fake = FakeReconcile()

    await run_until(make(fake, CollectorRegistry(), batch=7), lambda: fake.passes >= 2)

    assert set(fake.limits) == {7}


async def test_the_first_pass_runs_at_once_and_the_next_waits_for_the_interval() -> None:
    fake = FakeReconcile()
    reconciler = make(fake, CollectorRegistry(), interval=60.0, promote_interval=60.0)
    stop = asyncio.Event()

    task = asyncio.create_task(reconciler.run(stop))
    await asyncio.sleep(0.05)

    assert fake.passes == 1
    stop.set()
    async with asyncio.timeout(1.0):
        await task


async def test_setting_the_event_stops_both_loops_promptly() -> None:
    fake = FakeReconcile()
    reconciler = make(fake, CollectorRegistry(), interval=3600.0, promote_interval=3600.0)
    stop = asyncio.Event()
    task = asyncio.create_task(reconciler.run(stop))
    await asyncio.sleep(0.02)

    stop.set()
    async with asyncio.timeout(1.0):
        await task

    passes, promotions = fake.passes, fake.promotions
    await asyncio.sleep(0.02)
    assert (fake.passes, fake.promotions) == (passes, promotions)


async def test_an_event_set_before_start_runs_nothing() -> None:
    fake = FakeReconcile()
    stop = asyncio.Event()
    stop.set()

    async with asyncio.timeout(1.0):
        await make(fake, CollectorRegistry()).run(stop)

    assert (fake.passes, fake.promotions) == (0, 0)


async def test_the_promoter_runs_often_and_counts_what_it_promoted() -> None:
    registry = CollectorRegistry()
    fake = FakeReconcile(promoted_per_call=2)
    reconciler = make(fake, registry, interval=3600.0, promote_interval=0.005)

    await run_until(reconciler, lambda: fake.promotions >= 5)

    # The one reconcile pass reported 3 promoted; every promoter call added 2.
    assert fake.passes == 1
    assert sample(registry, "orchestrator_reconcile_promoted_total") == 3 + 2 * fake.promotions


async def test_the_promoter_survives_failures() -> None:
    fake = FakeReconcile(failing_promotions={1, 2})
    reconciler = make(fake, CollectorRegistry(), interval=0.02, promote_interval=0.001)

    await run_until(reconciler, lambda: fake.promotions >= 4)

    assert fake.promotions >= 4


async def test_works_without_metrics() -> None:
    fake = FakeReconcile(failing_passes={1}, promoted_per_call=1)
    reconciler = Reconciler(
        fake,  # type: ignore[arg-type]
        interval=0.005,
        promote_interval=0.005,
        batch=10,
        metrics=None,
    )

    await run_until(reconciler, lambda: fake.passes >= 3)

    assert fake.passes >= 3


async def test_run_pass_reports_none_on_failure_and_the_report_on_success() -> None:
    fake = FakeReconcile(failing_passes={1})
    reconciler = make(fake, CollectorRegistry())

    assert await reconciler.run_pass() is None
    assert await reconciler.run_pass() == ReconcileReport(enqueued=2, reclaimed=1, promoted=3)


@pytest.mark.parametrize(
    ("interval", "promote_interval", "batch"), [(0, 1, 1), (1, 0, 1), (1, 1, 0), (-1, 1, 1)]
)
def test_invalid_timings_are_refused(interval: float, promote_interval: float, batch: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        Reconciler(
            FakeReconcile(),  # type: ignore[arg-type]
            interval=interval,
            promote_interval=promote_interval,
            batch=batch,
        )


class ScriptedReports:
    """Stands in for ReconcileService: answers each pass with the next scripted report."""

    def __init__(self, *reports: ReconcileReport) -> None:
        self.reports = list(reports)

    async def reconcile_once(self, limit: int = 500) -> ReconcileReport:
        return self.reports.pop(0)

    async def promote_scheduled(self, limit: int = 1000) -> int:
        return 0


class RecordingLog:
    """A structlog-like logger that keeps ``(level, event, fields)``."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, object]]] = []

    def _keep(self, level: str) -> Callable[..., None]:
        def log(event: str, **fields: object) -> None:
            self.records.append((level, event, fields))

        return log

    def __getattr__(self, level: str) -> Callable[..., None]:
        return self._keep(level)

    def warnings(self) -> list[tuple[str, dict[str, object]]]:
        return [(event, fields) for level, event, fields in self.records if level == "warning"]


def reporting(
    *reports: ReconcileReport, log: RecordingLog, registry: CollectorRegistry | None = None
) -> Reconciler:
    """A reconciler whose passes answer ``reports`` in turn, logging to ``log`` (metrics into
    ``registry`` when given)."""
    return Reconciler(
        ScriptedReports(*reports),  # type: ignore[arg-type]
        interval=1,
        promote_interval=1,
        batch=10,
        metrics=None if registry is None else OrchestratorMetrics(registry),
        logger=log,
    )


def unpolled(registry: CollectorRegistry, priority: str) -> float | None:
    return registry.get_sample_value("orchestrator_tasks_queued_unpolled", {"priority": priority})


async def test_unpolled_priorities_set_the_gauge_warn_and_clear_when_polled_again() -> None:
    registry, log = CollectorRegistry(), RecordingLog()
    reconciler = reporting(
        ReconcileReport(unpolled={"high": 3, "batch": 1}),
        ReconcileReport(unpolled=None),  # a pass that did not finish counting: gauge kept
        ReconcileReport(unpolled={"batch": 2}),
        log=log,
        registry=registry,
    )
    await reconciler.run_pass()
    assert (unpolled(registry, "high"), unpolled(registry, "batch")) == (3, 1)
    assert (
        "queued tasks of a priority no live worker polls",
        {"priority": "high", "queued": 3},
    ) in (log.warnings())
    await reconciler.run_pass()
    assert (unpolled(registry, "high"), unpolled(registry, "batch")) == (3, 1)
    await reconciler.run_pass()
    assert (unpolled(registry, "high"), unpolled(registry, "batch")) == (None, 2)


async def test_a_queue_reset_is_logged_as_a_warning() -> None:
    log = RecordingLog()
    reconciler = reporting(ReconcileReport(queue_reset=True, reclaim_deferred=True), log=log)
    await reconciler.run_pass()
    assert any("new queue epoch" in event for event, _ in log.warnings())


async def test_runs_held_for_another_prefix_set_the_gauge_and_warn_until_none_are() -> None:
    registry, log = CollectorRegistry(), RecordingLog()
    reconciler = reporting(
        ReconcileReport(reclaims_held={"{typo}:": 2, "{other}:": 1}),
        ReconcileReport(),
        log=log,
        registry=registry,
    )
    await reconciler.run_pass()
    assert registry.get_sample_value("orchestrator_reclaims_held") == 3
    [(event, fields)] = log.warnings()
    assert "REDIS_KEY_PREFIX" in event and fields == {"held": {"{typo}:": 2, "{other}:": 1}}
    await reconciler.run_pass()
    assert registry.get_sample_value("orchestrator_reclaims_held") == 0
    assert len(log.warnings()) == 1


async def test_a_worker_records_the_priorities_it_polls_for_the_unpolled_check() -> None:
    from tests.unit.runtime_harness import build_harness

    h = build_harness()
    runtime = Runtime(
        Options(lease_renew_every=0.1, shutdown_grace=0.2, poll_timeout=0.05, priorities=("high",))
    )
    runtime.register("echo", lambda task: None)
    async with h.running(runtime, reconcile=False):
        await asyncio.sleep(0.05)
        workers = await h.queries.list_workers(60)
    assert [w.metadata.get("priorities") for w in workers] == [["high"]]
