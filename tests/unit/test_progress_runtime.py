"""Progress and checkpoints through the worker runtime on the memory adapters (issue 13 item 5)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from uuid import uuid4

import pytest

from dtq.application.ports import Lease
from dtq.domain.status import RunStatus, TaskStatus
from dtq.worker import Options, Runtime, Task
from tests.unit.runtime_harness import build_harness

pytestmark = pytest.mark.timeout(20)

FAST = Options(lease_renew_every=0.1, shutdown_grace=0.2, poll_timeout=0.05)


async def wait_progress(h: Any, task_id: Any, value: Any, timeout: float = 5.0) -> None:
    async def stored() -> Any:
        return (await h.task(task_id)).task.progress

    async with asyncio.timeout(timeout):
        while await stored() != value:
            await asyncio.sleep(0.01)


async def test_reported_progress_is_visible_while_running_and_kept_after_success() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    go_on = threading.Event()

    @runtime.handler("count")
    def count(task: Task) -> str:  # a plain def: reports from its thread
        for i in range(1, 4):
            task.progress({"done": i})
        go_on.wait(5)
        return "ok"

    task_id = await h.one("count")
    async with h.running(runtime):
        await wait_progress(h, task_id, {"done": 3})  # the renewal carried the latest value
        assert (await h.task(task_id)).task.status is TaskStatus.RUNNING
        go_on.set()
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert view.task.result == "ok"
    assert view.task.progress == {"done": 3}


async def test_the_last_report_before_success_is_stored_with_it() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("quick")
    async def quick(task: Task) -> None:
        task.progress("started")
        await asyncio.sleep(0.25)  # a renewal writes "started"
        task.progress("finished")  # no renewal before the success: the success writes it

    task_id = await h.one("quick")
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert view.task.progress == "finished"


async def test_a_handler_that_reports_nothing_costs_no_progress_write() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    writes: list[int] = []
    record = h.execution.record_progress

    async def counted(reports: Any) -> Any:
        writes.append(len(reports))
        return await record(reports)

    h.execution.record_progress = counted  # type: ignore[method-assign]

    @runtime.handler("silent")
    async def silent(task: Task) -> None:
        await asyncio.sleep(0.35)  # three renewal ticks

    @runtime.handler("steady")
    async def steady(task: Task) -> None:
        task.progress(1)
        for _ in range(4):
            await asyncio.sleep(0.1)
            task.progress(1)  # the same value again: nothing new to write

    silent_id = await h.one("silent")
    async with h.running(runtime):
        await h.wait_task(silent_id, [TaskStatus.COMPLETED])
        assert writes == []
        steady_id = await h.one("steady")
        view = await h.wait_task(steady_id, [TaskStatus.COMPLETED])

    assert writes == [1]
    assert view.task.progress == 1


async def test_a_reclaimed_tasks_next_attempt_resumes_from_the_checkpoint() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    checkpoints: list[Any] = []
    reported = asyncio.Event()

    @runtime.handler("long")
    async def long(task: Task) -> int:
        checkpoints.append(task.checkpoint)
        if task.checkpoint is not None:
            return int(task.checkpoint["chunk"]) + 1  # resumed
        task.progress({"chunk": 41})
        reported.set()
        await asyncio.sleep(30)  # lost below
        return 0

    task_id = await h.one("long", max_attempts=1)
    async with h.running(runtime):
        await asyncio.wait_for(reported.wait(), 5)
        await wait_progress(h, task_id, {"chunk": 41})
        # Another run takes the lease over; when it lapses the reconciler reclaims the task.
        await h.queue.set_leases([Lease(task_id, "other", uuid4(), deadline_ms=0)], ttl=0.3)
        await asyncio.sleep(0.4)
        assert await h.reconcile.reclaim_stale() == 1
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert checkpoints == [None, {"chunk": 41}]
    assert view.task.result == 42
    assert [r.status for r in view.runs] == [RunStatus.DEAD, RunStatus.SUCCEEDED]


async def test_a_handed_back_task_resumes_from_its_last_report() -> None:
    h = build_harness()
    first, second = Runtime(FAST), Runtime(FAST)
    reported = asyncio.Event()
    seen: list[Any] = []

    @first.handler("long")
    async def interrupted(task: Task) -> None:
        task.progress("step 6")
        reported.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            task.progress("step 7")  # no renewal runs after the stop: the hand-back writes it
            raise

    @second.handler("long")
    async def resumed(task: Task) -> None:
        seen.append(task.checkpoint)

    task_id = await h.one("long")
    async with h.running(first) as stop:
        await asyncio.wait_for(reported.wait(), 5)
        stop.set()
    view = await h.task(task_id)
    assert (view.task.status, view.task.progress) == (TaskStatus.QUEUED, "step 7")

    async with h.running(second):
        await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert seen == ["step 7"]


async def test_an_unstorable_progress_value_fails_the_run_with_a_clear_error() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("bad")
    async def bad(task: Task) -> None:
        task.progress({"at": {1, 2}})

    task_id = await h.one("bad", max_attempts=3)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert view.task.attempt == 1  # permanent: no retry
    assert view.task.progress is None
    assert (view.task.last_error or "").startswith(
        "UnstorableProgress: progress cannot be stored: not a JSON value: set at progress.at"
    )
