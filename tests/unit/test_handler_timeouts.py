"""Per-kind and per-task handler timeouts (issue 14 item 3): the task's wins, then the kind's,
then ``Options.default_timeout``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from dtq.domain.status import RunStatus, TaskStatus
from dtq.worker import Options, Runtime, Task
from tests.unit.runtime_harness import build_harness

FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)


async def sleepy(task: Task) -> str:
    await asyncio.sleep(float(task.payload))
    return "woke"


async def test_the_kinds_timeout_beats_the_default() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, default_timeout=30.0))
    runtime.register("sleepy", sleepy, timeout=0.1)
    task_id = await h.one("sleepy", 5, max_attempts=1)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])
    assert [(r.status, r.error) for r in view.runs] == [(RunStatus.FAILED, "timed out after 0.1 s")]


async def test_the_tasks_timeout_beats_the_kinds() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("sleepy", timeout=timedelta(milliseconds=100))
    async def handler(task: Task) -> str:
        return await sleepy(task)

    longer = await h.one("sleepy", 0.3, max_attempts=1, timeout=timedelta(seconds=5))
    shorter = await h.one("sleepy", 5, max_attempts=1, timeout=timedelta(milliseconds=150))
    async with h.running(runtime):
        done = await h.wait_task(longer, [TaskStatus.COMPLETED])
        failed = await h.wait_task(shorter, [TaskStatus.FAILED])
    assert done.task.result == "woke"
    assert failed.runs[0].error == "timed out after 0.15 s"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5s", True])
def test_a_bad_kind_timeout_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="timeout for kind 'k'"):
        Runtime().register("k", sleepy, timeout=bad)  # type: ignore[arg-type]
