"""The cancel and manual-retry transitions of the entities (issue 14 items 1 and 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from dtq.domain.entities import CANCELLED_ERROR, Job
from dtq.domain.errors import InvalidTransition, NotRetryable
from dtq.domain.status import RUN_TRANSITIONS, JobStatus, RunStatus, TaskStatus
from tests.unit.test_domain_task import claimed, make_task

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)


def test_cancel_of_a_running_task_ends_its_run_cancelled() -> None:
    task = make_task()
    run = claimed(task)

    assert task.cancel(at=LATER, run=run) is True

    assert (task.status, task.current_run_id, task.finished_at) == (
        TaskStatus.CANCELLED,
        None,
        LATER,
    )
    assert (run.status, run.error, run.finished_at) == (RunStatus.CANCELLED, CANCELLED_ERROR, LATER)
    assert task.attempt == 1  # the cancelled run consumed its attempt; a retry resets it


def test_a_cancelled_run_ends_once() -> None:
    assert RUN_TRANSITIONS[RunStatus.CANCELLED] == frozenset()
    assert RunStatus.CANCELLED in RUN_TRANSITIONS[RunStatus.RUNNING]


def test_cancel_of_a_cancelled_task_is_a_no_op() -> None:
    task = make_task(TaskStatus.CANCELLED, finished_at=T0)
    assert task.cancel(at=LATER) is False
    assert (task.finished_at, task.updated_at) == (T0, T0)


def test_cascade_cancel_moves_only_a_pending_task() -> None:
    task = make_task(TaskStatus.PENDING)
    task.cascade_cancel(cancelled_dependency="a", at=LATER)
    assert (task.status, task.last_error) == (TaskStatus.CANCELLED, "dependency 'a' cancelled")
    with pytest.raises(InvalidTransition):
        make_task(TaskStatus.QUEUED).cascade_cancel(cancelled_dependency="a", at=LATER)


@pytest.mark.parametrize("status", [TaskStatus.FAILED, TaskStatus.CANCELLED])
@pytest.mark.parametrize(
    ("completed", "target"), [(True, TaskStatus.QUEUED), (False, TaskStatus.PENDING)]
)
def test_retry_restarts_the_attempt_budget(
    status: TaskStatus, completed: bool, target: TaskStatus
) -> None:
    task = make_task(
        status, attempt=3, reclaims=2, finished_at=T0, last_error="boom", progress={"at": 7}
    )

    task.retry(at=LATER, dependencies_completed=completed)

    assert (task.status, task.attempt, task.reclaims) == (target, 0, 0)
    assert (task.scheduled_at, task.updated_at, task.finished_at) == (LATER, LATER, None)
    assert task.progress == {"at": 7}  # the checkpoint survives, as after any retry
    assert not task.due_later


@pytest.mark.parametrize(
    "status", [TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.COMPLETED]
)
def test_retry_of_any_other_status_is_not_retryable(status: TaskStatus) -> None:
    task = make_task(status)
    with pytest.raises(NotRetryable):
        task.retry(at=LATER, dependencies_completed=True)
    assert task.status is status


def test_a_retried_task_is_claimed_as_attempt_one_again() -> None:
    task = make_task(max_attempts=1)
    first = claimed(task)
    task.fail(first, error="x", permanent=False, backoff=timedelta(0), at=T0)
    assert task.status is TaskStatus.FAILED

    task.retry(at=LATER, dependencies_completed=True)
    second = claimed(task, at=LATER)

    assert first.attempt_number == second.attempt_number == 1
    assert first.id != second.id


def test_ended_while_pending_tells_a_cascade_victim_from_a_task_that_ran() -> None:
    victim = make_task(TaskStatus.PENDING)
    victim.cascade_fail(failed_dependency="a", at=T0)
    ran = make_task(max_attempts=1)
    ran.fail(claimed(ran), error="x", permanent=True, backoff=timedelta(0), at=T0)

    assert victim.ended_while_pending
    assert not ran.ended_while_pending
    assert not make_task(TaskStatus.PENDING).ended_while_pending


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELLED])
def test_job_reopen_leaves_a_terminal_status_set_status_does_not(status: JobStatus) -> None:
    job = Job(id=uuid4(), name="j", status=status, created_at=T0, updated_at=T0)
    if status is JobStatus.FAILED:
        assert job.set_status(JobStatus.RUNNING, at=LATER) is False
    assert job.reopen(JobStatus.RUNNING, at=LATER) is True
    assert (job.status, job.updated_at) == (JobStatus.RUNNING, LATER)
    assert job.reopen(JobStatus.RUNNING, at=LATER) is False
