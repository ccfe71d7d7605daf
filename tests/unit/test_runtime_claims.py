"""A committed claim belongs to the worker (issue 12 bug 2), a lease that can no longer be shown
to be ours stops its handler (bug 5), ``fail`` says whether it retried, and the public surface."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import pytest

from dtq.domain.errors import BackendUnavailable, CommitOutcomeUnknown
from dtq.domain.status import RunStatus, TaskStatus
from dtq.worker import Options, Runtime, Task
from tests.unit.runtime_harness import POLICY, Harness, build_harness

QUICK = Options(poll_timeout=0.05, shutdown_grace=0.2)


def _echo(ran: list[int]) -> Runtime:
    runtime = Runtime(QUICK)
    runtime.register("echo", lambda task: ran.append(task.attempt))
    return runtime


def _failing_once(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    left = [1]

    async def call(*args: Any, **kwargs: Any) -> Any:
        if left:
            left.pop()
            raise BackendUnavailable("injected: connection reset")
        return await original(*args, **kwargs)

    return call


async def _runs_once_and_completes(h: Harness) -> None:
    """Run one echo task; check it ran once and completed without a reclaim."""
    ran: list[int] = []
    task_id = await h.one("echo")

    async with h.running(_echo(ran)):
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED], timeout=3)

    assert ran == [1]
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert view.task.reclaims == 0


# -- issue 12 bug 2: once a claim has committed, the worker owns it ------------------------------


@pytest.mark.parametrize("method", ["set_leases", "release_markers"])
async def test_a_redis_error_right_after_the_claim_commit_still_runs_the_task(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build_harness()
    monkeypatch.setattr(h.queue, method, _failing_once(getattr(h.queue, method)))
    await _runs_once_and_completes(h)


async def test_a_failing_recovery_after_an_ambiguous_claim_commit_still_runs_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = build_harness()
    original = h.store.run
    stage = ["commit"]

    async def run(fn: Callable[[Any], Awaitable[Any]]) -> Any:
        if "claim_many" in getattr(fn, "__qualname__", "") and stage:
            if stage[0] == "commit":  # the claim commits, the client does not hear of it
                stage[0] = "recover"
                await original(fn)
                raise CommitOutcomeUnknown("injected: connection lost during COMMIT")
            stage.clear()  # reading the outcome back fails once too
            raise BackendUnavailable("injected: connection refused")
        return await original(fn)

    monkeypatch.setattr(h.store, "run", run)
    await _runs_once_and_completes(h)


async def test_a_forced_shutdown_between_claim_commit_and_start_hands_the_claim_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = build_harness()
    original = h.store.run
    committed = asyncio.Event()

    async def slow_return(fn: Callable[[Any], Awaitable[Any]]) -> Any:
        result = await original(fn)
        if "claim_many" in getattr(fn, "__qualname__", ""):
            committed.set()  # the claim transaction has committed; its answer is slow
            await asyncio.sleep(0.3)
        return result

    monkeypatch.setattr(h.store, "run", slow_return)
    ran: list[int] = []
    runtime = _echo(ran)
    task_id = await h.one("echo")
    worker = asyncio.create_task(runtime.run(h.services, h.config(runtime), metrics=h.metrics))
    await asyncio.wait_for(committed.wait(), 3)
    worker.cancel()  # shut down at once ...
    await asyncio.sleep(0.05)
    worker.cancel()  # ... and again: the bounded wait for the fetch loop is cut short
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(worker, 5)

    view = await h.task(task_id)
    assert ran == []
    assert view.task.status is TaskStatus.QUEUED  # handed back, not left running
    assert [r.status for r in view.runs] == [RunStatus.DEAD]
    assert view.task.reclaims == 0  # a hand-back does not charge the crash budget
    assert h.queue.ready_ids("default") == [task_id]


async def test_a_hand_back_during_the_lease_write_waits_for_it_and_lists_the_task_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = build_harness()
    original = h.queue.set_leases
    gate = asyncio.Event()

    async def gated(*args: Any, **kwargs: Any) -> None:
        await gate.wait()  # the handler starts while this write is in flight
        await original(*args, **kwargs)

    monkeypatch.setattr(h.queue, "set_leases", gated)
    runtime = Runtime(QUICK)
    started = asyncio.Event()

    @runtime.handler("long")
    async def long(task: Task) -> None:
        started.set()
        await asyncio.sleep(30)

    task_id = await h.one("long")
    worker = asyncio.create_task(runtime.run(h.services, h.config(runtime), metrics=h.metrics))
    await asyncio.wait_for(started.wait(), 3)
    assert h.queue.get_lease(task_id) is None  # started before its lease was written
    worker.cancel()  # one forced shutdown: the handler is interrupted and handed back
    for _ in range(50):
        await asyncio.sleep(0)
    assert [r.status for r in (await h.task(task_id)).runs] == [RunStatus.DEAD]  # committed
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(worker, 5)

    view = await h.task(task_id)
    assert view.task.status is TaskStatus.QUEUED
    # The hand-back's Redis steps waited for the lease write: had the write landed after them,
    # it would have left a lease on a queued task and deleted the marker the re-push set.
    assert h.queue.get_lease(task_id) is None
    assert h.queue.has_marker(task_id)
    assert h.queue.ready_ids("default") == [task_id]


# -- issue 12 bug 5: a lease that cannot be renewed stops the handler ----------------------------


async def test_a_handler_is_cancelled_once_its_lease_cannot_be_renewed_within_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = build_harness()
    runtime = Runtime(QUICK)
    started, cancelled = asyncio.Event(), asyncio.Event()

    @runtime.handler("long")
    async def long(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable("injected: Redis unreachable")

    task_id = await h.one("long")
    async with h.running(runtime, reconcile=False):
        await asyncio.wait_for(started.wait(), 3)
        monkeypatch.setattr(h.queue, "extend_leases", unreachable)
        await asyncio.wait_for(cancelled.wait(), POLICY.lease_duration * 3)
        await asyncio.sleep(0.1)
        view = await h.task(task_id)

    # nothing recorded: the run stays as claimed, for the reclaim to judge
    assert view.task.status is TaskStatus.RUNNING
    assert [r.status for r in view.runs] == [RunStatus.RUNNING]
    assert h.counter("worker_lease_losses_total", kind="long") == 1


# -- ExecutionService.fail says whether it retried ---------------------------------------------


async def _claim_one(h: Harness, **spec: Any) -> tuple[UUID, Any]:
    task_id = await h.one("echo", **spec)
    ids = await h.queue.pop_many(["default"], 0, 1)
    (claim,) = await h.execution.claim_many(ids, "w")
    return task_id, claim


async def test_fail_returns_when_the_retry_is_due() -> None:
    h = build_harness()
    task_id, claim = await _claim_one(h, max_attempts=2)
    result = await h.execution.fail(claim, "ValueError: boom")
    view = await h.task(task_id)
    assert result.retried
    assert result.retry_at == view.task.scheduled_at


@pytest.mark.parametrize(("max_attempts", "permanent"), [(1, False), (3, True)])
async def test_fail_returns_no_retry_for_a_last_or_permanent_failure(
    max_attempts: int, permanent: bool
) -> None:
    h = build_harness()
    _, claim = await _claim_one(h, max_attempts=max_attempts)
    result = await h.execution.fail(claim, "boom", permanent=permanent)
    assert not result.retried
    assert result.retry_at is None


# -- the public surface --------------------------------------------------------------------------


def test_importing_dtq_worker_loads_no_infrastructure_library() -> None:
    code = (
        "import json, sys\n"
        "import dtq.worker\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('psycopg', 'psycopg_pool', 'redis', 'prometheus_client', 'structlog', 'litestar'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(out.stdout) == []


def test_runtime_is_still_importable_from_dtq_worker() -> None:
    from dtq.entrypoints.worker.runtime import Runtime as Engine

    assert Runtime is Engine


def test_heartbeat_every_is_a_deprecated_alias_of_lease_renew_every() -> None:
    with pytest.warns(DeprecationWarning, match="lease_renew_every"):
        options = Options(heartbeat_every=2.0)
    assert options.lease_renew_every == 2.0


def test_the_lease_renewal_period_is_capped_to_a_third_of_the_lease() -> None:
    h = build_harness()
    config = Runtime(Options(lease_renew_every=5.0)).configure(h.settings)
    assert config.lease_renew_every == pytest.approx(h.settings.lease_duration / 3)
    assert config.concurrency == h.settings.worker_concurrency
