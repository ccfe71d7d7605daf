"""``retry`` and ``timeout`` on submit (issue 14 item 3): stored, shown, validated."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


_SHOWN = {"backoff": "exponential", "delay": "500ms", "max_delay": "10m", "jitter": True}
_WHOLE_MS = {"backoff": "exponential", "delay": "1000us", "max_delay": "0.001s", "jitter": False}


@pytest.mark.parametrize(
    ("retry", "timeout", "shown_retry", "shown_timeout"),
    [
        (_SHOWN, "1m30s", _SHOWN, "1m30s"),
        # durations of whole milliseconds are stored as given, shown in their shortest form
        (_WHOLE_MS, "1000000ns", {**_WHOLE_MS, "delay": "1ms", "max_delay": "1ms"}, "1ms"),
    ],
)
async def test_retry_and_timeout_are_shown_by_get_task(
    api: Api,
    retry: dict[str, Any],
    timeout: str,
    shown_retry: dict[str, Any],
    shown_timeout: str,
) -> None:
    response = await api.client.post(
        "/v1/tasks", json={"kind": "echo", "retry": retry, "timeout": timeout}
    )
    assert response.status_code == 201, response.text
    task = (await api.client.get(f"/v1/tasks/{response.json()['task_id']}")).json()
    assert task["retry"] == shown_retry
    assert task["timeout"] == shown_timeout


async def test_without_them_both_are_null(api: Api) -> None:
    response = await api.client.post("/v1/jobs", json={"tasks": [{"name": "a", "kind": "echo"}]})
    task_id = response.json()["tasks"]["a"]
    task = (await api.client.get(f"/v1/tasks/{task_id}")).json()
    assert (task["retry"], task["timeout"]) == (None, None)
    response = await api.client.post("/v1/tasks", json={"kind": "echo", "retry": {}})
    task = (await api.client.get(f"/v1/tasks/{response.json()['task_id']}")).json()
    assert task["retry"] == {"backoff": "fixed", "delay": None, "max_delay": None, "jitter": False}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"retry": {"backoff": "linear"}}, "retry.backoff"),
        ({"retry": {"delay": "5"}}, "retry.delay"),
        ({"retry": {"delay": "9000h"}}, "retry.delay"),
        ({"retry": {"delay": 5}}, "retry.delay"),
        (
            {"retry": {"backoff": "exponential", "delay": "5s", "max_delay": "1s"}},
            "retry.max_delay",
        ),
        ({"retry": {"max_delay": "1m"}}, "retry.max_delay"),
        ({"retry": {"jitter": "yes"}}, "retry.jitter"),
        ({"retry": {"tries": 3}}, "retry.tries"),
        ({"retry": "exponential"}, "retry"),
        ({"timeout": "0s"}, "timeout"),
        ({"timeout": "forever"}, "timeout"),
        ({"timeout": "9000h"}, "timeout"),
    ],
)
async def test_bad_retry_or_timeout_is_a_400_naming_the_field(
    api: Api, extra: dict[str, Any], field: str
) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    response = await api.client.post(
        "/v1/jobs", json={"tasks": [{"name": "a", "kind": "echo", **extra}]}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == f"tasks[0].{field}"
    assert api.store._tables.jobs == {}


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        # below 1ms by less than a microsecond: was 201, stored as 1ms
        ({"timeout": "999999ns"}, "timeout", "must be between 1ms and 8784h, got '999999ns'"),
        (
            {"timeout": "0.0009999999999s"},
            "timeout",
            "must be between 1ms and 8784h, got '0.0009999999999s'",
        ),
        # the range named was 0s..8784h, though 0s is refused
        ({"timeout": "-1s"}, "timeout", "must be between 1ms and 8784h, got '-1s'"),
        ({"timeout": "8784h1ns"}, "timeout", "must be between 1ms and 8784h, got '8784h1ns'"),
        ({"timeout": "0s"}, "timeout", "must be between 1ms and 8784h, got '0s'"),
        # what storage cannot hold (milliseconds): was rounded (1.5ms -> 2ms, 1us -> 0s)
        (
            {"timeout": "1.5ms"},
            "timeout",
            "must be a whole number of milliseconds (what is stored), got '1.5ms'",
        ),
        (
            {"retry": {"delay": "1us"}},
            "retry.delay",
            "must be a whole number of milliseconds (what is stored), got '1us'",
        ),
        (
            {"retry": {"backoff": "exponential", "delay": "1000.4us", "max_delay": "1000us"}},
            "retry.delay",
            "must be a whole number of milliseconds (what is stored), got '1000.4us'",
        ),
        (
            {"retry": {"backoff": "exponential", "delay": "1s", "max_delay": "1.0000001s"}},
            "retry.max_delay",
            "must be a whole number of milliseconds (what is stored), got '1.0000001s'",
        ),
    ],
)
async def test_a_duration_is_refused_unless_exactly_in_range_and_storable(
    api: Api, extra: dict[str, Any], field: str, message: str
) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **extra})

    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "code": "validation_error",
        "message": message,
        "field": field,
    }
    assert api.store._tables.jobs == {}
