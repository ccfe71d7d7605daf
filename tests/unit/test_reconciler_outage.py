"""The reconciler through a backend outage (issue 12): one warning per failed pass, no traceback
storm, and the next pass at most one interval after the backend returns."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from dtq.application.commands import ReconcileReport
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.metrics import OrchestratorMetrics
from dtq.entrypoints.reconciler import Reconciler
from tests.unit.test_reconciler_loop import RecordingLog

INTERVAL = 0.2  # seconds between pass starts
ACQUIRE = 0.05  # seconds a pass takes to fail (the pool's acquire timeout)


class Outage:
    """Stands in for ReconcileService: passes and promotions fail while ``down``, after
    ``ACQUIRE`` seconds; records the loop time each pass starts and whether it failed."""

    def __init__(self) -> None:
        self.down = True
        self.passes: list[tuple[float, bool]] = []
        self.promotions: list[bool] = []

    async def reconcile_once(self, limit: int = 500) -> ReconcileReport:
        down = self.down
        self.passes.append((asyncio.get_running_loop().time(), down))
        if down:
            await asyncio.sleep(ACQUIRE)
            raise BackendUnavailable("database unavailable: no connection within 0.05s")
        return ReconcileReport()

    async def promote_scheduled(self, limit: int = 1000) -> int:
        self.promotions.append(self.down)
        if self.down:
            raise BackendUnavailable("redis promote_due failed: ConnectionError")
        return 0


def _reconciler(fake: object, log: RecordingLog) -> Reconciler:
    return Reconciler(
        fake,  # type: ignore[arg-type]
        interval=INTERVAL,
        promote_interval=0.01,
        batch=10,
        metrics=OrchestratorMetrics(CollectorRegistry()),
        logger=log,
    )


async def test_a_failed_pass_warns_once_without_traceback_and_the_next_interval_resumes() -> None:
    fake, log = Outage(), RecordingLog()
    stop = asyncio.Event()
    running = asyncio.create_task(_reconciler(fake, log).run(stop))
    async with asyncio.timeout(5):
        while len(fake.passes) < 4:
            await asyncio.sleep(0.005)
        await asyncio.sleep(INTERVAL * 0.7)  # the backend returns at an unlucky moment
        fake.down, returned = False, asyncio.get_running_loop().time()
        while fake.passes[-1][1]:
            await asyncio.sleep(0.005)
        stop.set()
        await running

    failed = sum(1 for _, down in fake.passes if down)
    levels = [level for level, _, _ in log.records]
    pass_warnings = [e for lv, e, _ in log.records if lv == "warning" and "reconcile" in e]
    assert "exception" not in levels and "error" not in levels
    assert len(pass_warnings) == failed
    first_good = next(started for started, down in fake.passes if not down)
    assert first_good - returned <= INTERVAL + 0.05


async def test_a_pass_failing_for_another_reason_keeps_its_traceback() -> None:
    class Broken:
        async def reconcile_once(self, limit: int = 500) -> ReconcileReport:
            raise RuntimeError("a bug")

        async def promote_scheduled(self, limit: int = 1000) -> int:
            return 0

    log = RecordingLog()
    assert await _reconciler(Broken(), log).run_pass() is None
    assert [event for level, event, _ in log.records if level == "exception"] == [
        "reconcile pass failed"
    ]


async def test_a_promoter_streak_during_an_outage_warns_once_without_a_traceback() -> None:
    fake, log = Outage(), RecordingLog()
    stop = asyncio.Event()
    running = asyncio.create_task(_reconciler(fake, log).run(stop))
    async with asyncio.timeout(5):
        while len(fake.promotions) < 3:
            await asyncio.sleep(0.005)
        stop.set()
        await running

    promote_records = [(lv, e) for lv, e, _ in log.records if "promot" in e]
    assert [lv for lv, _ in promote_records if lv != "debug"] == ["warning"]
