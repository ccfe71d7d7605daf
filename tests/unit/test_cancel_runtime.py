"""The worker runtime stops the handler of a cancelled task (issue 14 item 1): its next lease
heartbeat answers ``LeaseState.CANCELLED``; the handler is cancelled, nothing is reported, and
it is logged as a cancel, not as a lost lease."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from dtq.application.control import ControlService
from dtq.domain.status import RunStatus, TaskStatus
from dtq.worker import Options, Runtime, Task
from tests.unit.runtime_harness import build_harness

pytestmark = pytest.mark.timeout(20)

FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)


async def test_a_cancelled_tasks_handler_is_cancelled_and_reports_nothing() -> None:
    h = build_harness()
    control = ControlService(store=h.store, queue=h.queue)
    runtime = Runtime(FAST)
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @runtime.handler("long")
    async def long(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task_id = await h.one("long")
    with capture_logs() as logs:
        async with h.running(runtime):
            await asyncio.wait_for(started.wait(), 5)
            await control.cancel_task(task_id)
            await asyncio.wait_for(cancelled.wait(), 2)  # within a renewal interval or so
            await asyncio.sleep(0.3)  # room for a (wrong) report to land

    view = await h.task(task_id)
    assert view.task.status is TaskStatus.CANCELLED
    assert [r.status for r in view.runs] == [RunStatus.CANCELLED]
    assert h.counter("worker_lease_losses_total", kind="long") == 0
    assert h.counter("worker_tasks_failed_total", kind="long") == 0
    events = [entry["event"] for entry in logs]
    assert "task cancelled: cancelling the handler" in events
    assert "task cancelled: handler cancelled, nothing reported" in events
    assert not any(event.startswith("lease lost") for event in events)
