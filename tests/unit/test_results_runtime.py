"""Results and fan-in through the worker runtime on the memory adapters (issue 13)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dtq.application.commands import TaskSpec
from dtq.domain.status import JobStatus, TaskStatus
from dtq.worker import Options, Runtime, Task
from tests.unit.runtime_harness import POLICY, build_harness

pytestmark = pytest.mark.timeout(20)

FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)


async def test_b_sees_the_result_a_returned() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    seen: list[dict[str, Any]] = []

    @runtime.handler("produce")
    async def produce(task: Task) -> dict[str, Any]:
        return {"n": task.payload["n"] * 2}

    @runtime.handler("consume")
    def consume(task: Task) -> int:  # a plain def runs in a thread and returns the same way
        seen.append(dict(task.parents))
        return sum(parent["n"] for parent in task.parents.values())

    result = await h.submit_tasks(
        TaskSpec("a", "produce", payload={"n": 1}),
        TaskSpec("a2", "produce", payload={"n": 20}),
        TaskSpec("b", "consume", depends_on=("a", "a2")),
    )
    async with h.running(runtime):
        job = await h.wait_job(result.job_id)

    assert job.job.status is JobStatus.COMPLETED
    assert seen == [{"a": {"n": 2}, "a2": {"n": 40}}]
    tasks = {t.name: t for t in job.tasks}
    assert tasks["a"].result == {"n": 2}
    assert tasks["b"].result == 42


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        ("x" * 2000, "over the limit of 1000 (API_MAX_RESULT_BYTES)"),
        ({"when": {1, 2}}, "not a JSON value: set at result.when"),
        ({"x": float("inf")}, "number is not finite at result.x"),
    ],
)
async def test_an_unstorable_result_fails_the_run_for_good(returned: Any, why: str) -> None:
    h = build_harness(replace(POLICY, max_result_bytes=1000))
    runtime = Runtime(FAST)
    runtime.register("big", lambda task: returned)
    task_id = await h.one("big", max_attempts=3)

    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert view.task.attempt == 1  # permanent: no retry
    assert view.task.result is None
    error = view.task.last_error or ""
    assert error.startswith("UnstorableResult: result ")
    assert why in error
    assert [run.error for run in view.runs] == [error]
