"""Workers resume within 5 s after a backend returns, whatever the outage's length (issue 12).

The fetch loop runs on the memory adapters with a fake clock: its pauses after backend errors
advance the clock instead of sleeping, so an outage of minutes takes milliseconds. The backend
comes back at the worst moment, right after an attempt failed, so the time to resume is the
whole pause the worker chose then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import UUID

import pytest
import structlog
from prometheus_client import CollectorRegistry

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import Claim, SubmitJob, TaskSpec
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.worker.claims import Meters, Shared
from dtq.entrypoints.worker.completions import backoff_delay
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.entrypoints.worker.fetch import Fetcher
from dtq.worker import Options
from tests.unit.conftest import memory_container
from tests.unit.runtime_harness import POLICY

RESUME_BOUND = 5.0  # seconds from the backend's return to a claim (issue 12)
PAUSE_BOUND = 2.0  # seconds: the fetch loop's longest pause, leaving room for pop and claim


class Backlog:
    """A ready list that never drains: every pop returns the same id (a backlog popped and
    failed over and over during the outage). ``down`` makes pops fail as Redis would."""

    def __init__(self, task_id: UUID) -> None:
        self.task_id = task_id
        self.down = False

    async def pop_many(
        self, priorities: Sequence[str], timeout: float, max_count: int
    ) -> list[UUID]:
        if self.down:
            raise BackendUnavailable("injected: redis unreachable")
        return [self.task_id]


async def _resume_after(outage: float, *, down: str) -> float:
    """Run the fetch loop through an ``outage``-second outage of ``down`` (``store`` or
    ``queue``); return the fake seconds from the backend's return to the claim."""
    clock = FakeClock()
    container = memory_container(clock, POLICY, Settings(worker_id="w-resume"))
    store = container.store()
    assert isinstance(store, InMemoryStore)
    submitted = await container.submit().submit_job(
        SubmitJob(tasks=(TaskSpec(name="t", kind="echo", payload=None),))
    )
    backlog = Backlog(submitted.task_ids["t"])
    config = WorkerConfig.resolve(Settings(worker_id="w-resume"), Options(poll_timeout=0.05))
    shared = Shared(
        config=config,
        execution=container.execution(),
        meters=Meters(WorkerMetrics(CollectorRegistry())),
        log=structlog.get_logger("test"),
    )
    room = asyncio.Event()
    room.set()
    claimed: list[float] = []

    async def hand_back(claims: Sequence[Claim]) -> None:
        raise AssertionError("nothing is handed back here")

    def deliver(claim: Claim) -> None:
        claimed.append(elapsed())
        fetcher.stop()

    fetcher = Fetcher(
        shared,
        queue=backlog,  # only pop_many is used by the fetch loop (ReadyLists)
        turn=asyncio.Lock(),
        room=room,
        deliver=deliver,
        hand_back=hand_back,
    )
    start = clock.now()
    returned: list[float] = []

    def elapsed() -> float:
        return (clock.now() - start).total_seconds()

    async def pause(seconds: float) -> None:
        # the backend returns right after the first failed attempt past ``outage`` seconds
        if elapsed() >= outage and not returned:
            returned.append(elapsed())
            store.available, backlog.down = True, False
        await clock.sleep(seconds)

    fetcher._pause = pause  # type: ignore[method-assign]
    if down == "store":
        store.available = False
    else:
        backlog.down = True
    await asyncio.wait_for(fetcher.loop(), timeout=10)

    assert returned and claimed, (returned, claimed)
    return claimed[0] - returned[0]


@pytest.mark.parametrize("down", ["store", "queue"])
@pytest.mark.parametrize("outage", [3.0, 25.0, 600.0])
async def test_a_worker_claims_within_5s_of_the_backend_returning_after_any_outage(
    outage: float, down: str
) -> None:
    resume = await _resume_after(outage, down=down)

    assert resume <= PAUSE_BOUND < RESUME_BOUND


def test_the_backoff_never_pauses_longer_than_2s() -> None:
    delays = [backoff_delay(failures) for failures in range(1, 200) for _ in range(5)]

    assert max(delays) <= PAUSE_BOUND
    assert min(delays) >= 0.4  # exponential from 0.5 s, jitter at most 20 % below
