"""Bulk cancel and retry by filter on the memory adapters (issue 14 item 6): the filters, the
dry run, the at-least-one-filter rule, the keyset walk over several pages while statuses
change, the fence that skips (and counts) a task changed between its page's read and its
transaction, and the background operation's progress record."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID, uuid4

import pytest

from dtq.application.bulk import (
    BulkAction,
    BulkOutcome,
    BulkService,
    OperationStatus,
    require_criterion,
)
from dtq.application.commands import TaskSpec
from dtq.application.control import ControlService
from dtq.application.filters import TaskFilter
from dtq.application.ports import Store, Transaction
from dtq.domain.errors import (
    BackendUnavailable,
    OperationNotFound,
    TooManyOperations,
    ValidationError,
)
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from tests.single import complete_one
from tests.unit.conftest import App

T = TypeVar("T")

FAILED = TaskFilter(statuses=frozenset({TaskStatus.FAILED}))
QUEUED = TaskFilter(statuses=frozenset({TaskStatus.QUEUED}))


def bulk(app: App, *, batch_size: int = 500, store: Store | None = None) -> BulkService:
    store = store or app.store
    control = ControlService(store=store, queue=app.queue, batch_size=batch_size)
    return BulkService(store=store, control=control, clock=app.clock, batch_size=batch_size)


async def failed_tasks(app: App, count: int, kind: str = "echo") -> list[UUID]:
    """``count`` single-task jobs of ``kind``, each failed for good (one run each)."""
    ids: list[UUID] = []
    for _ in range(count):
        result = await app.submit_tasks(TaskSpec("a", kind, max_attempts=1))
        [claim] = await app.execution.claim_many([result.task_ids["a"]], "w1")
        await app.execution.fail(claim, "boom", permanent=True)
        ids.append(result.task_ids["a"])
    return ids


async def statuses(app: App, ids: list[UUID]) -> list[TaskStatus]:
    return [(await app.queries.get_task(i)).task.status for i in ids]


class AfterFirstRead:
    """A store that runs ``change`` once, right after the first transaction (the first page's
    read) has committed: a concurrent change between a page's read and its write."""

    def __init__(self, inner: Store, change: Callable[[], Awaitable[None]]) -> None:
        self._inner = inner
        self._change: Callable[[], Awaitable[None]] | None = change

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        result = await self._inner.run(fn)
        change, self._change = self._change, None
        if change is not None:
            await change()
        return result

    async def ping(self) -> None:
        await self._inner.ping()


async def test_bulk_retry_retries_every_failed_task_once_over_several_pages(app: App) -> None:
    ids = await failed_tasks(app, 7)

    outcome = await bulk(app, batch_size=3).run(BulkAction.RETRY, FAILED)

    assert outcome == BulkOutcome(matched=7, changed=7, skipped=0, cascaded=0)
    assert await statuses(app, ids) == [TaskStatus.QUEUED] * 7
    for task_id in ids:  # a fresh budget each, retried once: the old run kept, no new one yet
        view = await app.queries.get_task(task_id)
        assert view.task.attempt == 0
        assert [run.status for run in view.runs] == [RunStatus.FAILED]
    assert await bulk(app).run(BulkAction.RETRY, FAILED) == BulkOutcome()  # nothing left


async def test_dry_run_counts_and_changes_nothing(app: App) -> None:
    ids = await failed_tasks(app, 4)

    outcome = await bulk(app, batch_size=3).run(BulkAction.RETRY, FAILED, dry_run=True)

    assert outcome == BulkOutcome(matched=4, dry_run=True)
    assert await statuses(app, ids) == [TaskStatus.FAILED] * 4


async def test_each_filter_narrows_the_bulk_cancel(app: App) -> None:
    echo = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", priority="high"))
    other = await app.submit_tasks(TaskSpec("a", "resize"))
    service = bulk(app)

    by_kind = await service.run(BulkAction.CANCEL, TaskFilter(kind="resize"), dry_run=True)
    by_priority = await service.run(BulkAction.CANCEL, TaskFilter(priority="high"), dry_run=True)
    by_job = await service.run(BulkAction.CANCEL, TaskFilter(job_id=echo.job_id))

    assert (by_kind.matched, by_priority.matched) == (1, 1)
    assert by_job == BulkOutcome(matched=2, changed=2)
    assert await statuses(app, list(echo.task_ids.values())) == [TaskStatus.CANCELLED] * 2
    assert await statuses(app, [other.task_ids["a"]]) == [TaskStatus.QUEUED]
    assert (await app.queries.get_job(echo.job_id)).job.status is JobStatus.CANCELLED


async def test_a_task_completed_between_its_pages_read_and_write_is_skipped_and_counted(
    app: App,
) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    a, b = result.task_ids["a"], result.task_ids["b"]
    [claim] = await app.execution.claim_many([a], "w1")

    async def complete_a() -> None:
        await complete_one(app.execution, claim)

    where = TaskFilter(statuses=frozenset({TaskStatus.QUEUED, TaskStatus.RUNNING}))
    store = AfterFirstRead(app.store, complete_a)
    outcome = await bulk(app, store=store).run(BulkAction.CANCEL, where)

    assert outcome == BulkOutcome(matched=2, changed=1, skipped=1)
    assert await statuses(app, [a, b]) == [TaskStatus.COMPLETED, TaskStatus.CANCELLED]
    [run] = (await app.queries.get_task(a)).runs
    assert run.status is RunStatus.SUCCEEDED  # the success committed first and stays


async def test_retry_walks_dependents_reopened_by_an_earlier_retry_without_retrying_twice(
    app: App,
) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=1), TaskSpec("b", "echo", depends_on=("a",))
    )
    a, b = result.task_ids["a"], result.task_ids["b"]
    [claim] = await app.execution.claim_many([a], "w1")
    await app.execution.fail(claim, "boom", permanent=True)  # b failed by the cascade
    assert await statuses(app, [a, b]) == [TaskStatus.FAILED] * 2

    outcome = await bulk(app).run(BulkAction.RETRY, FAILED)

    # one page, oldest first: a is retried and reopens b, which then counts as changed (and
    # not as cascaded too: cascaded counts the other tasks changed with them)
    assert outcome == BulkOutcome(matched=2, changed=2, skipped=0, cascaded=0)
    assert await statuses(app, [a, b]) == [TaskStatus.QUEUED, TaskStatus.PENDING]
    assert (await app.queries.get_job(result.job_id)).job.status is not JobStatus.FAILED


def test_a_filter_without_any_criterion_is_refused_naming_the_body() -> None:
    with pytest.raises(ValidationError) as refused:
        require_criterion(TaskFilter())
    assert refused.value.field == "body"


async def test_run_and_start_refuse_an_empty_filter(app: App) -> None:
    service = bulk(app)
    for call in (
        service.run(BulkAction.RETRY, TaskFilter()),
        service.start(BulkAction.CANCEL, TaskFilter()),
    ):
        with pytest.raises(ValidationError):
            await call


async def test_a_background_operation_reports_its_progress_and_end(app: App) -> None:
    await failed_tasks(app, 5)
    service = bulk(app, batch_size=2)

    started = await service.start(BulkAction.RETRY, FAILED)
    assert (started.status, started.matched, started.kind) == (
        OperationStatus.RUNNING,
        0,
        BulkAction.RETRY,
    )
    done = await service.wait(started.id)

    assert done.status is OperationStatus.SUCCEEDED and done.error is None
    assert (done.matched, done.changed, done.skipped) == (5, 5, 0)
    assert done.finished_at is not None
    assert await service.get(started.id) == done


async def test_a_background_operation_that_meets_an_outage_ends_failed_with_its_error(
    app: App,
) -> None:
    await failed_tasks(app, 1)

    class Down:
        async def run(self, fn: Any) -> Any:
            raise BackendUnavailable("database unavailable")

        async def ping(self) -> None:
            raise BackendUnavailable("database unavailable")

    service = bulk(app, store=Down())
    done = await service.wait((await service.start(BulkAction.CANCEL, QUEUED)).id)

    assert done.status is OperationStatus.FAILED
    assert done.error == "database unavailable"


async def test_an_unknown_operation_is_not_found(app: App) -> None:
    with pytest.raises(OperationNotFound) as refused:
        await bulk(app).get(uuid4())
    assert refused.value.field == "id"


async def test_aclose_stops_a_running_operation_and_records_it_failed(app: App) -> None:
    ids = await failed_tasks(app, 3)
    gate: list[int] = []

    class Slow:
        def __init__(self, inner: Store) -> None:
            self._inner = inner

        async def run(self, fn: Any) -> Any:
            gate.append(1)
            await asyncio.sleep(3600)
            return await self._inner.run(fn)

        async def ping(self) -> None:
            await self._inner.ping()

    service = bulk(app, store=Slow(app.store))
    started = await service.start(BulkAction.RETRY, FAILED)
    while not gate:
        await asyncio.sleep(0)
    await service.aclose()

    stopped = await service.get(started.id)
    assert stopped.status is OperationStatus.FAILED
    assert stopped.error == "stopped at shutdown"
    assert await statuses(app, ids) == [TaskStatus.FAILED] * 3


async def test_finished_operations_beyond_the_limit_are_forgotten_oldest_first(app: App) -> None:
    control = ControlService(store=app.store, queue=app.queue)
    service = BulkService(store=app.store, control=control, clock=app.clock, keep_finished=2)
    ops = []
    for _ in range(3):
        op = await service.start(BulkAction.CANCEL, QUEUED)
        await service.wait(op.id)
        ops.append(op)

    with pytest.raises(OperationNotFound):
        await service.get(ops[0].id)
    assert [(await service.get(op.id)).status for op in ops[1:]] == [OperationStatus.SUCCEEDED] * 2


async def test_a_start_beyond_max_running_is_refused_until_one_ends(app: App) -> None:
    await failed_tasks(app, 1)
    release = asyncio.Event()

    class Held:
        async def run(self, fn: Any) -> Any:
            await release.wait()
            return await app.store.run(fn)

        async def ping(self) -> None:
            await app.store.ping()

    control = ControlService(store=Held(), queue=app.queue)
    service = BulkService(store=Held(), control=control, clock=app.clock, max_running=1)
    first = await service.start(BulkAction.RETRY, FAILED)

    with pytest.raises(TooManyOperations) as refused:
        await service.start(BulkAction.CANCEL, QUEUED)
    release.set()
    assert (await service.wait(first.id)).status is OperationStatus.SUCCEEDED
    again = await service.start(BulkAction.CANCEL, QUEUED)

    assert refused.value.code == "too_many_operations"
    assert (await service.wait(again.id)).status is OperationStatus.SUCCEEDED
