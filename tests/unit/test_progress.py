"""Progress and checkpoints on the memory adapters (issue 13 item 5).

A handler's progress is stored fenced to its live run (``ExecutionService.record_progress``,
one statement per lease renewal tick), the latest value wins, the outcome that ends the run
flushes the last one, and the next attempt's claim carries it as the checkpoint.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from dtq.application.commands import Claim, ReportOutcome, TaskSpec
from dtq.domain.entities import Task
from dtq.domain.errors import InvalidPayload, StaleRun
from dtq.domain.payload import MAX_PROGRESS_BYTES, check_progress
from dtq.domain.status import TaskStatus
from dtq.worker import Task as HandlerTask
from dtq.worker import UnstorableProgress
from tests.single import enqueue_one, pop_one, queued_task
from tests.unit.conftest import POLICY, App

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def claim_next(app: App, worker: str = "w1") -> Claim:
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None, "nothing on the ready list"
    claims = await app.execution.claim_many([task_id], worker)
    assert len(claims) == 1, "claim refused"
    return claims[0]


async def stored_progress(app: App, claim: Claim) -> Any:
    return (await app.queries.get_task(claim.task.id)).task.progress


def running_task() -> Task:
    task = queued_task(uuid4(), NOW, kind="echo")
    task.claim(run_id=uuid4(), worker_id="w1", at=NOW)
    return task


# --- domain -----------------------------------------------------------------------------------


def test_the_live_run_records_progress_and_the_same_value_is_no_change() -> None:
    task = running_task()
    assert task.current_run_id is not None

    assert task.record_progress(task.current_run_id, {"done": 3}) is True
    assert task.record_progress(task.current_run_id, {"done": 3}) is False
    assert task.progress == {"done": 3}


def test_another_runs_progress_is_refused() -> None:
    task = running_task()

    with pytest.raises(StaleRun):
        task.record_progress(uuid4(), 1)
    assert task.progress is None


# --- check_progress and task.progress ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"s": "a\x00b"}, "progress.s"),
        ({"s": "a\udcffb"}, "progress.s"),
        ([math.inf], "progress[0]"),
        ({"x": {1}}, "progress.x"),
    ],
)
def test_an_unstorable_progress_value_is_refused_naming_the_path(value: Any, field: str) -> None:
    with pytest.raises(InvalidPayload) as caught:
        check_progress(value)
    assert caught.value.field == field
    assert caught.value.detail.startswith("progress cannot be stored")


def test_progress_over_64_kib_is_refused() -> None:
    assert MAX_PROGRESS_BYTES == 64 * 1024
    assert check_progress("x" * (MAX_PROGRESS_BYTES - 2)) == MAX_PROGRESS_BYTES
    with pytest.raises(InvalidPayload, match="over the limit of 65536"):
        check_progress("x" * (MAX_PROGRESS_BYTES - 1))


def test_task_progress_raises_a_permanent_error_and_reports_nothing() -> None:
    reported: list[Any] = []
    task = HandlerTask(
        id=uuid4(), job_id=uuid4(), kind="k", payload=None, attempt=1, _report=reported.append
    )

    with pytest.raises(UnstorableProgress, match=r"progress cannot be stored: .* progress\.n"):
        task.progress({"n": math.nan})
    task.progress({"n": 1})

    assert reported == [{"n": 1}]


# --- recording ------------------------------------------------------------------------------


async def test_progress_is_stored_for_the_live_run_and_the_latest_wins(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await claim_next(app)
    assert await stored_progress(app, claim) is None

    assert await app.execution.record_progress([(claim, {"done": 1})]) == {claim.task.id}
    await app.execution.record_progress([(claim, {"done": 2})])

    assert await stored_progress(app, claim) == {"done": 2}


async def test_a_stale_runs_progress_changes_nothing(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    first = await claim_next(app)
    await app.execution.record_progress([(first, "first")])
    await app.execution.hand_back(first, "shutting down")
    second = await claim_next(app, "w2")

    written = await app.execution.record_progress([(first, "stale"), (second, "fresh")])

    assert written == {second.task.id}
    assert await stored_progress(app, second) == "fresh"
    await app.execution.record_progress([(first, "stale again")])
    assert await stored_progress(app, second) == "fresh"


async def test_progress_of_a_batch_goes_to_its_own_tasks(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    a, b = await claim_next(app), await claim_next(app)

    await app.execution.record_progress([(a, "A"), (b, ["B"])])

    assert (await stored_progress(app, a), await stored_progress(app, b)) == ("A", ["B"])


async def test_a_progress_write_leaves_the_version_so_the_claimed_success_stays_cheap(
    app: App,
) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await claim_next(app)
    await app.execution.record_progress([(claim, 5)])
    retries = app.store.retries

    outcomes = await app.execution.complete_many([claim], [None], progress={claim.task.id: 6})

    assert outcomes == [ReportOutcome.RECORDED]
    assert app.store.retries == retries
    assert await stored_progress(app, claim) == 6


# --- the final flush --------------------------------------------------------------------------


async def test_success_writes_the_last_progress_in_its_transaction(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await claim_next(app)

    await app.execution.complete_many([claim], ["ok"], progress={claim.task.id: "100%"})

    view = await app.queries.get_task(claim.task.id)
    assert (view.task.status, view.task.progress) == (TaskStatus.COMPLETED, "100%")


async def test_a_stale_success_does_not_write_its_progress(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    first = await claim_next(app)
    await app.execution.hand_back(first, "shutting down")
    second = await claim_next(app, "w2")
    await app.execution.record_progress([(second, "second")])

    outcomes = await app.execution.complete_many([first], [None], progress={first.task.id: "x"})

    assert outcomes == [ReportOutcome.STALE]
    assert await stored_progress(app, second) == "second"


async def test_a_hand_back_flushes_the_progress_and_the_next_attempt_sees_the_checkpoint(
    app: App,
) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    first = await claim_next(app)
    assert first.task.progress is None

    await app.execution.hand_back(first, "shutting down", progress={first.task.id: {"i": 7}})
    second = await claim_next(app, "w2")

    assert second.task.progress == {"i": 7}


async def test_a_reclaimed_tasks_next_attempt_sees_the_checkpoint(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    dead = await claim_next(app)
    await app.execution.record_progress([(dead, {"chunk": 41})])
    await app.queue.delete_leases([(dead.task.id, dead.run.id)])  # the worker died
    app.clock.advance(POLICY.stale_running_after + 1)
    assert await app.reconcile.reclaim_stale() == 1

    successor = await claim_next(app, "w2")

    assert successor.run.id != dead.run.id
    assert successor.task.progress == {"chunk": 41}


async def test_a_retry_after_a_failure_sees_the_checkpoint(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    first = await claim_next(app)

    failed = await app.execution.fail(first, "boom", progress={first.task.id: 3})
    assert failed.retry_at is not None
    app.clock.advance(POLICY.retry_backoff + 1)
    await enqueue_one(app.queue, first.task.id, "default")  # what the promoter does when due
    retry = await claim_next(app, "w2")

    assert retry.task.progress == 3
