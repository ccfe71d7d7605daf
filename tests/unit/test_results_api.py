"""Reading results over HTTP (issue 13 item 2): ``GET /v1/tasks/{id}`` and
``GET /v1/jobs/{id}/results`` (submission order, keyset pages, 400/404 as for the job)."""

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


async def complete(api: Api, task_id: str, result: Any) -> None:
    claims = await api.services.worker.execution.claim_many([UUID(task_id)], "w1")
    assert len(claims) == 1
    await api.services.worker.execution.complete_many(claims, [result])


async def submit(api: Api, names: list[str], **deps: list[str]) -> dict[str, Any]:
    tasks = [{"name": n, "kind": "echo", "depends_on": deps.get(n, [])} for n in names]
    response = await api.client.post("/v1/jobs", json={"tasks": tasks})
    assert response.status_code == 201
    body: dict[str, Any] = response.json()
    return body


async def test_get_task_carries_the_result_once_completed(api: Api) -> None:
    created = (await api.client.post("/v1/tasks", json={"kind": "echo"})).json()
    before = (await api.client.get(f"/v1/tasks/{created['task_id']}")).json()

    await complete(api, created["task_id"], {"answer": [4, 2]})
    after = (await api.client.get(f"/v1/tasks/{created['task_id']}")).json()

    assert before["result"] is None
    assert after["status"] == "completed"
    assert after["result"] == {"answer": [4, 2]}


async def test_job_results_are_listed_in_submission_order(api: Api) -> None:
    names = ["zeta", "alpha", "mid", "b"]  # not alphabetical: the order is the submission's
    created = await submit(api, names, b=["zeta"])
    await complete(api, created["tasks"]["zeta"], "z")
    await complete(api, created["tasks"]["alpha"], None)

    response = await api.client.get(f"/v1/jobs/{created['job_id']}/results")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"job_id", "status", "results", "next_cursor"}
    assert body["job_id"] == created["job_id"]
    assert body["status"] == "running"
    assert body["next_cursor"] is None
    assert body["results"] == [
        {"name": "zeta", "task_id": created["tasks"]["zeta"], "status": "completed", "result": "z"},
        {
            "name": "alpha",
            "task_id": created["tasks"]["alpha"],
            "status": "completed",
            "result": None,
        },
        {"name": "mid", "task_id": created["tasks"]["mid"], "status": "queued", "result": None},
        {"name": "b", "task_id": created["tasks"]["b"], "status": "queued", "result": None},
    ]


async def test_job_results_page_through_the_job_with_the_cursor(api: Api) -> None:
    names = [f"t{i:02d}" for i in range(7)][::-1]
    created = await submit(api, names)
    url = f"/v1/jobs/{created['job_id']}/results"

    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params = {"limit": "3"} if cursor is None else {"limit": "3", "cursor": cursor}
        body = (await api.client.get(url, params=params)).json()
        pages += 1
        assert len(body["results"]) <= 3
        seen.extend(r["name"] for r in body["results"])
        cursor = body["next_cursor"]
        if cursor is None:
            break

    assert seen == names
    assert pages == 3


async def test_results_of_an_unknown_job_are_404(api: Api) -> None:
    response = await api.client.get(f"/v1/jobs/{uuid4()}/results")
    assert response.status_code == 404
    assert response.json()["error"]["field"] == "id"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"cursor": "nonsense"}, "cursor"),
        ({"cursor": "1.zz"}, "cursor"),
        # One past int64: the database's BIGINT cannot hold it (a 500 on PostgreSQL).
        ({"cursor": f"{2**63}.{'0' * 32}"}, "cursor"),
        ({"cursor": f"{'9' * 40}.{'0' * 32}"}, "cursor"),
    ],
)
async def test_bad_paging_parameters_are_400_naming_the_field(
    api: Api, query: dict[str, str], field: str
) -> None:
    created = await submit(api, ["a"])
    response = await api.client.get(f"/v1/jobs/{created['job_id']}/results", params=query)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


async def test_results_of_a_malformed_id_are_400(api: Api) -> None:
    response = await api.client.get("/v1/jobs/not-a-uuid/results")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "id"


async def test_the_results_route_is_in_the_openapi_document(api: Api) -> None:
    schema = (await api.client.get("/schema/openapi.json")).json()
    route = schema["paths"]["/v1/jobs/{id}/results"]["get"]
    assert {p["name"] for p in route["parameters"]} >= {"id", "limit", "cursor"}
    assert {"200", "400", "404"} <= set(route["responses"])


@pytest.mark.parametrize("route", ["/v1/jobs/{id}", "/v1/jobs/{id}/results"])
@pytest.mark.parametrize(
    ("query", "field"),
    [
        # A misspelt page size returned the whole job (every task) with a 200.
        ([("limt", "2")], "limt"),
        ([("limit", "1"), ("limit", "2")], "limit"),
    ],
)
async def test_an_unknown_or_repeated_parameter_is_400_naming_it(
    api: Api, route: str, query: Any, field: str
) -> None:
    created = await submit(api, ["a", "b", "c"])
    response = await api.client.get(route.format(id=created["job_id"]), params=query)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("route", "query", "field"),
    [
        ("/v1/tasks/{task}", [("foo", "1")], "foo"),
        ("/v1/tasks/{task}/explain", [("verbose", "1")], "verbose"),
        # a misspelt window listed the default one with a 200
        ("/v1/workers", [("activ_since", "5m")], "activ_since"),
        ("/v1/workers", [("active_since", "5m"), ("active_since", "1h")], "active_since"),
    ],
)
async def test_reads_refuse_a_query_parameter_they_do_not_take(
    api: Api, route: str, query: Any, field: str
) -> None:
    created = await submit(api, ["a"])
    url = route.format(task=created["tasks"]["a"])
    response = await api.client.get(url, params=query)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert (await api.client.get(url)).status_code == 200


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"kind": "Bad Kind!"}, "kind", "letters, digits, '.', '_', ':' or '-' only"),
        ({"kind": "echo", "priority": "HIGH"}, "priority", "1 to 32 characters of a-z"),
    ],
)
async def test_a_refused_pattern_is_said_in_words_not_as_its_regex(
    api: Api, body: dict[str, Any], field: str, words: str
) -> None:
    response = await api.client.post("/v1/tasks", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert words in error["message"]
    assert "regex" not in error["message"] and "(?!" not in error["message"]
