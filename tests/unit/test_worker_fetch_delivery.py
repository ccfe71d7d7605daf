"""The fetch loop starts committed claims from the claim's ``on_commit`` (issue 17 item 4).

Handlers start while the lease write that follows the commit is in flight; a loop cancelled
meanwhile hands back only the claims it had not started. Memory adapters; the lease write and
the claim are held at gates, so every ordering is staged, none timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any
from uuid import UUID

import pytest
import structlog
from prometheus_client import CollectorRegistry

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.application.commands import Claim, SubmitJob, TaskSpec
from dtq.application.execution import ExecutionService
from dtq.domain.errors import BackendUnavailable, CommitOutcomeUnknown
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.worker import fetch
from dtq.entrypoints.worker.claims import Meters, Shared
from dtq.entrypoints.worker.completions import REPORT_ATTEMPTS
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.entrypoints.worker.fetch import Fetcher
from dtq.worker import Options
from tests.unit.conftest import memory_container
from tests.unit.runtime_harness import POLICY


class _GatedQueue:
    """The memory queue with ``set_leases`` held at ``leases`` (a slow lease write)."""

    def __init__(self, inner: InMemoryQueue) -> None:
        self.inner = inner
        self.leases = asyncio.Event()

    async def set_leases(self, leases: Any, ttl: float, *, release: Any = ()) -> None:
        await self.leases.wait()
        await self.inner.set_leases(leases, ttl, release=release)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class _GatedExecution(ExecutionService):
    """Claims wait at ``claim`` before their transaction (a slow claim)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.claim = asyncio.Event()
        self.claim.set()

    async def claim_many(
        self,
        task_ids: Sequence[UUID],
        worker_id: str,
        kinds: Collection[str] | None = None,
        *,
        on_commit: Callable[[list[Claim]], None] | None = None,
    ) -> list[Claim]:
        await self.claim.wait()
        return await super().claim_many(task_ids, worker_id, kinds, on_commit=on_commit)


class _Rig:
    """One submitted task, its popped id, and a fetcher recording deliveries and hand-backs."""

    def __init__(self) -> None:
        container = memory_container(FakeClock(), POLICY, Settings(worker_id="w-fetch"))
        self.container = container
        self.store = container.store()
        self.memory = container.queue()
        assert isinstance(self.memory, InMemoryQueue)
        self.queue = _GatedQueue(self.memory)
        self.execution = _GatedExecution(
            store=self.store, queue=self.queue, policy=POLICY, clock=container.clock()
        )
        self.delivered: list[Claim] = []
        self.handed_back: list[Claim] = []
        config = WorkerConfig.resolve(Settings(worker_id="w-fetch"), Options(poll_timeout=0.05))
        shared = Shared(
            config=config,
            execution=self.execution,
            meters=Meters(WorkerMetrics(CollectorRegistry())),
            log=structlog.get_logger("test"),
        )
        room = asyncio.Event()
        room.set()

        async def hand_back(claims: Sequence[Claim]) -> None:
            self.handed_back.extend(claims)

        self.turn = asyncio.Lock()
        self.fetcher = Fetcher(
            shared,
            queue=self.memory,
            turn=self.turn,
            room=room,
            deliver=lambda claim, trace: self.delivered.append(claim),
            hand_back=hand_back,
        )

    async def popped(self) -> UUID:
        [task_id] = await self.popped_many(1)
        return task_id

    async def popped_many(self, count: int) -> list[UUID]:
        specs = tuple(TaskSpec(name=f"t{i}", kind="echo", payload=None) for i in range(count))
        submitted = await self.container.submit().submit_job(SubmitJob(tasks=specs))
        ids: list[UUID] = await self.memory.pop_many(["default"], timeout=0, max_count=count)
        assert ids == [submitted.task_ids[f"t{i}"] for i in range(count)]
        return ids


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_committed_claim_is_delivered_before_its_lease_write_returns() -> None:
    rig = _Rig()
    task_id = await rig.popped()
    claiming = asyncio.ensure_future(rig.fetcher._claim([task_id]))
    await _turns()
    assert [c.task.id for c in rig.delivered] == [task_id]
    assert rig.fetcher.slots.free == rig.fetcher._config.concurrency - 1
    assert rig.memory.get_lease(task_id) is None  # still in flight
    assert not claiming.done()
    rig.queue.leases.set()
    await claiming
    assert rig.memory.get_lease(task_id) is not None
    assert rig.handed_back == []


async def test_a_loop_cancelled_during_the_lease_write_hands_back_nothing_it_started() -> None:
    rig = _Rig()
    task_id = await rig.popped()
    claiming = asyncio.ensure_future(rig.fetcher._claim([task_id]))
    await _turns()
    assert len(rig.delivered) == 1
    claiming.cancel()
    await _turns()
    rig.queue.leases.set()
    with pytest.raises(asyncio.CancelledError):
        await claiming
    assert rig.handed_back == []  # running: it settles through its handler as usual
    assert rig.memory.get_lease(task_id) is not None


async def test_a_loop_cancelled_before_the_commit_hands_the_claims_back_unstarted() -> None:
    rig = _Rig()
    task_id = await rig.popped()
    rig.execution.claim.clear()
    claiming = asyncio.ensure_future(rig.fetcher._claim([task_id]))
    await _turns()
    claiming.cancel()
    await _turns()
    rig.execution.claim.set()  # the shielded claim commits after the cancel
    rig.queue.leases.set()
    with pytest.raises(asyncio.CancelledError):
        await claiming
    assert rig.delivered == []
    assert [c.task.id for c in rig.handed_back] == [task_id]


async def test_a_cancel_requested_as_the_commit_answers_hands_the_claims_back_unstarted() -> None:
    rig = _Rig()
    task_id = await rig.popped()
    rig.execution.claim.clear()
    rig.queue.leases.set()
    claiming = asyncio.ensure_future(rig.fetcher._claim([task_id]))
    await _turns()
    # in one step: the claim's answer arrives and the loop is cancelled; the claim's task runs
    # on first and reaches on_commit before the loop's except clause
    rig.execution.claim.set()
    claiming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claiming
    assert rig.delivered == []
    assert [c.task.id for c in rig.handed_back] == [task_id]


async def _reading_back(
    monkeypatch: pytest.MonkeyPatch, failures: int
) -> tuple[_Rig, UUID, dict[str, Any], asyncio.Future[None]]:
    """A claim that commits but whose outcome is lost, with the store unreachable (every
    read-back fails) while ``state["down"]``; returns once ``failures`` read-backs failed:
    the rig, the task id, the state (``state["failures"]`` counts them) and the running
    ``_claim``. The fetch loop's backoff is made instant."""
    rig = _Rig()
    rig.queue.leases.set()
    task_id = await rig.popped()
    original = rig.store.run
    state: dict[str, Any] = {"committed": False, "down": True, "failures": 0}

    async def run(fn: Callable[[Any], Awaitable[Any]]) -> Any:
        name = getattr(fn, "__qualname__", "")
        if "claim_many" in name:
            if not state["committed"]:
                state["committed"] = True
                await original(fn)
                raise CommitOutcomeUnknown("injected: connection lost during COMMIT")
            raise BackendUnavailable("injected: connection refused")
        if "recover_claims" in name and state["down"]:
            state["failures"] += 1
            raise BackendUnavailable("injected: connection refused")
        return await original(fn)

    monkeypatch.setattr(rig.store, "run", run)
    monkeypatch.setattr(fetch, "backoff_delay", lambda failures: 0.0)
    claiming = asyncio.ensure_future(rig.fetcher._claim([task_id]))
    while state["failures"] < failures:
        await asyncio.sleep(0)
    return rig, task_id, state, claiming


async def test_a_loop_cancelled_while_an_unknown_claim_is_read_back_hands_its_claims_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, task_id, state, claiming = await _reading_back(monkeypatch, failures=2)
    claiming.cancel()
    state["down"] = False  # the store answers again: the next read-back finds the claim
    with pytest.raises(asyncio.CancelledError):
        await claiming
    assert rig.delivered == []
    assert [c.task.id for c in rig.handed_back] == [task_id]


async def test_the_read_back_of_a_cancelled_loop_gives_up_after_the_bounded_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, _, state, claiming = await _reading_back(monkeypatch, failures=1)
    claiming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(claiming, 5)
    assert state["failures"] == REPORT_ATTEMPTS  # then left to the reconciler's reclaim
    assert rig.delivered == []
    assert rig.handed_back == []


async def test_a_batch_claim_does_not_wait_for_a_turn_held_past_its_bound() -> None:
    # A completion batch in a conflict retry series holds the turn through its backoff (seconds
    # in all): the popped ids are claimed without the turn once the bound has passed.
    rig = _Rig()
    rig.queue.leases.set()
    ids = await rig.popped_many(2)
    await rig.turn.acquire()  # held by "the completion" until the claim has returned

    claiming = asyncio.ensure_future(rig.fetcher._claim(ids))
    done, _ = await asyncio.wait({claiming}, timeout=5)  # a hang bound, not a figure
    rig.turn.release()
    await claiming

    assert done == {claiming}  # before: the claim waited for the release
    assert [c.task.id for c in rig.delivered] == ids


async def test_a_batch_claim_waits_for_a_turn_released_within_its_bound() -> None:
    rig = _Rig()
    rig.queue.leases.set()
    ids = await rig.popped_many(2)
    await rig.turn.acquire()
    rig.execution.claim.clear()
    claiming = asyncio.ensure_future(rig.fetcher._claim(ids))
    await _turns()
    rig.turn.release()  # the completion's commit returned
    await _turns()
    assert rig.turn.locked()  # taken by the batch claim
    rig.execution.claim.set()
    await claiming
    assert not rig.turn.locked()
    assert [c.task.id for c in rig.delivered] == ids
