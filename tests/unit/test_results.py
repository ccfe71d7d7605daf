"""Task results and fan-in on the memory adapters (issue 13 items 1 and 3).

A handler's return value is the task's result, written with the success that ends its run and
fenced to that run; a dependent's claim carries its direct dependencies' results.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from dtq.application.commands import Claim, ReportOutcome, TaskSpec
from dtq.domain.errors import InvalidPayload
from dtq.domain.payload import check_result
from dtq.domain.status import TaskStatus
from dtq.entrypoints.config import ConfigError, load_settings
from tests.single import pop_one
from tests.unit.conftest import App


async def claim_next(app: App, worker: str = "w1") -> Claim:
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None, "nothing on the ready list"
    claims = await app.execution.claim_many([task_id], worker)
    assert len(claims) == 1, "claim refused"
    return claims[0]


# --- check_result -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field", "why"),
    [
        ({"s": "a\x00b"}, "result.s", "NUL"),
        ({"o": {"k\x00": 1}}, "result.o.k\\u0000", "NUL"),
        ([1.0, math.nan], "result[1]", "not finite"),
        ({"when": {1, 2}}, "result.when", "not a JSON value: set"),
        ({1: "x"}, "result", "keys must be strings"),
    ],
)
def test_an_unstorable_result_is_refused_naming_the_path(value: Any, field: str, why: str) -> None:
    with pytest.raises(InvalidPayload, match=why) as caught:
        check_result(value, max_bytes=1024)
    assert caught.value.field == field
    assert caught.value.detail.startswith("result cannot be stored")


def test_a_result_over_the_limit_is_refused_and_points_to_artifacts() -> None:
    with pytest.raises(InvalidPayload, match="API_MAX_RESULT_BYTES") as caught:
        check_result("x" * 100, max_bytes=50)
    assert "102 bytes" in caught.value.detail
    assert "artifact" in caught.value.detail


def test_a_result_at_the_limit_is_accepted_and_its_size_returned() -> None:
    assert check_result("é" * 10, max_bytes=22) == 22  # two quotes + ten 2-byte characters
    assert check_result(None, max_bytes=4) == 4


@pytest.mark.parametrize("text", ["0", "67108865", "lots"])
def test_api_max_result_bytes_out_of_range_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^API_MAX_RESULT_BYTES: "):
        load_settings({"API_MAX_RESULT_BYTES": text})


def test_api_max_result_bytes_reaches_the_execution_policy() -> None:
    policy = load_settings({"API_MAX_RESULT_BYTES": "2048"}).execution_policy()
    assert policy.max_result_bytes == 2048
    assert load_settings({}).execution_policy().max_result_bytes == 1024 * 1024


# --- recording ------------------------------------------------------------------------------


async def test_the_result_is_stored_with_the_success(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await claim_next(app)

    outcomes = await app.execution.complete_many([claim], [{"rows": [1, 2], "ok": True}])

    view = await app.queries.get_task(result.task_ids["a"])
    assert outcomes == [ReportOutcome.RECORDED]
    assert view.task.status is TaskStatus.COMPLETED
    assert view.task.result == {"rows": [1, 2], "ok": True}


async def test_a_task_has_no_result_until_it_completes(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    await claim_next(app)
    assert (await app.queries.get_task(result.task_ids["a"])).task.result is None


async def test_a_replayed_success_keeps_the_first_result(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await claim_next(app)
    await app.execution.complete_many([claim], [41])

    again = await app.execution.complete_many([claim], [41])

    assert again == [ReportOutcome.DUPLICATE]
    assert (await app.queries.get_task(result.task_ids["a"])).task.result == 41


async def test_a_stale_runs_result_changes_nothing(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    first = await claim_next(app)
    await app.execution.hand_back(first, "shutting down")
    second = await claim_next(app, "w2")
    await app.execution.complete_many([second], ["fresh"])

    outcomes = await app.execution.complete_many([first], ["stale"])

    assert outcomes == [ReportOutcome.STALE]
    assert (await app.queries.get_task(result.task_ids["a"])).task.result == "fresh"


async def test_results_of_a_batch_go_to_their_own_tasks(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo"))
    ids = [await pop_one(app.queue, ["default"], timeout=0) for _ in range(2)]
    claims = await app.execution.claim_many([i for i in ids if i is not None], "w1")
    by_name = {c.task.name: c for c in claims}

    await app.execution.complete_many([by_name["b"], by_name["a"]], ["B", None])

    assert (await app.queries.get_task(result.task_ids["a"])).task.result is None
    assert (await app.queries.get_task(result.task_ids["b"])).task.result == "B"


# --- fan-in -----------------------------------------------------------------------------------


async def test_a_dependent_is_claimed_with_its_parents_results(app: App) -> None:
    await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo"),
        TaskSpec("c", "echo", depends_on=("a", "b")),
    )
    for _ in range(2):
        claim = await claim_next(app)
        assert claim.parents == {}
        await app.execution.complete_many([claim], [{"from": claim.task.name}])

    child = await claim_next(app)

    assert child.task.name == "c"
    assert child.parents == {"a": {"from": "a"}, "b": {"from": "b"}}


async def test_only_direct_dependencies_are_parents(app: App) -> None:
    await app.submit_tasks(
        TaskSpec("a", "echo"),
        TaskSpec("b", "echo", depends_on=("a",)),
        TaskSpec("c", "echo", depends_on=("b",)),
    )
    await app.execution.complete_many([await claim_next(app)], [1])
    await app.execution.complete_many([await claim_next(app)], [2])

    child = await claim_next(app)

    assert child.parents == {"b": 2}
