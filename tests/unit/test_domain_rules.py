"""Pure rules: DAG validation, retry decision, job status derivation, storable payloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from dtq.domain.dag import TaskNode, validate_dag
from dtq.domain.errors import (
    DependencyCycle,
    DuplicateDependency,
    DuplicateTaskName,
    InvalidPayload,
    SelfDependency,
    UnknownDependency,
)
from dtq.domain.payload import check_storable
from dtq.domain.policy import decide_retry, derive_job_status
from dtq.domain.status import JobStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def nodes(**deps: tuple[str, ...]) -> list[TaskNode]:
    return [TaskNode(name, d) for name, d in deps.items()]


def test_dag_order_puts_every_task_after_its_dependencies() -> None:
    graph = nodes(a=(), b=("a",), c=("a",), d=("b", "c"))
    order = validate_dag(graph)
    assert sorted(order) == ["a", "b", "c", "d"]
    position = {name: i for i, name in enumerate(order)}
    for node in graph:
        for dep in node.depends_on:
            assert position[dep] < position[node.name]


def test_duplicate_names_are_refused_naming_both_tasks() -> None:
    with pytest.raises(DuplicateTaskName) as err:
        validate_dag([TaskNode("a"), TaskNode("b"), TaskNode("a")])
    assert "tasks[0]" in err.value.detail and "tasks[2]" in err.value.detail
    assert err.value.field == "tasks[2].name"


def test_unknown_dependency_is_refused() -> None:
    with pytest.raises(UnknownDependency) as err:
        validate_dag(nodes(a=(), b=("a", "zzz")))
    assert "'zzz'" in err.value.detail and "'b'" in err.value.detail
    assert err.value.field == "tasks[1].depends_on[1]"


def test_self_dependency_is_refused() -> None:
    with pytest.raises(SelfDependency) as err:
        validate_dag(nodes(a=(), b=("a", "b")))
    assert err.value.field == "tasks[1].depends_on[1]"


def test_duplicate_dependency_is_refused_naming_the_id() -> None:
    with pytest.raises(DuplicateDependency) as err:
        validate_dag(nodes(a=(), b=(), c=("b", "a", "b")))
    assert "'b'" in err.value.detail and "'c'" in err.value.detail
    assert err.value.field == "tasks[2].depends_on[2]"  # the second 'b'


def test_cycle_is_refused_with_its_path() -> None:
    with pytest.raises(DependencyCycle) as err:
        validate_dag(nodes(root=(), a=("c", "root"), b=("a",), c=("b",)))
    path = err.value.path
    assert path[0] == path[-1]
    assert set(path) == {"a", "b", "c"}
    # each step of the reported path is a real edge in depends_on's direction: "x -> y" is
    # "x depends on y", and the message says so
    graph = {"a": {"c", "root"}, "b": {"a"}, "c": {"b"}}
    for before, after in pairwise(path):
        assert after in graph[before]
    assert " -> ".join(path) in err.value.detail
    assert "depends on" in err.value.detail


def test_a_long_cycle_is_named_in_a_message_of_bounded_length() -> None:
    ring = [TaskNode(f"t{i}", (f"t{(i + 1) % 10_000}",)) for i in range(10_000)]

    with pytest.raises(DependencyCycle) as err:
        validate_dag(ring)

    assert len(err.value.path) == 10_001  # the attribute keeps every name
    assert len(err.value.detail) < 400, len(err.value.detail)
    assert "10000 tasks" in err.value.detail and "depends on" in err.value.detail


def test_a_large_layered_dag_validates() -> None:
    graph = [TaskNode(f"n{i}", (f"n{i - 1}",) if i else ()) for i in range(10_000)]
    assert len(validate_dag(graph)) == 10_000


def test_retry_while_attempts_remain() -> None:
    decision = decide_retry(
        attempt=1, max_attempts=3, permanent=False, backoff=timedelta(seconds=5), at=T0
    )
    assert decision.retry and decision.next_attempt_at == T0 + timedelta(seconds=5)


@pytest.mark.parametrize(("attempt", "permanent"), [(3, False), (1, True)])
def test_no_retry_when_exhausted_or_permanent(attempt: int, permanent: bool) -> None:
    decision = decide_retry(
        attempt=attempt, max_attempts=3, permanent=permanent, backoff=timedelta(1), at=T0
    )
    assert not decision.retry and decision.next_attempt_at is None


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"any_failed": True, "any_unfinished": True}, JobStatus.FAILED),
        ({"any_unfinished": True}, JobStatus.PENDING),
        ({"any_unfinished": True, "any_started": True}, JobStatus.RUNNING),
        ({"any_cancelled": True, "any_started": True}, JobStatus.CANCELLED),
        ({"any_started": True}, JobStatus.COMPLETED),
    ],
)
def test_job_status_derivation(facts: dict[str, bool], expected: JobStatus) -> None:
    base = {"any_failed": False, "any_unfinished": False, "any_cancelled": False}
    base["any_started"] = False
    assert derive_job_status(**(base | facts)) is expected


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"a": "x\x00y"}, "p.a"),
        ({"k\x00": 1}, "p.k\\u0000"),
        ({"a": "x\ud800y"}, "p.a"),
        ({"k\udcff": 1}, "p.k\\udcff"),
        ([1, [2, 2**63]], "p[1][1]"),
        ({"f": float("nan")}, "p.f"),
        ({"f": float("inf")}, "p.f"),
        ({1: "x"}, "p"),
    ],
)
def test_unstorable_payloads_are_refused_naming_the_path(value: object, field: str) -> None:
    with pytest.raises(InvalidPayload) as err:
        check_storable(value, field="p")
    assert err.value.field == field


def test_too_deep_nesting_is_refused() -> None:
    value: object = 1
    for _ in range(70):
        value = [value]
    with pytest.raises(InvalidPayload):
        check_storable(value, field="p", max_depth=64)


def test_ordinary_json_is_storable() -> None:
    check_storable(
        {"s": "héllo ☃", "n": -(2**63), "f": 1.5, "b": True, "z": None, "l": [{}]}, field="p"
    )


def nest(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_limit_counts_containers_exactly() -> None:
    check_storable(nest(64), field="p", max_depth=64)
    with pytest.raises(InvalidPayload) as err:
        check_storable(nest(65), field="p", max_depth=64)
    assert err.value.field == "p" + "[0]" * 64
