"""What a claim batch costs the store: the fan-in read only for tasks that can have parents.

``task.parents`` is read in the claim transaction (issue 13 item 3). A task submitted without
dependencies is stored ``queued`` at version 0 and is still at version 0 when first claimed, so
its claim skips the parents statement; a dependent (stored ``pending``, made ``queued`` by a
write) and any task written since (a hand-back, a retry) are looked up as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

import pytest

from dtq.adapters.memory import store as memory_store
from dtq.application.commands import TaskSpec
from tests.unit.conftest import App


@pytest.fixture
def looked_up(monkeypatch: pytest.MonkeyPatch) -> list[list[UUID]]:
    """The ``task_ids`` of every ``parent_results`` call on the memory store."""
    calls: list[list[UUID]] = []
    real = memory_store._Tasks.parent_results

    async def spy(self: Any, task_ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
        calls.append(list(task_ids))
        return await real(self, task_ids)

    monkeypatch.setattr(memory_store._Tasks, "parent_results", spy)
    return calls


async def test_a_batch_of_roots_reads_no_parents(app: App, looked_up: list[list[UUID]]) -> None:
    result = await app.submit_tasks(*(TaskSpec(f"r{i}", "echo") for i in range(4)))

    claims = await app.execution.claim_many(list(result.task_ids.values()), "w1")

    assert len(claims) == 4
    assert all(claim.parents == {} for claim in claims)
    assert looked_up == []


async def test_only_the_dependents_of_a_mixed_batch_are_looked_up(
    app: App, looked_up: list[list[UUID]]
) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)), TaskSpec("r", "echo")
    )
    [a] = await app.execution.claim_many([result.task_ids["a"]], "w1")
    await app.execution.complete_many([a], [{"from": "a"}])

    claims = await app.execution.claim_many([result.task_ids["b"], result.task_ids["r"]], "w1")

    by_name = {claim.task.name: claim for claim in claims}
    assert by_name["b"].parents == {"a": {"from": "a"}}
    assert by_name["r"].parents == {}
    assert looked_up == [[result.task_ids["b"]]]


async def test_a_root_written_since_its_submit_is_looked_up_again(
    app: App, looked_up: list[list[UUID]]
) -> None:
    result = await app.submit_tasks(TaskSpec("r", "echo"))
    [first] = await app.execution.claim_many([result.task_ids["r"]], "w1")
    await app.execution.hand_back(first, "shutting down")

    [second] = await app.execution.claim_many([result.task_ids["r"]], "w2")

    assert second.parents == {}
    assert looked_up == [[result.task_ids["r"]]]


# --- the success of a claim: the search for dependents only where the job has some ------------


@pytest.fixture
def searched(monkeypatch: pytest.MonkeyPatch) -> list[list[UUID]]:
    """The ``task_ids`` of every ``dependents_many`` call on the memory store."""
    calls: list[list[UUID]] = []
    real = memory_store._Tasks.dependents_many

    async def spy(self: Any, task_ids: Sequence[UUID]) -> list[tuple[UUID, UUID]]:
        calls.append(list(task_ids))
        return await real(self, task_ids)

    monkeypatch.setattr(memory_store._Tasks, "dependents_many", spy)
    return calls


async def test_a_job_records_at_submit_whether_it_has_dependencies(app: App) -> None:
    flat = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    dag = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))

    assert (await app.queries.get_job(flat.job_id)).job.has_dependencies is False
    assert (await app.queries.get_job(dag.job_id)).job.has_dependencies is True


async def test_the_successes_of_a_flat_job_search_for_no_dependents(
    app: App, searched: list[list[UUID]]
) -> None:
    result = await app.submit_tasks(*(TaskSpec(f"t{i}", "echo") for i in range(4)))
    claims = await app.execution.claim_many(list(result.task_ids.values()), "w1")
    assert [claim.job_has_dependencies for claim in claims] == [False] * 4

    await app.execution.complete_many(claims)

    assert searched == []
    assert (await app.queries.get_job(result.job_id)).job.status.value == "completed"


async def test_the_successes_of_a_dag_job_search_and_promote(
    app: App, searched: list[list[UUID]]
) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo"), TaskSpec("b", "echo"), TaskSpec("c", "echo", depends_on=("a", "b"))
    )
    roots = [result.task_ids["a"], result.task_ids["b"]]
    claims = await app.execution.claim_many(roots, "w1")
    assert [claim.job_has_dependencies for claim in claims] == [True, True]

    await app.execution.complete_many(claims)

    assert searched == [roots]
    child = (await app.queries.get_task(result.task_ids["c"])).task
    assert child.status.value == "queued"


async def test_a_job_whose_dependencies_are_unknown_is_searched(
    app: App, searched: list[list[UUID]]
) -> None:
    """A job stored before ``has_dependencies`` was recorded (None) is searched as before."""
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    app.store._tables.jobs[result.job_id].has_dependencies = None
    [claim] = await app.execution.claim_many([result.task_ids["a"]], "w1")
    assert claim.job_has_dependencies is None

    await app.execution.complete_many([claim])

    assert searched == [[result.task_ids["a"]]]
    assert (await app.queries.get_task(result.task_ids["b"])).task.status.value == "queued"


@pytest.fixture
def finished_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[UUID]]:
    """The ``job_ids`` of every ``get_finished`` call on the memory store."""
    calls: list[list[UUID]] = []
    real = memory_store._Jobs.get_finished

    async def spy(self: Any, job_ids: Sequence[UUID], unfinished: Any) -> Any:
        calls.append(list(job_ids))
        return await real(self, job_ids, unfinished)

    monkeypatch.setattr(memory_store._Jobs, "get_finished", spy)
    return calls


async def test_one_task_jobs_settle_from_their_claims_without_a_read(
    app: App, finished_reads: list[list[UUID]]
) -> None:
    singles = [await app.submit_tasks(TaskSpec("a", "echo")) for _ in range(3)]
    pair = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    ids = [r.task_ids["a"] for r in singles] + list(pair.task_ids.values())
    claims = await app.execution.claim_many(ids, "w1")
    assert [c.job.task_count for c in claims if c.job] == [1, 1, 1, 2, 2]

    await app.execution.complete_many(claims)

    assert finished_reads == [[pair.job_id]]
    for result in [*singles, pair]:
        assert (await app.queries.get_job(result.job_id)).job.status.value == "completed"


async def test_a_one_task_job_changed_since_its_claim_is_read(
    app: App, finished_reads: list[list[UUID]]
) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    [claim] = await app.execution.claim_many([result.task_ids["a"]], "w1")
    stored = app.store._tables.jobs[result.job_id]
    stored.metadata, stored.version = {"by": "other"}, stored.version + 1

    await app.execution.complete_many([claim])

    assert finished_reads == [[result.job_id]]
    job = (await app.queries.get_job(result.job_id)).job
    assert job.status.value == "completed" and job.metadata == {"by": "other"}
    assert claim.job is not None and claim.job.status.value == "running"  # the claim's copy


async def test_a_job_whose_task_count_is_unknown_is_read(
    app: App, finished_reads: list[list[UUID]]
) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    app.store._tables.jobs[result.job_id].task_count = None
    [claim] = await app.execution.claim_many([result.task_ids["a"]], "w1")

    await app.execution.complete_many([claim])

    assert finished_reads == [[result.job_id]]
    assert (await app.queries.get_job(result.job_id)).job.status.value == "completed"
