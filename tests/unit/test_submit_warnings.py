"""Submit warnings (issue 14 item 7, issue 15 item 2's visibility part): a submit whose priority
or kind no live worker serves is still 201, with ``warnings``; the registry is read at most once a
second and its failure never fails a submit. Memory adapters, FakeClock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import TaskSpec
from dtq.application.fleet import Fleet, FleetService, Missing
from dtq.application.ports import Transaction
from dtq.domain.entities import Worker
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.api.params import DEFAULT_ACTIVE_SINCE, parse_active_since
from dtq.entrypoints.container import FLEET_ALIVE_WITHIN
from tests.unit.api_harness import Api, running_api

T = TypeVar("T")


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def live_worker(api: Api, kinds: list[str], priorities: list[str], name: str = "w1") -> None:
    metadata = {"kinds": kinds, "priorities": priorities}
    await api.services.worker.registry.heartbeat(name, "host", metadata)


# --- through the API --------------------------------------------------------------------------


async def test_a_served_task_answers_without_a_warnings_member(api: Api) -> None:
    await live_worker(api, ["echo"], ["default"])

    response = await api.client.post("/v1/tasks", json={"kind": "echo"})

    assert response.status_code == 201
    assert "warnings" not in response.json()


async def test_a_priority_nobody_polls_is_201_with_a_priority_warning(api: Api) -> None:
    await live_worker(api, ["echo"], ["default"])

    response = await api.client.post("/v1/tasks", json={"kind": "echo", "priority": "bulk"})

    assert response.status_code == 201
    (warning,) = response.json()["warnings"]
    assert warning["code"] == "no_worker_for_priority"
    assert warning["task"] == "echo"  # a single task is named after its kind
    assert "'bulk'" in warning["message"]


async def test_a_job_gets_one_kind_warning_per_unserved_kind_naming_its_first_task(
    api: Api,
) -> None:
    await live_worker(api, ["echo"], ["default"])
    tasks = [
        {"name": "ok", "kind": "echo"},
        {"name": "x1", "kind": "resize"},
        {"name": "x2", "kind": "resize", "depends_on": ["x1"]},
        {"name": "x3", "kind": "resize"},
    ]

    response = await api.client.post("/v1/jobs", json={"tasks": tasks})

    assert response.status_code == 201
    (warning,) = response.json()["warnings"]
    assert (warning["code"], warning["task"]) == ("no_worker_for_kind", "x1")
    assert "'resize'" in warning["message"]
    assert "2 more tasks" in warning["message"]


async def test_with_no_live_worker_both_warnings_are_given(api: Api) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo"})

    assert response.status_code == 201
    codes = [w["code"] for w in response.json()["warnings"]]
    assert codes == ["no_worker_for_priority", "no_worker_for_kind"]


async def test_the_registry_is_read_at_most_once_a_second(api: Api) -> None:
    first = await api.client.post("/v1/tasks", json={"kind": "echo"})
    await live_worker(api, ["echo"], ["default"])  # arrives within the cached second
    api.clock.advance(0.5)
    cached = await api.client.post("/v1/tasks", json={"kind": "echo"})
    api.clock.advance(0.5)
    fresh = await api.client.post("/v1/tasks", json={"kind": "echo"})

    assert "warnings" in first.json()
    assert "warnings" in cached.json()
    assert "warnings" not in fresh.json()


async def test_a_failed_registry_read_never_fails_the_submit() -> None:
    async with running_api() as base:
        broken = FleetService(store=FailingWorkers(base.store), clock=base.clock, alive_within=120)
    async with running_api(fleet=broken) as api:
        response = await api.client.post("/v1/tasks", json={"kind": "echo"})

    assert response.status_code == 201
    assert "warnings" not in response.json()


# --- FleetService and Fleet -------------------------------------------------------------------


class FailingWorkers:
    """A store whose transactions fail (as the database would during an outage)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.calls = 0

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        self.calls += 1
        raise BackendUnavailable("database down")

    async def ping(self) -> None:
        raise BackendUnavailable("database down")


async def test_a_failed_read_is_cached_too_so_an_outage_costs_one_read_a_second() -> None:
    clock = FakeClock()
    store = FailingWorkers(InMemoryStore(clock))
    fleet = FleetService(store=store, clock=clock, alive_within=120)

    assert await fleet.submit_warnings([TaskSpec("a", "echo")]) == []
    assert await fleet.submit_warnings([TaskSpec("b", "echo")]) == []
    clock.advance(1)
    assert await fleet.cached() is None

    assert store.calls == 2


def worker(metadata: dict[str, Any]) -> Worker:
    return Worker("w", None, datetime.now(UTC), metadata)


@pytest.mark.parametrize(
    ("metadata", "missing"),
    [
        ({"kinds": ["echo"], "priorities": ["default"]}, ()),
        ({"kinds": ["echo"]}, ()),  # a worker older than "priorities" polls the default tier
        ({"kinds": ["echo"], "priorities": ["high"]}, (Missing.PRIORITY,)),
        ({"kinds": ["other"], "priorities": ["default"]}, (Missing.KIND,)),
        ({"priorities": ["default"]}, ()),  # no "kinds": nothing known, counted as serving
        ({"kinds": "echo", "priorities": 3}, ()),  # malformed: never a false alarm
        ({"kinds": ["other"], "priorities": ["high"]}, (Missing.PRIORITY, Missing.KIND)),
    ],
)
def test_what_a_registry_row_advertises(
    metadata: dict[str, Any], missing: tuple[Missing, ...]
) -> None:
    assert Fleet((worker(metadata),), 120).missing("echo", "default") == missing


def test_the_live_window_is_the_default_window_of_get_workers() -> None:
    assert parse_active_since(DEFAULT_ACTIVE_SINCE) == FLEET_ALIVE_WITHIN


async def test_single_task_warnings_are_remembered_per_kind_priority_and_name() -> None:
    clock = FakeClock()
    fleet = FleetService(store=InMemoryStore(clock), clock=clock, alive_within=120)

    first = await fleet.submit_warnings([TaskSpec("a", "echo")])
    first.clear()  # a caller's list is its own
    again = await fleet.submit_warnings([TaskSpec("a", "echo")])
    other_name = await fleet.submit_warnings([TaskSpec("b", "echo")])
    other_kind = await fleet.submit_warnings([TaskSpec("a", "resize")])
    other_priority = await fleet.submit_warnings([TaskSpec("a", "echo", priority="bulk")])

    assert [(w.code, w.task) for w in again] == [
        ("no_worker_for_priority", "a"),
        ("no_worker_for_kind", "a"),
    ]
    assert {w.task for w in other_name} == {"b"}
    assert "'resize'" in other_kind[1].message
    assert "'bulk'" in other_priority[0].message
