"""Cancel and manual retry over HTTP (issue 14 items 1 and 4): ``POST /v1/tasks/{id}/cancel``,
``POST /v1/tasks/{id}/retry``, ``POST /v1/jobs/{id}/cancel``; 200 bodies, 409 codes, 404 and
400 naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def submit(api: Api, **body: Any) -> dict[str, Any]:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **body})
    assert response.status_code == 201
    created: dict[str, Any] = response.json()
    return created


async def fail_for_good(api: Api, task_id: str) -> None:
    execution = api.services.worker.execution
    [claim] = await execution.claim_many([UUID(task_id)], "w1")
    await execution.fail(claim, "boom", permanent=True)


async def test_cancel_a_task_then_again(api: Api) -> None:
    created = await submit(api)
    url = f"/v1/tasks/{created['task_id']}/cancel"

    first = await api.client.post(url)
    second = await api.client.post(url)

    assert first.status_code == second.status_code == 200
    assert first.json() == {"task_id": created["task_id"], "status": "cancelled", "cascaded": 0}
    assert second.json() == first.json()
    task = (await api.client.get(f"/v1/tasks/{created['task_id']}")).json()
    assert task["status"] == "cancelled"


async def test_cancel_of_a_failed_task_is_409_not_cancellable(api: Api) -> None:
    created = await submit(api, max_attempts=1)
    await fail_for_good(api, created["task_id"])

    response = await api.client.post(f"/v1/tasks/{created['task_id']}/cancel")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_cancellable"


async def test_retry_of_a_failed_task_reopens_its_job(api: Api) -> None:
    created = await submit(api, max_attempts=1)
    await fail_for_good(api, created["task_id"])
    assert (await api.client.get(f"/v1/jobs/{created['job_id']}")).json()["status"] == "failed"

    response = await api.client.post(f"/v1/tasks/{created['task_id']}/retry")

    assert response.status_code == 200
    assert response.json() == {"task_id": created["task_id"], "status": "queued", "reopened": 0}
    job = (await api.client.get(f"/v1/jobs/{created['job_id']}")).json()
    assert job["status"] == "running"
    task = (await api.client.get(f"/v1/tasks/{created['task_id']}")).json()
    assert (task["status"], task["attempt"]) == ("queued", 0)
    assert [run["status"] for run in task["runs"]] == ["failed"]  # the history is kept


async def test_retry_of_a_queued_task_is_409_not_retryable(api: Api) -> None:
    created = await submit(api)
    response = await api.client.post(f"/v1/tasks/{created['task_id']}/retry")
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "not_retryable",
        "message": f"task {created['task_id']} is queued, not failed or cancelled",
        "field": "id",
    }


async def test_cancel_a_job(api: Api) -> None:
    tasks = [{"name": "a", "kind": "echo"}, {"name": "b", "kind": "echo", "depends_on": ["a"]}]
    created = (await api.client.post("/v1/jobs", json={"tasks": tasks})).json()
    url = f"/v1/jobs/{created['job_id']}/cancel"

    first = await api.client.post(url)
    second = await api.client.post(url)

    assert first.status_code == second.status_code == 200
    assert first.json() == {"job_id": created["job_id"], "status": "cancelled", "cancelled": 2}
    assert second.json() == {"job_id": created["job_id"], "status": "cancelled", "cancelled": 0}


@pytest.mark.parametrize(
    "route", ["/v1/tasks/{id}/cancel", "/v1/tasks/{id}/retry", "/v1/jobs/{id}/cancel"]
)
async def test_unknown_ids_are_404_and_bad_ids_400_naming_the_field(api: Api, route: str) -> None:
    unknown = await api.client.post(route.format(id=uuid4()))
    bad = await api.client.post(route.format(id="not-a-uuid"))

    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] in {"task_not_found", "job_not_found"}
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "id"


async def _target(api: Api, route: str) -> tuple[str, str, str]:
    """A task the route would change (failed for a retry, queued otherwise): its url, id and
    status."""
    created = await submit(api, max_attempts=1)
    if route == "tasks/{id}/retry":
        await fail_for_good(api, created["task_id"])
    key = "job_id" if route.startswith("jobs/") else "task_id"
    task = (await api.client.get(f"/v1/tasks/{created['task_id']}")).json()
    return f"/v1/{route.format(id=created[key])}", created["task_id"], task["status"]


@pytest.mark.parametrize("route", ["tasks/{id}/cancel", "tasks/{id}/retry", "jobs/{id}/cancel"])
@pytest.mark.parametrize(
    ("query", "field"), [("?dry_run=true", "dry_run"), ("?cascade=false&x=1", "cascade")]
)
async def test_a_query_parameter_is_400_naming_it_and_changes_nothing(
    api: Api, route: str, query: str, field: str
) -> None:
    url, task_id, before = await _target(api, route)

    response = await api.client.post(url + query)

    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "validation_error",
        "message": f"unknown query parameter {field!r}; this route takes none",
        "field": field,
    }
    task = (await api.client.get(f"/v1/tasks/{task_id}")).json()
    assert task["status"] == before


@pytest.mark.parametrize("route", ["tasks/{id}/cancel", "tasks/{id}/retry", "jobs/{id}/cancel"])
@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b'{"cascade":false,"bogus":1e999}', {"Content-Type": "application/json"}),
        (b"not json", {"Content-Type": "application/json"}),
        (b"{}", {"Content-Type": "application/json"}),
        (b"x=1", {"Content-Type": "application/x-www-form-urlencoded"}),
    ],
)
async def test_a_body_is_400_and_changes_nothing(
    api: Api, route: str, content: bytes, headers: dict[str, str]
) -> None:
    url, task_id, before = await _target(api, route)

    response = await api.client.post(url, content=content, headers=headers)

    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "validation_error",
        "message": "this route takes no body; send the request without one",
        "field": "body",
    }
    task = (await api.client.get(f"/v1/tasks/{task_id}")).json()
    assert task["status"] == before
