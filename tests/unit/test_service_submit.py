"""Submitting jobs (spec §4 one transaction, §7; DESIGN §2 DAG rules, §3 Redis after commit)."""

from __future__ import annotations

import pytest

from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.submit import REWRITES_AFTER_UNKNOWN
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    DependencyCycle,
    IdempotencyConflict,
    InvalidPayload,
    UnknownDependency,
    ValidationError,
)
from dtq.domain.status import JobStatus, TaskStatus
from tests.unit.conftest import App


async def test_roots_are_queued_and_pushed_dependents_wait_pending(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", {"n": 1}), TaskSpec("b", "echo", {"n": 2}, depends_on=("a",))
    )
    view = await app.queries.get_job(result.job_id)
    status = {t.name: t.status for t in view.tasks}
    assert status == {"a": TaskStatus.QUEUED, "b": TaskStatus.PENDING}
    assert view.job.status is JobStatus.PENDING
    assert app.queue.ready_ids("default") == [result.task_ids["a"]]
    assert app.queue.has_marker(result.task_ids["a"])


async def test_priority_picks_the_ready_list(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo", priority="high"))
    assert app.queue.ready_ids("high") == [result.task_ids["a"]]
    assert app.queue.ready_ids("default") == []


async def test_invalid_dag_writes_nothing_and_pushes_nothing(app: App) -> None:
    with pytest.raises(DependencyCycle):
        await app.submit_tasks(
            TaskSpec("a", "echo", depends_on=("b",)), TaskSpec("b", "echo", depends_on=("a",))
        )
    with pytest.raises(UnknownDependency):
        await app.submit_tasks(TaskSpec("a", "echo", depends_on=("nope",)))
    assert app.store._tables.jobs == {}
    assert app.queue.ready_ids("default") == []


async def test_unstorable_payload_is_refused_before_the_transaction(app: App) -> None:
    with pytest.raises(InvalidPayload) as err:
        await app.submit_tasks(TaskSpec("a", "echo", {"x": "bad\x00"}))
    assert err.value.field == "tasks[0].payload.x"
    assert app.store._tables.tasks == {}


@pytest.mark.parametrize(
    "cmd",
    [SubmitJob(tasks=()), SubmitJob(tasks=(TaskSpec("a", "echo", max_attempts=0),))],
    ids=["no-tasks", "zero-attempts"],
)
async def test_malformed_jobs_are_refused(app: App, cmd: SubmitJob) -> None:
    with pytest.raises(ValidationError):
        await app.submit.submit_job(cmd)


async def test_idempotent_replay_returns_the_original_ids_and_writes_nothing(app: App) -> None:
    spec = TaskSpec("a", "echo", {"n": 1})
    first = await app.submit_tasks(spec, idempotency_key="k1", request_hash="h1")
    again = await app.submit_tasks(spec, idempotency_key="k1", request_hash="h1")
    assert first.created and not again.created
    assert (again.job_id, again.task_ids) == (first.job_id, first.task_ids)
    assert len(app.store._tables.jobs) == 1
    assert app.queue.ready_ids("default") == [first.task_ids["a"]]


async def test_same_key_with_another_body_is_a_conflict(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"), idempotency_key="k1", request_hash="h1")
    with pytest.raises(IdempotencyConflict):
        await app.submit_tasks(TaskSpec("a", "echo"), idempotency_key="k1", request_hash="h2")


async def test_a_conflict_reruns_the_whole_submit_and_pushes_once(app: App) -> None:
    app.store.inject_conflicts(2)
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    assert app.store.retries == 2
    assert len(app.store._tables.jobs) == 1
    assert app.queue.ready_ids("default") == [result.task_ids["a"]]


async def test_ambiguous_commit_of_a_submit_is_recovered_by_reading_back(app: App) -> None:
    app.store.inject_ambiguous_commits(1)
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    assert result.created
    assert len(app.store._tables.jobs) == 1
    assert app.queue.ready_ids("default") == [result.task_ids["a"]]


@pytest.mark.parametrize("key", [None, "key-1"])
async def test_a_submit_whose_commit_was_lost_is_written_again_with_its_ids(
    app: App, key: str | None
) -> None:
    """The COMMIT's outcome unknown and the job absent when read back (the connection was
    lost before the database took the COMMIT): written again, once, under the same ids."""
    app.store.inject_lost_commits(1)
    result = await app.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "echo"),), idempotency_key=key)
    )
    assert result.created
    assert list(app.store._tables.jobs) == [result.job_id]
    assert app.queue.ready_ids("default") == [result.task_ids["a"]]


async def test_a_submit_still_absent_after_its_rewrites_asks_to_be_sent_again(app: App) -> None:
    app.store.inject_lost_commits(1 + REWRITES_AFTER_UNKNOWN)
    with pytest.raises(CommitOutcomeUnknown, match="submit it again"):
        await app.submit_tasks(TaskSpec("a", "echo"))
    assert app.store._tables.jobs == {}
    assert app.queue.ready_ids("default") == []


async def test_store_down_means_nothing_is_pushed(app: App) -> None:
    app.store.available = False
    with pytest.raises(BackendUnavailable):
        await app.submit_tasks(TaskSpec("a", "echo"))
    assert app.queue.ready_ids("default") == []


async def test_redis_down_after_the_commit_still_creates_the_job(app: App) -> None:
    async def refuse(items: object, *, carried: object = ()) -> int:
        raise BackendUnavailable("redis enqueue failed")

    app.queue.enqueue_many = refuse  # type: ignore[method-assign]
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    assert result.created
    assert (await app.queries.get_task(result.task_ids["a"])).task.status is TaskStatus.QUEUED
    assert app.queue.ready_ids("default") == []
    del app.queue.enqueue_many  # Redis is back: the reconciler pushes the committed task
    assert await app.reconcile.enqueue_due() == 1
    assert app.queue.ready_ids("default") == [result.task_ids["a"]]
