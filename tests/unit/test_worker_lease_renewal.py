"""The lease renewal tick (spec §6 Lease / heartbeat): one ``heartbeat_many`` per batch of held
claims, one queue call per batch, and no store read for a claim whose success was committed
while the tick was under way (its lease is gone because it is finished, not lost).

Runs on the memory adapters through the production wiring (``memory_container``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import httpx
import pytest
import structlog
from prometheus_client import CollectorRegistry

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import Claim, SubmitJob, TaskSpec
from dtq.application.control import ControlService
from dtq.application.execution import ExecutionService
from dtq.application.ports import Lease, LeaseState
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.worker.claims import Held, Meters, Shared
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.entrypoints.worker.http import HttpExecution, Orchestrator
from dtq.entrypoints.worker.leases import Leases
from dtq.worker import Options
from tests.unit.conftest import memory_container
from tests.unit.runtime_harness import POLICY

HELD = 300  # more than one heartbeat call's batch
SETTLING = 44  # the last claims, whose successes commit while the tick's first call is sent


@dataclass
class Fleet:
    clock: FakeClock
    store: InMemoryStore
    queue: InMemoryQueue
    execution: ExecutionService
    control: ControlService
    claims: list[Claim]


@pytest.fixture
async def fleet() -> Fleet:
    """``HELD`` claimed tasks of one job, their leases written."""
    clock = FakeClock()
    container = memory_container(clock, POLICY, Settings(worker_id="w-renew"))
    store, queue = container.store(), container.queue()
    assert isinstance(store, InMemoryStore) and isinstance(queue, InMemoryQueue)
    specs = tuple(TaskSpec(name=f"t{i}", kind="echo") for i in range(HELD))
    await container.submit().submit_job(SubmitJob(tasks=specs))
    ids = await queue.pop_many(["default"], timeout=0.05, max_count=HELD)
    execution = container.execution()
    claims = await execution.claim_many(ids, "w-renew")
    assert len(claims) == HELD
    return Fleet(clock, store, queue, execution, container.control(), claims)


def _count_calls(
    owner: Any, name: str, calls: list[int], *, unless: Callable[[], bool] = lambda: False
) -> None:
    """Wrap ``owner.name`` (an async method) so each call appends 1 to ``calls``, except
    while ``unless()`` is true."""
    inner: Callable[..., Awaitable[Any]] = getattr(owner, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        if not unless():
            calls.append(1)
        return await inner(*args, **kwargs)

    setattr(owner, name, counted)


class _SettlesTheTailFirst:
    """The worker's execution, except that the tick's first heartbeat (of either signature)
    first commits the successes of the last ``SETTLING`` claims and stops holding them, as the
    completion loop does while a tick is under way."""

    def __init__(self, fleet: Fleet, held: list[Held], leases: Callable[[], Leases]) -> None:
        self._fleet = fleet
        self._held = held
        self._leases = leases
        self._settled = False
        self.settling = False  # the tail's completion is being committed

    async def _settle_tail(self) -> None:
        if self._settled:
            return
        self._settled = self.settling = True
        tail = self._held[-SETTLING:]
        await self._fleet.execution.complete_many([h.claim for h in tail])
        self.settling = False
        for held in tail:
            self._leases().release(held)

    async def heartbeat(self, claim: Claim) -> LeaseState:
        await self._settle_tail()
        return await self._fleet.execution.heartbeat(claim)

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[LeaseState]:
        await self._settle_tail()
        return await self._fleet.execution.heartbeat_many(claims)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._fleet.execution, attr)


async def test_a_tick_reads_no_store_for_claims_settled_during_it(fleet: Fleet) -> None:
    held = [Held(claim) for claim in fleet.claims]
    leases: list[Leases] = []
    execution = _SettlesTheTailFirst(fleet, held, lambda: leases[0])
    shared = Shared(
        config=WorkerConfig.resolve(Settings(worker_id="w-renew"), Options()),
        execution=execution,
        meters=Meters(WorkerMetrics(CollectorRegistry())),
        log=structlog.get_logger("test"),
    )
    lost: list[tuple[Held, str]] = []
    leases.append(Leases(shared, on_lost=lambda h, reason: lost.append((h, reason))))
    for h in held:
        leases[0].hold(h)
    transactions: list[int] = []
    queue_calls: list[int] = []
    _count_calls(fleet.store, "run", transactions, unless=lambda: execution.settling)
    _count_calls(fleet.queue, "extend_leases", queue_calls)
    fleet.clock.advance(POLICY.lease_duration / 2)

    await asyncio.wait_for(leases[0]._renew_all(), 5)

    assert transactions == []  # before: one store read per settled claim of a later batch
    assert lost == []
    assert len(queue_calls) == 1  # the settled claims were the whole second batch
    expected = int((fleet.clock.now().timestamp() + POLICY.lease_duration) * 1000)
    for h in held[:-SETTLING]:
        lease = fleet.queue.get_lease(h.claim.task.id)
        assert lease is not None and lease.deadline_ms == expected
        assert leases[0].holds(h)


async def test_heartbeat_many_answers_each_claim_with_one_store_read(fleet: Fleet) -> None:
    extended, recreated, finished, cancelled, taken = fleet.claims[:5]
    await fleet.execution.complete_many([finished])
    await fleet.control.cancel_task(cancelled.task.id)
    rival = Lease(taken.task.id, "w-other", uuid4(), deadline_ms=1)
    for claim in (recreated, taken):
        await fleet.queue.delete_leases([(claim.task.id, claim.run.id)])
    transactions: list[int] = []
    _count_calls(fleet.store, "run", transactions)

    class _RivalWritesFirst:
        """A lease of another worker lands between the store read and the re-creation."""

        def __getattr__(self, attr: str) -> Any:
            return getattr(fleet.queue, attr)

        async def recreate_lease(self, lease: Lease, ttl: float) -> LeaseState:
            if lease.task_id == taken.task.id:
                await fleet.queue.set_leases([rival], ttl)
            return await fleet.queue.recreate_lease(lease, ttl)

    racing = ExecutionService(
        store=fleet.store, queue=_RivalWritesFirst(), policy=POLICY, clock=fleet.clock
    )
    states = await racing.heartbeat_many([extended, recreated, finished, cancelled, taken])

    assert states == [
        LeaseState.EXTENDED,
        LeaseState.EXTENDED,  # still its task's live run: re-created
        LeaseState.LOST,
        LeaseState.CANCELLED,
        LeaseState.LOST,  # another worker's lease was written first: left alone
    ]
    assert len(transactions) == 1
    lease = fleet.queue.get_lease(recreated.task.id)
    assert lease is not None and lease.run_id == recreated.run.id
    assert fleet.queue.get_lease(taken.task.id) == rival
    assert await fleet.execution.heartbeat_many([]) == []


async def test_the_http_worker_sends_one_heartbeat_per_run_at_most_32_at_once(
    fleet: Fleet,
) -> None:
    claims = fleet.claims[:70]
    cancelled, lost = claims[1].run.id, claims[2].run.id
    seen: list[str] = []
    in_flight = [0, 0]  # now, most

    async def orchestrator(request: httpx.Request) -> httpx.Response:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.001)  # the others of its batch get sent meanwhile
        in_flight[0] -= 1
        run_id = request.url.path.split("/")[-2]
        seen.append(run_id)
        if run_id == str(lost):
            return httpx.Response(409, json={"detail": "run not live"})
        return httpx.Response(200, json={"cancel": run_id == str(cancelled)})

    transport = httpx.MockTransport(orchestrator)
    async with httpx.AsyncClient(transport=transport, base_url="http://orchestrator") as client:
        execution = HttpExecution(
            Orchestrator(client, "w-http"), {}, lease_duration=30.0, max_result_bytes=1024
        )
        states = await execution.heartbeat_many(claims)

    assert states[:3] == [LeaseState.EXTENDED, LeaseState.CANCELLED, LeaseState.LOST]
    assert states[3:] == [LeaseState.EXTENDED] * 67
    assert sorted(seen) == sorted(str(claim.run.id) for claim in claims)
    assert in_flight[1] == 32
