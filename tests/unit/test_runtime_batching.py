"""The worker runtime's batched hot path: claims and completions share transactions (spec §5, §6).

The execution service is wrapped so each ``claim_many`` / ``complete_many`` call is recorded
(its size), optionally delayed like a real transaction, or held until a test opens a gate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID, uuid4

import pytest
import structlog
from structlog.testing import capture_logs

from dtq.application.commands import Claim, ReportOutcome, TaskSpec
from dtq.application.execution import ExecutionService
from dtq.application.ports import Lease
from dtq.domain.errors import BackendUnavailable
from dtq.domain.status import RunStatus, TaskStatus
from dtq.entrypoints.worker import completions
from dtq.entrypoints.worker.session import Session
from dtq.worker import Options, Runtime, Task
from tests.single import enqueue_one
from tests.unit.runtime_harness import POLICY, Harness, build_harness

pytestmark = pytest.mark.timeout(30)

FAST = Options(lease_renew_every=0.1, shutdown_grace=0.2, poll_timeout=0.05)


class CountingExecution(ExecutionService):
    """Records the size of every batch call; can delay it or hold completions at a gate."""

    def __init__(self, *, latency: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.latency = latency  # seconds each batch call takes, like a real transaction
        self.claim_sizes: list[int] = []
        self.complete_sizes: list[int] = []
        self.gate = asyncio.Event()  # complete_many waits for it
        self.gate.set()
        self.completing = asyncio.Event()  # set once a complete_many call is waiting
        self.complete_failures = 0  # how many complete_many calls still raise
        self.in_flight = 0  # claim_many + complete_many calls running now
        self.most_in_flight = 0

    async def claim_many(
        self,
        task_ids: Sequence[UUID],
        worker_id: str,
        kinds: Collection[str] | None = None,
        *,
        on_commit: Callable[[list[Claim]], None] | None = None,
    ) -> list[Claim]:
        self.claim_sizes.append(len(task_ids))
        if len(task_ids) == 1:  # a lone id does not take turns (Fetcher._claim_many)
            return await super().claim_many(task_ids, worker_id, kinds, on_commit=on_commit)
        with self._counted():
            if self.latency:
                await asyncio.sleep(self.latency)
            return await super().claim_many(task_ids, worker_id, kinds, on_commit=on_commit)

    async def complete_many(
        self,
        claims: Sequence[Claim],
        results: Sequence[Any] | None = None,
        *,
        progress: Mapping[UUID, Any] | None = None,
    ) -> list[ReportOutcome]:
        self.complete_sizes.append(len(claims))
        self.completing.set()
        await self.gate.wait()
        if self.complete_failures:
            self.complete_failures -= 1
            raise BackendUnavailable("connection reset")
        with self._counted():
            if self.latency:
                await asyncio.sleep(self.latency)
            return await super().complete_many(claims, results, progress=progress)

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1


def counting_harness(latency: float = 0.0) -> tuple[Harness, CountingExecution]:
    h = build_harness()
    execution = CountingExecution(latency=latency, store=h.store, queue=h.queue, policy=POLICY)
    h.execution = execution
    return h, execution


async def submit_many(h: Harness, kind: str, n: int) -> list[UUID]:
    result = await h.submit_tasks(*(TaskSpec(name=f"t{i}", kind=kind) for i in range(n)))
    return [result.task_ids[f"t{i}"] for i in range(n)]


# -- batching ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "max_claim", "max_complete", "claim_calls_below"),
    [
        (Options(), 16, 128, 200 // 4),  # defaults: a pop is capped by the 16 free slots
        (Options(claim_batch=4, complete_batch=5), 4, 5, 200 // 2),
    ],
    ids=["defaults", "small-batches"],
)
async def test_claims_and_completions_are_batched_and_each_task_completes_once(
    options: Options, max_claim: int, max_complete: int, claim_calls_below: int
) -> None:
    h, execution = counting_harness(latency=0.003)
    runtime = Runtime(replace(options, lease_renew_every=0.1, poll_timeout=0.05, concurrency=16))
    calls: list[UUID] = []

    @runtime.handler("work")
    async def work(task: Task) -> None:
        calls.append(task.id)
        await asyncio.sleep(random.uniform(0, 0.004))

    ids = await submit_many(h, "work", 200)
    async with h.running(runtime):
        for task_id in ids:
            await h.wait_task(task_id, [TaskStatus.COMPLETED], timeout=10)

    # every task ran once and completed once, with one succeeded run
    assert collections.Counter(calls) == dict.fromkeys(ids, 1)
    for task_id in ids:
        view = await h.task(task_id)
        assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert h.counter("worker_tasks_claimed_total", kind="work") == 200
    assert h.counter("worker_tasks_succeeded_total", kind="work") == 200
    assert h.counter("worker_claim_refusals_total") == 0
    # claims: fewer transactions than tasks, none larger than the free slots / claim_batch
    assert sum(execution.claim_sizes) == 200
    assert len(execution.claim_sizes) < claim_calls_below
    assert max(execution.claim_sizes) <= max_claim
    # completions: likewise, none larger than complete_batch
    assert sum(execution.complete_sizes) == 200
    assert len(execution.complete_sizes) < 200 // 2
    assert max(execution.complete_sizes) <= max_complete
    # batch claims and completions take turns: one hot-path transaction at a time
    assert execution.most_in_flight == 1


async def test_a_lone_id_is_claimed_while_a_completion_holds_the_turn() -> None:
    h, execution = counting_harness()
    runtime = Runtime(replace(FAST, concurrency=4))
    started: list[UUID] = []
    runtime.register("echo", lambda task: started.append(task.id))
    execution.gate.clear()  # completions wait here, holding the transaction turn

    async with h.running(runtime, reconcile=False):
        first = await h.one("echo")
        await asyncio.wait_for(execution.completing.wait(), timeout=5)
        second = await h.one("echo")
        deadline = asyncio.get_running_loop().time() + 5
        while second not in started:
            assert asyncio.get_running_loop().time() < deadline, "lone claim waited for the turn"
            await asyncio.sleep(0.01)
        assert (await h.task(first)).task.status is TaskStatus.RUNNING  # still uncommitted
        execution.gate.set()
        await h.wait_task(first, [TaskStatus.COMPLETED])
        await h.wait_task(second, [TaskStatus.COMPLETED])

    assert execution.claim_sizes == [1, 1]


async def test_a_duplicate_id_in_a_batch_is_claimed_once_and_counted_as_refused() -> None:
    h, execution = counting_harness()
    runtime = Runtime(replace(FAST, concurrency=4))
    calls: list[UUID] = []
    runtime.register("echo", lambda task: calls.append(task.id))
    task_id = await h.one("echo")
    await h.queue.release_markers([task_id])
    await enqueue_one(h.queue, task_id, "default")  # a duplicate delivery, as after a marker expiry
    assert h.queue.ready_ids("default") == [task_id, task_id]

    async with h.running(runtime, reconcile=False):
        await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert execution.claim_sizes == [2]  # both popped together
    assert calls == [task_id]
    assert h.counter("worker_claim_refusals_total") == 1


# -- lease ------------------------------------------------------------------------------------


async def test_a_lost_lease_cancels_only_that_handler_of_a_batch() -> None:
    h, execution = counting_harness()
    runtime = Runtime(replace(FAST, concurrency=4))
    started: set[UUID] = set()
    cancelled: set[UUID] = set()
    release = asyncio.Event()

    @runtime.handler("hold")
    async def hold(task: Task) -> None:
        started.add(task.id)
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.add(task.id)
            raise

    a, b, c = await submit_many(h, "hold", 3)
    async with h.running(runtime, reconcile=False):
        while len(started) < 3:
            await asyncio.sleep(0.01)
        assert execution.claim_sizes == [3]  # one claim transaction for the three
        await h.queue.set_leases([Lease(b, "other-worker", uuid4(), deadline_ms=0)], ttl=30)
        while not cancelled:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # three more heartbeats: nobody else is touched
        assert cancelled == {b}
        release.set()
        for task_id in (a, c):
            await h.wait_task(task_id, [TaskStatus.COMPLETED])

    lost = await h.task(b)
    assert lost.task.status is TaskStatus.RUNNING  # nothing recorded for the lost run
    assert [r.status for r in lost.runs] == [RunStatus.RUNNING]
    assert h.counter("worker_lease_losses_total", kind="hold") == 1
    assert h.counter("worker_tasks_succeeded_total", kind="hold") == 2


async def test_the_lease_is_kept_until_the_completion_is_committed() -> None:
    h, execution = counting_harness()
    runtime = Runtime(FAST)
    runtime.register("echo", lambda task: None)
    execution.gate.clear()  # the commit takes longer than the lease (0.6 s + 0.2 s TTL)
    task_id = await h.one("echo")

    async with h.running(runtime):
        await asyncio.wait_for(execution.completing.wait(), 5)
        reclaimed = 0
        for _ in range(30):  # 1.5 s: the reclaimer must always find a live lease
            reclaimed += await h.reconcile.reclaim_stale()
            await asyncio.sleep(0.05)
        assert h.queue.get_lease(task_id) is not None
        execution.gate.set()
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert reclaimed == 0
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert h.counter("worker_lease_extensions_total", kind="echo") >= 5
    assert h.queue.get_lease(task_id) is None


async def test_a_batch_that_cannot_be_recorded_while_its_lease_lapses_is_left_to_reclaim_and_redone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A success is retried for as long as its lease is renewed; here no renewal succeeds
    # (Redis unreachable for the lease), so after a lease window (0.6 s) the worker gives the
    # success up once its bounded tries (4 pauses of 0.3 s) are spent.
    monkeypatch.setattr(completions, "backoff_delay", lambda failures: 0.3)
    h, execution = counting_harness()

    async def unreachable(claims: Sequence[Claim]) -> object:
        raise BackendUnavailable("injected: redis unreachable")

    monkeypatch.setattr(execution, "heartbeat_many", unreachable)
    execution.complete_failures = completions.REPORT_ATTEMPTS  # the first batch gives up
    runtime = Runtime(FAST)
    calls: list[int] = []
    runtime.register("echo", lambda task: calls.append(task.attempt))
    task_id = await h.one("echo")

    with capture_logs() as logs:
        async with h.running(runtime):

            async def reclaimer() -> None:
                while True:
                    await h.reconcile.reclaim_stale()
                    await asyncio.sleep(0.05)

            reclaiming = asyncio.create_task(reclaimer())
            view = await h.wait_task(task_id, [TaskStatus.COMPLETED], timeout=10)
            reclaiming.cancel()

    assert calls == [1, 1]  # redone after the reclaim; the lost run cost no attempt
    assert [r.status for r in view.runs] == [RunStatus.DEAD, RunStatus.SUCCEEDED]
    assert execution.complete_sizes == [1] * (completions.REPORT_ATTEMPTS + 1)
    given_up = [e for e in logs if e["event"] == "outcome not recorded; the task will be reclaimed"]
    assert [e["task_id"] for e in given_up] == [str(task_id)]


# -- shutdown ---------------------------------------------------------------------------------


async def test_shutdown_hands_back_running_handlers_and_commits_waiting_successes() -> None:
    h, execution = counting_harness()
    runtime = Runtime(replace(FAST, concurrency=8))
    stuck_started: set[UUID] = set()

    @runtime.handler("stuck")
    async def stuck(task: Task) -> None:
        stuck_started.add(task.id)
        await asyncio.sleep(30)

    runtime.register("quick", lambda task: None)
    result = await h.submit_tasks(
        *(TaskSpec(name=f"s{i}", kind="stuck") for i in range(4)),
        *(TaskSpec(name=f"q{i}", kind="quick") for i in range(4)),
    )
    stuck_ids = [result.task_ids[f"s{i}"] for i in range(4)]
    quick_ids = [result.task_ids[f"q{i}"] for i in range(4)]
    execution.gate.clear()  # the quick successes stay in their completion batch for now

    with capture_logs() as logs:
        async with h.running(runtime, reconcile=False) as stop:
            await asyncio.wait_for(execution.completing.wait(), 5)
            while len(stuck_started) < 4:
                await asyncio.sleep(0.01)
            assert execution.claim_sizes == [8]
            stop.set()
            # after the grace the stuck ones are handed back while the batch is still held
            for task_id in stuck_ids:
                await h.wait_task(task_id, [TaskStatus.QUEUED], timeout=5)
            execution.gate.set()

    for task_id in stuck_ids:
        view = await h.task(task_id)
        assert view.task.attempt == 0
        assert [(r.status, r.error) for r in view.runs] == [
            (RunStatus.DEAD, "worker shutting down")
        ]
        assert h.queue.get_lease(task_id) is None
    assert sorted(h.queue.ready_ids("default")) == sorted(stuck_ids)
    for task_id in quick_ids:
        view = await h.task(task_id)
        assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
        assert h.queue.get_lease(task_id) is None
    assert sum(execution.complete_sizes) == 4
    stopped = [e for e in logs if e["event"] == "worker stopped"]
    assert stopped[0]["handed_back"] == 4


async def test_ids_popped_after_the_stop_are_put_back_unclaimed() -> None:
    h, execution = counting_harness()
    runtime = Runtime(replace(FAST, poll_timeout=2.0, concurrency=4))
    runtime.register("echo", lambda task: None)

    async with h.running(runtime, reconcile=False) as stop:
        await asyncio.sleep(0.1)  # the fetch loop is blocked in its pop
        stop.set()
        await asyncio.sleep(0.05)  # the session has seen the stop; the pop still blocks
        task_id = await h.one("echo")  # delivered to the pop that began before the stop

    view = await h.task(task_id)
    assert view.task.status is TaskStatus.QUEUED
    assert view.runs == []
    assert execution.claim_sizes == []
    assert h.queue.ready_ids("default") == [task_id]
    assert h.queue.has_marker(task_id)  # pushed again behind a new marker


# -- logging ----------------------------------------------------------------------------------


@pytest.fixture
def debug_logging() -> Iterator[None]:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.usefixtures("debug_logging")
async def test_a_success_is_logged_at_debug_only_with_the_task_fields() -> None:
    h, _ = counting_harness()
    runtime = Runtime(FAST)
    runtime.register("echo", lambda task: None)
    task_id = await h.one("echo")

    with capture_logs() as logs:
        async with h.running(runtime):
            view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    about_task = [e for e in logs if e.get("task_id") == str(task_id)]
    assert {e["log_level"] for e in about_task} == {"debug"}
    succeeded = [e for e in about_task if e["event"] == "task succeeded"]
    assert len(succeeded) == 1
    assert {k: succeeded[0][k] for k in ("job_id", "kind", "attempt", "outcome")} == {
        "job_id": str(view.task.job_id),
        "kind": "echo",
        "attempt": 1,
        "outcome": ReportOutcome.RECORDED,
    }


async def test_a_batch_claimed_while_stopping_now_is_handed_back_without_running() -> None:
    h, execution = counting_harness(latency=0.3)  # the claim transaction is in flight...
    runtime = Runtime(replace(FAST, concurrency=4))
    ran: list[UUID] = []
    runtime.register("echo", lambda task: ran.append(task.id))
    ids = await submit_many(h, "echo", 3)
    stop, stop_now = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(
        runtime.run(h.services, h.config(runtime), stop=stop, stop_now=stop_now, metrics=h.metrics)
    )
    while not execution.claim_sizes:
        await asyncio.sleep(0.01)
    stop.set()  # ...when the worker is told to stop at once
    stop_now.set()
    await asyncio.wait_for(worker, 5)

    assert execution.claim_sizes == [3]
    assert ran == []
    for task_id in ids:
        view = await h.task(task_id)
        assert view.task.status is TaskStatus.QUEUED
        assert [r.status for r in view.runs] == [RunStatus.DEAD]
    assert sorted(h.queue.ready_ids("default")) == sorted(ids)


async def test_claims_abandoned_before_their_task_began_are_handed_back() -> None:
    h = build_harness()
    ran: list[UUID] = []
    runner = Session(
        handlers={"echo": lambda task: ran.append(task.id)},
        config=h.config(Runtime(FAST)),
        services=h.services,
        metrics=h.metrics,
        log=structlog.get_logger("test").bind(),
    )
    ids = await submit_many(h, "echo", 2)
    claims = await h.execution.claim_many(await h.queue.pop_many(["default"], 0, 2), "w")
    for claim in claims:
        runner.start(claim)
    runner.abandon()  # before either asyncio task took its first step
    await asyncio.wait_for(runner.wait_settled(), 5)
    runner.close()

    assert ran == []
    assert runner.handed_back == 2
    for task_id in ids:
        assert [r.status for r in (await h.task(task_id)).runs] == [RunStatus.DEAD]


async def test_a_backlog_is_claimed_in_whole_batches_not_staggered_halves() -> None:
    """While the lists hold a backlog, a pop waits for the commit that frees the rest of the
    slots instead of claiming half a batch (Fetcher.loop): completions of 32 would otherwise
    keep the claims at 32 for the whole backlog."""
    h, execution = counting_harness(latency=0.003)
    runtime = Runtime(replace(FAST, concurrency=64, complete_batch=32, claim_batch=64))
    runtime.register("noop", lambda task: None)

    ids = await submit_many(h, "noop", 640)
    async with h.running(runtime):
        for task_id in ids:
            await h.wait_task(task_id, [TaskStatus.COMPLETED], timeout=10)

    assert sum(execution.claim_sizes) == 640
    full = sum(1 for size in execution.claim_sizes if size == 64)
    assert full >= 8, execution.claim_sizes  # of the 10 batches the backlog fills
    assert h.counter("worker_tasks_succeeded_total", kind="noop") == 640


async def test_slots_freed_by_failures_are_claimed_again_without_waiting_for_a_commit() -> None:
    """The fetch loop's wait for a commit of successes is bounded: here the slots are freed by
    failures (recorded by their own transactions, never a success commit) while the other
    slots stay held by long handlers, and the tasks behind them are still claimed and run."""
    h, _ = counting_harness(latency=0.002)
    runtime = Runtime(replace(FAST, concurrency=8, complete_batch=4, claim_batch=8))
    release = asyncio.Event()
    failed: list[UUID] = []

    @runtime.handler("long")
    async def long(task: Task) -> None:
        await release.wait()

    @runtime.handler("broken")
    async def broken(task: Task) -> None:
        failed.append(task.id)
        raise RuntimeError("boom")

    long_ids = await submit_many(h, "long", 7)
    result = await h.submit_tasks(
        *(TaskSpec(name=f"b{i}", kind="broken", max_attempts=1) for i in range(10))
    )
    broken_ids = list(result.task_ids.values())
    async with h.running(runtime):
        for task_id in broken_ids:  # seven of eight slots stay held the whole time
            await h.wait_task(task_id, [TaskStatus.FAILED], timeout=10)
        assert not release.is_set() and len(failed) == 10
        release.set()
        for task_id in long_ids:
            await h.wait_task(task_id, [TaskStatus.COMPLETED], timeout=10)
