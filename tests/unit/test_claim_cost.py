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
