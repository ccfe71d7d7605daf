"""The listing's query service on the memory adapters (issue 14 item 5): page boundaries,
``matching_task_ids`` batches as a bulk operation walks them, and the filters' own checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from uuid import UUID

import pytest

from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.filters import MAX_LIST_LIMIT, JobFilter, TaskFilter, TaskKeyset
from dtq.application.queries import QueryService
from dtq.domain.errors import ValidationError
from dtq.domain.status import TaskStatus
from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def submit(api: Api, count: int, kind: str = "k") -> list[UUID]:
    specs = tuple(TaskSpec(f"t{i}", kind) for i in range(count))
    result = await api.services.api.submit.submit_job(SubmitJob(tasks=specs))
    api.clock.advance(1)
    return [result.task_ids[f"t{i}"] for i in range(count)]


def queries(api: Api) -> QueryService:
    return api.services.api.queries


async def test_a_full_last_page_says_there_is_no_next_page(api: Api) -> None:
    await submit(api, 4)

    first = await queries(api).list_tasks(TaskFilter(), limit=2)
    assert first.next_after is not None
    last = await queries(api).list_tasks(TaskFilter(), limit=2, after=first.next_after)

    assert len(first.tasks) == len(last.tasks) == 2
    assert last.next_after is None
    assert {t.id for t in first.tasks}.isdisjoint({t.id for t in last.tasks})


async def test_a_bulk_walk_visits_each_matching_task_once_while_tasks_change(api: Api) -> None:
    older = await submit(api, 7)
    newer = await submit(api, 6)
    where = TaskFilter(kind="k", statuses=frozenset({TaskStatus.QUEUED, TaskStatus.RUNNING}))
    visited: list[UUID] = []
    after: TaskKeyset | None = None
    started = False
    while True:
        batch = await queries(api).matching_task_ids(where, limit=4, after=after)
        if not batch:
            break
        visited.extend(key[2] for key in batch)
        after = batch[-1]
        if not started:  # between batches: a claim changes a status, a new job arrives
            started = True
            await api.services.worker.execution.claim_many([older[0]], "w")
            late = await submit(api, 2)

    assert len(visited) == len(set(visited)) == 13
    assert set(visited) == set(older) | set(newer)
    assert set(late).isdisjoint(visited)  # newer than the walk's start: before its first key


async def test_page_sizes_outside_the_bounds_are_refused(api: Api) -> None:
    for limit in (0, MAX_LIST_LIMIT + 1):
        with pytest.raises(ValidationError) as tasks:
            await queries(api).list_tasks(TaskFilter(), limit=limit)
        with pytest.raises(ValidationError) as ids:
            await queries(api).matching_task_ids(TaskFilter(), limit=limit)
        with pytest.raises(ValidationError) as jobs:
            await queries(api).list_jobs(JobFilter(), limit=limit)
        assert tasks.value.field == ids.value.field == jobs.value.field == "limit"
    with pytest.raises(ValidationError) as job_page:
        await queries(api).get_job(UUID(int=1), limit=0)
    assert job_page.value.field == "limit"


def test_filters_refuse_a_naive_time() -> None:
    naive = datetime(2026, 1, 1)  # naive on purpose

    with pytest.raises(ValidationError) as since:
        TaskFilter(since=naive)
    with pytest.raises(ValidationError) as until:
        JobFilter(until=naive)

    assert (since.value.field, until.value.field) == ("since", "until")
