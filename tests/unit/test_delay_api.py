"""``run_at``/``delay`` on ``POST /v1/tasks`` and ``POST /v1/jobs`` (issue 14 item 2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


def error_field(response: Any) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}
    field: str = body["error"]["field"]
    return field


async def scheduled_at(api: Api, task_id: str) -> datetime:
    response = await api.client.get(f"/v1/tasks/{task_id}")
    assert response.status_code == 200
    return datetime.fromisoformat(response.json()["scheduled_at"])


async def test_delay_on_post_tasks_schedules_the_task(api: Api) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", "delay": "1m30s"})
    assert response.status_code == 201, response.text
    task_id = response.json()["task_id"]
    assert await scheduled_at(api, task_id) == api.clock.now() + timedelta(seconds=90)
    assert api.queue.scheduled_ids() == [UUID(task_id)]
    assert api.queue.ready_ids("default") == []


async def test_run_at_with_an_offset_on_post_jobs(api: Api) -> None:
    due = (api.clock.now() + timedelta(hours=1)).astimezone()
    body = {
        "tasks": [
            {"name": "a", "kind": "echo", "run_at": due.isoformat()},
            {"name": "b", "kind": "echo", "run_at": "2000-01-01T00:00:00Z"},
            # 2000-01-01T00:30:00Z: the earliest accepted run_at is compared in UTC
            {"name": "c", "kind": "echo", "run_at": "1999-12-31T23:30:00-01:00"},
        ]
    }
    response = await api.client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    ids = response.json()["tasks"]
    assert await scheduled_at(api, ids["a"]) == due
    assert await scheduled_at(api, ids["b"]) == api.clock.now()  # a past run_at runs now
    assert await scheduled_at(api, ids["c"]) == api.clock.now()
    assert api.queue.ready_ids("default") == [UUID(ids["b"]), UUID(ids["c"])]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"run_at": "2026-12-01T12:00:00"}, "run_at"),  # naive
        ({"run_at": "2026-12-01"}, "run_at"),
        ({"run_at": "tomorrow"}, "run_at"),
        ({"run_at": 5}, "run_at"),
        ({"delay": "5"}, "delay"),
        ({"delay": "-5s"}, "delay"),
        ({"delay": "9000h"}, "delay"),
        # beyond 8784h by less than a microsecond: the bound is exact, not a float's
        ({"delay": "8784h1ns"}, "delay"),
        ({"delay": "8784h0.0000001s"}, "delay"),
        ({"delay": "527040m0.5us"}, "delay"),
        ({"delay": "-1ns"}, "delay"),
        ({"delay": "-0.0000001s"}, "delay"),
        ({"delay": "1d"}, "delay"),
        ({"delay": " 5s"}, "delay"),  # parse_duration strips (for configuration); a body may not
        ({"delay": "5s\n"}, "delay"),
        ({"delay": "5s", "run_at": "2026-12-01T12:00:00Z"}, "delay"),
        ({"run_at": "9999-12-31T23:59:59-01:00"}, "run_at"),  # beyond datetime in UTC
        ({"run_at": "9000-01-01T00:00:00Z"}, "run_at"),  # more than a year ahead
        ({"run_at": "0001-01-01T00:00:00Z"}, "run_at"),  # a typo, not "now"
        ({"run_at": "0001-01-01T00:00:00+01:00"}, "run_at"),  # before datetime in UTC
        ({"run_at": "1999-12-31T23:59:59Z"}, "run_at"),  # before 2000-01-01
        ({"run_at": "2000-01-01T00:30:00+01:00"}, "run_at"),  # 1999-12-31T23:30:00Z
        # ISO 8601 forms that are not RFC 3339 (datetime.fromisoformat took each of them)
        ({"run_at": "2026-12-03T06:00:00+0200"}, "run_at"),
        ({"run_at": "2026-12-03T06:00:00+02"}, "run_at"),
        ({"run_at": "2026-12-03T06:00:00+02:00:30"}, "run_at"),
        ({"run_at": "20261203T060000Z"}, "run_at"),
        ({"run_at": "2026-W49-4T06:00:00Z"}, "run_at"),
        ({"run_at": "2026-12-03T06:00:00,5Z"}, "run_at"),
        ({"run_at": "2026-12-03T06:00Z"}, "run_at"),
        ({"run_at": "2026-12-03T06:00:00.Z"}, "run_at"),
        ({"run_at": "2026-12-03 06:00:00Z"}, "run_at"),
        ({"run_at": "\uff12026-12-03T06:00:00Z"}, "run_at"),  # a digit that is not ASCII
    ],
)
async def test_bad_timing_is_a_400_naming_the_field(
    api: Api, extra: dict[str, Any], field: str
) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **extra})
    assert error_field(response) == field
    response = await api.client.post(
        "/v1/jobs",
        json={"tasks": [{"name": "x", "kind": "echo"}, {"name": "a", "kind": "echo", **extra}]},
    )
    assert error_field(response) == f"tasks[1].{field}"
    assert api.store._tables.jobs == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *(("delay", d) for d in ("8784h", "8783h59m59.999999999s", "0s", "-0s", "0")),
        # RFC 3339 in either case, any fraction
        *(
            ("run_at", r)
            for r in (
                "2026-12-01t12:00:00z",
                "2026-12-01T12:00:00.123456789+01:00",
                "2026-12-01T12:00:00Z",
            )
        ),
    ],
)
async def test_a_timing_at_its_bounds_or_in_any_rfc_3339_form_is_accepted(
    api: Api, field: str, value: str
) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", field: value})

    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("run_at", "words"),
    [
        ("0001-01-01T00:00:00Z", ["2000-01-01T00:00:00Z", "'0001-01-01T00:00:00Z'"]),
        ("2016-12-31T23:59:60Z", ["leap second"]),
    ],
)
async def test_a_run_at_before_2000_or_on_a_leap_second_is_a_400_that_says_so(
    api: Api, run_at: str, words: list[str]
) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", "run_at": run_at})

    assert error_field(response) == "run_at"
    message = response.json()["error"]["message"]
    assert all(word in message for word in words), message
