"""The task and run state machine (DESIGN §2; spec §4 attempt invariant, §6 semantics)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from dtq.domain.entities import WORKER_LOST, Job, Task, TaskRun
from dtq.domain.errors import InvalidTransition, NotCancellable, StaleRun, TaskNotClaimable
from dtq.domain.status import (
    MANUAL_RETRY_EXITS,
    TASK_TRANSITIONS,
    JobStatus,
    RunStatus,
    TaskStatus,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BACKOFF = timedelta(seconds=5)


def make_task(status: TaskStatus = TaskStatus.QUEUED, **kw: object) -> Task:
    fields: dict[str, object] = {
        "id": uuid4(),
        "job_id": uuid4(),
        "name": "t",
        "kind": "echo",
        "payload": {"n": 1},
        "status": status,
        "scheduled_at": T0,
        "created_at": T0,
        "updated_at": T0,
    }
    fields.update(kw)
    return Task(**fields)  # type: ignore[arg-type]


def claimed(task: Task, at: datetime = T0) -> TaskRun:
    return task.claim(run_id=uuid4(), worker_id="w1", at=at)


# --- claim -----------------------------------------------------------------------------------


def test_claim_moves_queued_to_running_and_counts_an_attempt() -> None:
    task = make_task()
    run = claimed(task)
    assert task.status is TaskStatus.RUNNING
    assert task.attempt == 1
    assert run.attempt_number == 1
    assert run.status is RunStatus.RUNNING
    assert task.current_run_id == run.id
    assert task.started_at == T0


@pytest.mark.parametrize(
    "status", [s for s in TaskStatus if s is not TaskStatus.QUEUED], ids=lambda s: s.value
)
def test_claim_refuses_a_task_that_is_not_queued(status: TaskStatus) -> None:
    task = make_task(status)
    with pytest.raises(TaskNotClaimable):
        claimed(task)
    assert task.status is status
    assert task.attempt == 0


def test_claim_refuses_a_task_not_yet_due_and_says_when_it_is() -> None:
    due = T0 + timedelta(seconds=10)
    task = make_task(scheduled_at=due)
    with pytest.raises(TaskNotClaimable) as refused:
        claimed(task, at=T0)
    assert refused.value.not_before == due
    assert refused.value.priority == "default"
    assert task.status is TaskStatus.QUEUED


def test_second_claim_of_one_task_loses_cleanly() -> None:
    task = make_task()
    first = claimed(task)
    with pytest.raises(TaskNotClaimable):
        claimed(task)
    assert task.current_run_id == first.id
    assert task.attempt == 1


def test_claim_refuses_when_no_attempts_are_left() -> None:
    task = make_task(attempt=3, max_attempts=3)
    with pytest.raises(TaskNotClaimable):
        claimed(task)


# --- success ---------------------------------------------------------------------------------


def test_success_completes_task_and_run() -> None:
    task = make_task()
    run = claimed(task)
    assert task.succeed(run, at=T0 + timedelta(seconds=1)) is True
    assert task.status is TaskStatus.COMPLETED
    assert run.status is RunStatus.SUCCEEDED
    assert run.finished_at == task.finished_at == T0 + timedelta(seconds=1)
    assert task.current_run_id is None


def test_same_success_recorded_twice_is_a_noop() -> None:
    task = make_task()
    run = claimed(task)
    task.succeed(run, at=T0)
    assert task.succeed(run, at=T0 + timedelta(seconds=9)) is False
    assert task.finished_at == T0


def test_report_from_a_dead_run_is_refused_and_changes_nothing() -> None:
    task = make_task()
    run = claimed(task)
    task.reclaim(run, reason="lease expired", max_reclaims=5, at=T0)
    successor = claimed(task, at=T0 + timedelta(seconds=1))
    with pytest.raises(StaleRun):
        task.succeed(run, at=T0 + timedelta(seconds=2))
    with pytest.raises(StaleRun):
        task.fail(run, error="late", permanent=False, backoff=BACKOFF, at=T0)
    assert task.status is TaskStatus.RUNNING
    assert task.current_run_id == successor.id
    assert run.status is RunStatus.DEAD


# --- failure ---------------------------------------------------------------------------------


def test_failure_with_attempts_left_requeues_after_backoff() -> None:
    task = make_task(max_attempts=3)
    run = claimed(task)
    at = T0 + timedelta(seconds=1)
    decision = task.fail(run, error="boom", permanent=False, backoff=BACKOFF, at=at)
    assert decision is not None and decision.retry
    assert task.status is TaskStatus.QUEUED
    assert task.scheduled_at == at + BACKOFF
    assert task.last_error == "boom"
    assert run.status is RunStatus.FAILED
    assert run.error == "boom"


def test_failure_of_the_last_attempt_fails_the_task() -> None:
    task = make_task(max_attempts=2)
    for i in range(2):
        at = T0 + timedelta(minutes=i)
        run = claimed(task, at=at)
        decision = task.fail(run, error=f"e{i}", permanent=False, backoff=timedelta(0), at=at)
    assert decision is not None and not decision.retry
    assert task.status is TaskStatus.FAILED
    assert task.attempt == 2
    assert task.last_error == "e1"


def test_permanent_error_skips_the_remaining_attempts() -> None:
    task = make_task(max_attempts=5)
    run = claimed(task)
    decision = task.fail(run, error="unknown kind", permanent=True, backoff=BACKOFF, at=T0)
    assert decision is not None and not decision.retry
    assert task.status is TaskStatus.FAILED
    assert task.attempt == 1


def test_same_failure_recorded_twice_is_a_noop() -> None:
    task = make_task()
    run = claimed(task)
    task.fail(run, error="boom", permanent=False, backoff=BACKOFF, at=T0)
    assert task.fail(run, error="boom", permanent=False, backoff=BACKOFF, at=T0) is None


# --- reclaim ---------------------------------------------------------------------------------


def test_reclaim_kills_the_run_and_rolls_the_attempt_back() -> None:
    task = make_task()
    run = claimed(task)
    at = T0 + timedelta(minutes=2)
    assert task.reclaim(run, reason="lease expired", max_reclaims=5, at=at) is True
    assert run.status is RunStatus.DEAD
    assert run.error == "lease expired"
    assert task.status is TaskStatus.QUEUED
    assert task.attempt == 0
    assert task.scheduled_at == at
    assert task.reclaims == 1


def test_dead_run_and_its_successor_share_an_attempt_number() -> None:
    task = make_task()
    dead = claimed(task)
    task.reclaim(dead, reason="lease expired", max_reclaims=5, at=T0 + timedelta(seconds=1))
    successor = claimed(task, at=T0 + timedelta(seconds=2))
    assert dead.attempt_number == successor.attempt_number == 1
    assert dead.id != successor.id
    assert [dead.status, successor.status] == [RunStatus.DEAD, RunStatus.RUNNING]


def test_crash_budget_fails_a_task_whose_worker_keeps_dying() -> None:
    task = make_task(max_attempts=3)
    outcomes = []
    for i in range(3):
        at = T0 + timedelta(minutes=i)
        run = claimed(task, at=at)
        outcomes.append(task.reclaim(run, reason="lease expired", max_reclaims=2, at=at))
    assert outcomes == [True, True, False]
    assert task.status is TaskStatus.FAILED
    assert task.last_error is not None and task.last_error.startswith(WORKER_LOST)


def test_hand_back_does_not_charge_the_crash_budget() -> None:
    task = make_task()
    run = claimed(task)
    task.reclaim(run, reason="shutdown", max_reclaims=0, at=T0, worker_lost=False)
    assert task.status is TaskStatus.QUEUED
    assert task.reclaims == 0
    assert task.attempt == 0


def test_reclaim_of_an_ended_run_is_refused() -> None:
    task = make_task()
    run = claimed(task)
    task.succeed(run, at=T0)
    with pytest.raises(StaleRun):
        task.reclaim(run, reason="lease expired", max_reclaims=5, at=T0)
    assert task.status is TaskStatus.COMPLETED


# --- promotion, cascade, cancel ---------------------------------------------------------------


def test_promote_queues_a_pending_task_due_now() -> None:
    task = make_task(TaskStatus.PENDING, scheduled_at=T0 - timedelta(days=1))
    task.promote(at=T0)
    assert task.status is TaskStatus.QUEUED
    assert task.scheduled_at == T0


def test_promote_refuses_a_task_that_is_not_pending() -> None:
    task = make_task(TaskStatus.QUEUED)
    with pytest.raises(InvalidTransition):
        task.promote(at=T0)


def test_cascade_fail_names_the_failed_dependency() -> None:
    task = make_task(TaskStatus.PENDING)
    task.cascade_fail(failed_dependency="extract", at=T0)
    assert task.status is TaskStatus.FAILED
    assert task.last_error == "dependency 'extract' failed"


@pytest.mark.parametrize("status", [TaskStatus.PENDING, TaskStatus.QUEUED])
def test_cancel_before_start(status: TaskStatus) -> None:
    task = make_task(status)
    task.cancel(at=T0)
    assert task.status is TaskStatus.CANCELLED


@pytest.mark.parametrize("status", [TaskStatus.COMPLETED, TaskStatus.FAILED])
def test_cancel_after_the_end_is_refused_as_not_cancellable(status: TaskStatus) -> None:
    task = make_task(status)
    with pytest.raises(NotCancellable):
        task.cancel(at=T0)
    assert task.status is status


def test_cancel_of_a_running_task_needs_its_live_run() -> None:
    task = make_task()
    run = claimed(task)
    with pytest.raises(StaleRun):
        task.cancel(at=T0)
    other = TaskRun(uuid4(), task.id, 1, "w2", RunStatus.RUNNING, T0)
    with pytest.raises(StaleRun):
        task.cancel(at=T0, run=other)
    assert task.status is TaskStatus.RUNNING
    assert run.status is RunStatus.RUNNING


def test_terminal_statuses_leave_only_through_a_manual_retry() -> None:
    for status in TaskStatus:
        if status is TaskStatus.COMPLETED:
            assert not TASK_TRANSITIONS[status]
        elif status.terminal:
            assert TASK_TRANSITIONS[status] == MANUAL_RETRY_EXITS
        else:
            assert TASK_TRANSITIONS[status]


def test_domain_methods_never_touch_the_version() -> None:
    task = make_task(version=7)
    run = claimed(task)
    task.fail(run, error="x", permanent=False, backoff=BACKOFF, at=T0)
    assert task.version == 7


# --- job -------------------------------------------------------------------------------------


def test_job_status_change_reports_whether_a_write_is_needed() -> None:
    job = Job(id=UUID(int=1), name="j", status=JobStatus.PENDING, created_at=T0, updated_at=T0)
    assert job.set_status(JobStatus.RUNNING, at=T0) is True
    assert job.set_status(JobStatus.RUNNING, at=T0) is False
    assert job.set_status(JobStatus.FAILED, at=T0) is True
    assert job.set_status(JobStatus.COMPLETED, at=T0) is False
    assert job.status is JobStatus.FAILED


def test_copy_of_a_task_and_its_run_is_shallow_and_independent() -> None:
    """``copy.copy`` (``__copy__``) gives every field, ``transitions`` too, by reference."""
    task = make_task(payload={"n": [1]}, result=None)
    run = claimed(task)
    task_copy, run_copy = copy.copy(task), copy.copy(run)
    assert task_copy is not task and run_copy is not run
    assert task_copy == task and run_copy == run
    assert task_copy.transitions == task.transitions != ()  # compare=False: checked apart
    assert task_copy.payload is task.payload  # shallow
    assert task_copy.succeed(run_copy, at=T0 + timedelta(seconds=1), result=7)
    assert (task.status, task.result, run.status) == (TaskStatus.RUNNING, None, RunStatus.RUNNING)
