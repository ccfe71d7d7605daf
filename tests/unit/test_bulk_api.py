"""Bulk cancel and retry over HTTP (issue 14 item 6): ``POST /v1/tasks/cancel``,
``POST /v1/tasks/retry`` (202 with an operation, 200 for a dry run), ``GET /v1/operations/{id}``,
and the 400s naming the body or the field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def submit(api: Api, **body: Any) -> str:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **body})
    assert response.status_code == 201
    task_id: str = response.json()["task_id"]
    return task_id


async def fail_for_good(api: Api, task_id: str) -> None:
    execution = api.services.worker.execution
    [claim] = await execution.claim_many([UUID(task_id)], "w1")
    await execution.fail(claim, "boom", permanent=True)


async def finished(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    """Poll ``GET /v1/operations/{id}`` of a 202 body until the operation has ended (the app
    runs on the test client's own loop, so the test cannot await the operation itself)."""
    async with asyncio.timeout(10):
        while True:
            response = await api.client.get(f"/v1/operations/{body['id']}")
            assert response.status_code == 200
            found: dict[str, Any] = response.json()
            if found["status"] != "running":
                return found
            await asyncio.sleep(0.01)


async def test_bulk_retry_is_accepted_as_an_operation_that_ends_with_its_counts(
    api: Api,
) -> None:
    failed = [await submit(api, max_attempts=1) for _ in range(3)]
    for task_id in failed:
        await fail_for_good(api, task_id)
    await submit(api)  # queued: not matched

    response = await api.client.post("/v1/tasks/retry", json={"status": "failed"})

    assert response.status_code == 202
    accepted = response.json()
    assert response.headers["location"] == f"/v1/operations/{accepted['id']}"
    assert (accepted["kind"], accepted["status"]) == ("retry", "running")
    done = await finished(api, accepted)
    assert done["status"] == "succeeded" and done["error"] is None
    assert (done["matched"], done["changed"], done["skipped"], done["cascaded"]) == (3, 3, 0, 0)
    assert done["finished_at"] is not None
    for task_id in failed:
        assert (await api.client.get(f"/v1/tasks/{task_id}")).json()["status"] == "queued"


async def test_bulk_cancel_by_kind_and_status_list(api: Api) -> None:
    resize = await submit(api, kind="resize")
    echo = await submit(api)

    response = await api.client.post(
        "/v1/tasks/cancel", json={"kind": "resize", "status": ["queued", "pending"]}
    )

    assert response.status_code == 202
    done = await finished(api, response.json())
    assert (done["kind"], done["matched"], done["changed"]) == ("cancel", 1, 1)
    assert (await api.client.get(f"/v1/tasks/{resize}")).json()["status"] == "cancelled"
    assert (await api.client.get(f"/v1/tasks/{echo}")).json()["status"] == "queued"


async def test_dry_run_answers_the_count_at_once_and_changes_nothing(api: Api) -> None:
    task_ids = [await submit(api) for _ in range(2)]

    response = await api.client.post(
        "/v1/tasks/cancel", json={"status": "queued,pending", "dry_run": True}
    )

    assert response.status_code == 200
    assert response.json() == {"matched": 2, "changed": 0, "dry_run": True}
    for task_id in task_ids:
        assert (await api.client.get(f"/v1/tasks/{task_id}")).json()["status"] == "queued"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/tasks/retry", {}, "body"),
        ("/v1/tasks/cancel", {"dry_run": True}, "body"),
        # an empty status list names no status (it never means "any status")
        ("/v1/tasks/retry", {"status": []}, "status"),
        ("/v1/tasks/cancel", {"status": [], "kind": "echo"}, "status"),
        ("/v1/tasks/cancel", {"status": "finished"}, "status"),
        ("/v1/tasks/retry", {"status": ["failed", "nope"]}, "status"),
        ("/v1/tasks/cancel", {"state": "failed"}, "state"),
        ("/v1/tasks/retry", {"status": "failed", "limit": 10}, "limit"),
        ("/v1/tasks/cancel", {"kind": "has space"}, "kind"),
        ("/v1/tasks/retry", {"job_id": "not-a-uuid"}, "job_id"),
        ("/v1/tasks/cancel", {"priority": "UPPER"}, "priority"),
        ("/v1/tasks/retry", {"since": "yesterday"}, "since"),
        (
            "/v1/tasks/cancel",
            {"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"},
            "until",
        ),
        ("/v1/tasks/retry", {"status": 3}, "status"),
        ("/v1/tasks/cancel", {"status": "failed", "dry_run": "yes"}, "dry_run"),
        # statuses the action never changes: every match would be skipped
        ("/v1/tasks/retry", {"status": "completed"}, "status"),
        ("/v1/tasks/retry", {"status": ["failed", "queued"]}, "status"),
        ("/v1/tasks/cancel", {"status": "completed,failed"}, "status"),
        ("/v1/tasks/cancel", {"status": "cancelled", "dry_run": True}, "status"),
    ],
)
async def test_bad_bodies_are_400_naming_the_field(
    api: Api, path: str, body: dict[str, Any], field: str
) -> None:
    task_id = await submit(api)

    response = await api.client.post(path, json=body)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert (await api.client.get(f"/v1/tasks/{task_id}")).json()["status"] == "queued"


async def test_a_body_that_is_not_a_json_object_is_400(api: Api) -> None:
    response = await api.client.post("/v1/tasks/retry", json=["failed"])
    assert response.status_code == 400


async def test_operations_route_answers_404_and_400(api: Api) -> None:
    unknown = await api.client.get(f"/v1/operations/{uuid4()}")
    malformed = await api.client.get("/v1/operations/nope")

    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "operation_not_found"
    assert malformed.status_code == 400
    assert malformed.json()["error"]["field"] == "id"


async def test_the_single_task_routes_still_answer_beside_the_bulk_ones(api: Api) -> None:
    task_id = await submit(api)

    response = await api.client.post(f"/v1/tasks/{task_id}/cancel")

    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
