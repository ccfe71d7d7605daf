"""Delayed submit (issue 14 item 2): ``run_at``/``delay`` on the memory adapters, fake clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dtq.application.commands import TaskSpec
from dtq.domain.errors import ValidationError
from dtq.domain.status import TaskStatus
from tests.single import claim_one, complete_one, pop_one
from tests.unit.conftest import App


async def test_a_delayed_root_waits_on_the_scheduled_set_until_due(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo", delay=timedelta(seconds=30)))
    task_id = result.task_ids["a"]
    task = (await app.queries.get_task(task_id)).task
    assert task.status is TaskStatus.QUEUED
    assert task.scheduled_at == app.clock.now() + timedelta(seconds=30)
    assert app.queue.ready_ids("default") == []
    assert app.queue.scheduled_ids() == [task_id]
    app.clock.advance(29.9)
    assert await app.reconcile.promote_scheduled() == 0
    app.clock.advance(0.1)
    assert await app.reconcile.promote_scheduled() == 1
    assert app.queue.ready_ids("default") == [task_id]
    assert await claim_one(app.execution, task_id, "w1") is not None


async def test_run_at_in_the_future_is_its_due_time_and_a_past_one_runs_now(app: App) -> None:
    later = app.clock.now() + timedelta(minutes=5)
    result = await app.submit_tasks(
        TaskSpec("a", "echo", run_at=later),
        TaskSpec("b", "echo", run_at=app.clock.now() - timedelta(hours=1)),
    )
    a, b = result.task_ids["a"], result.task_ids["b"]
    assert (await app.queries.get_task(a)).task.scheduled_at == later
    assert (await app.queries.get_task(b)).task.scheduled_at == app.clock.now()
    assert app.queue.ready_ids("default") == [b]
    assert app.queue.scheduled_ids() == [a]


async def test_a_delayed_dependent_waits_for_its_dependency_and_its_time(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",), delay=timedelta(seconds=60))
    )
    a, b = result.task_ids["a"], result.task_ids["b"]
    due = (await app.queries.get_task(b)).task.scheduled_at
    app.clock.advance(10)
    popped = await pop_one(app.queue, ["default"], timeout=0)
    assert popped == a
    claim = await claim_one(app.execution, a, "w1")
    assert claim is not None
    await complete_one(app.execution, claim)
    task_b = (await app.queries.get_task(b)).task
    assert task_b.status is TaskStatus.QUEUED and task_b.scheduled_at == due
    assert app.queue.ready_ids("default") == []  # not pushed: its time has not come
    assert app.queue.scheduled_ids() == [b]
    app.clock.advance((due - app.clock.now()).total_seconds())
    assert await app.reconcile.promote_scheduled() == 1
    assert app.queue.ready_ids("default") == [b]


async def test_a_dependent_whose_delay_has_passed_is_pushed_at_promotion(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo", depends_on=("a",), delay=timedelta(seconds=5)),
    )
    app.clock.advance(6)
    assert await pop_one(app.queue, ["default"], timeout=0) == result.task_ids["a"]
    claim = await claim_one(app.execution, result.task_ids["a"], "w1")
    assert claim is not None
    await complete_one(app.execution, claim)
    assert app.queue.ready_ids("default") == [result.task_ids["b"]]
    assert app.queue.scheduled_ids() == []


async def test_run_at_and_delay_together_are_refused(app: App) -> None:
    with pytest.raises(ValidationError) as err:
        await app.submit_tasks(
            TaskSpec("a", "echo", run_at=app.clock.now(), delay=timedelta(seconds=1))
        )
    assert err.value.field == "tasks[0].delay"
    assert app.store._tables.jobs == {}


async def test_a_replayed_success_that_landed_schedules_the_delayed_dependent(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",), delay=timedelta(minutes=1))
    )
    assert await pop_one(app.queue, ["default"], timeout=0) == result.task_ids["a"]
    claim = await claim_one(app.execution, result.task_ids["a"], "w1")
    assert claim is not None
    app.store.inject_ambiguous_commits(1)
    await complete_one(app.execution, claim)
    assert app.queue.scheduled_ids() == [result.task_ids["b"]]
    assert app.queue.ready_ids("default") == []
