"""Listing and counts over HTTP on the memory adapters (issue 14 item 5): ``GET /v1/tasks``,
``GET /v1/jobs``, ``counts`` and task pages on ``GET /v1/jobs/{id}``, and every bad input a 400
naming its field."""

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


async def submit(api: Api, name: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    response = await api.client.post("/v1/jobs", json={"name": name, "tasks": tasks})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def walk(api: Api, path: str, key: str, params: dict[str, str]) -> list[list[str]]:
    """Every page's ids, following ``next_cursor`` until it is null."""
    pages: list[list[str]] = []
    query = dict(params)
    while True:
        response = await api.client.get(path, params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([item["id"] for item in body[key]])
        if body["next_cursor"] is None:
            return pages
        query = {**params, "cursor": body["next_cursor"]}


async def seed(api: Api) -> list[dict[str, Any]]:
    """Three jobs: the first two at the same instant (a tie on created_at across jobs and, as
    always, inside each job), the third a second later; kinds alternate."""
    jobs = []
    for index in range(3):
        if index == 2:
            api.clock.advance(1)
        tasks = [
            {"name": f"t{i}", "kind": "even" if i % 2 == 0 else "odd", "priority": "high"}
            if index == 1
            else {"name": f"t{i}", "kind": "even" if i % 2 == 0 else "odd"}
            for i in range(4)
        ]
        jobs.append(await submit(api, "nightly" if index < 2 else "adhoc", tasks))
    return jobs


def newest_first(jobs: list[dict[str, Any]], names: list[str] | None = None) -> list[str]:
    """Task ids in the listing's order: ``(created_at, position, id)`` descending. The third job
    is the newest; the first two share their created_at, so their tasks interleave by position
    (then id)."""
    wanted = names or ["t0", "t1", "t2", "t3"]
    keys = [
        (1 if index == 2 else 0, int(name[1:]), UUID(job["tasks"][name]))
        for index, job in enumerate(jobs)
        for name in wanted
    ]
    return [str(key[2]) for key in sorted(keys, reverse=True)]


async def test_tasks_page_newest_first_with_no_duplicate_or_miss_across_ties(api: Api) -> None:
    jobs = await seed(api)
    want = newest_first(jobs)

    for limit in ("1", "5", "12", "500"):
        pages = await walk(api, "/v1/tasks", "tasks", {"limit": limit})
        assert [i for page in pages for i in page] == want, limit
        assert all(len(page) <= int(limit) for page in pages)
    assert [len(p) for p in await walk(api, "/v1/tasks", "tasks", {"limit": "5"})] == [5, 5, 2]


async def test_each_filter_selects_what_it_names(api: Api) -> None:
    jobs = await seed(api)
    claimed = await api.services.worker.execution.claim_many([UUID(jobs[0]["tasks"]["t0"])], "w")
    assert len(claimed) == 1

    async def ids(**params: str) -> list[str]:
        return [i for page in await walk(api, "/v1/tasks", "tasks", params) for i in page]

    assert await ids(kind="odd") == newest_first(jobs, ["t1", "t3"])
    assert await ids(job_id=jobs[1]["job_id"]) == [jobs[1]["tasks"][f"t{i}"] for i in (3, 2, 1, 0)]
    assert await ids(priority="high") == await ids(job_id=jobs[1]["job_id"])
    assert await ids(status="running") == [jobs[0]["tasks"]["t0"]]
    both = await ids(status="running,queued", kind="even")
    assert both == newest_first(jobs, ["t0", "t2"])  # all roots are queued, t0 of job 0 running
    assert await ids(status="running", **{"kind": "odd"}) == []
    later = "2026-01-01T00:00:01Z"  # the FakeClock starts at 2026-01-01T00:00:00Z
    assert await ids(since=later) == [jobs[2]["tasks"][f"t{i}"] for i in (3, 2, 1, 0)]
    assert await ids(until=later) == newest_first(jobs)[4:]
    assert await ids(since="2026-01-01T01:00:00+01:00", until=later) == newest_first(jobs)[4:]
    assert await ids(kind="never-used") == []


async def test_status_may_be_repeated_or_comma_separated(api: Api) -> None:
    jobs = await seed(api)
    await api.services.worker.execution.claim_many([UUID(jobs[2]["tasks"]["t2"])], "w")

    repeated = await api.client.get("/v1/tasks?status=running&status=pending")
    commas = await api.client.get("/v1/tasks?status=pending,running")

    assert repeated.json() == commas.json()
    assert [t["status"] for t in commas.json()["tasks"]] == ["running"]


async def test_a_listed_task_has_the_detail_fields_but_the_heavy_ones(api: Api) -> None:
    created = await api.client.post(
        "/v1/tasks", json={"kind": "echo", "payload": {"big": "x" * 500}, "timeout": "5s"}
    )
    task_id = created.json()["task_id"]

    listed = (await api.client.get("/v1/tasks")).json()["tasks"]
    detail = (await api.client.get(f"/v1/tasks/{task_id}")).json()

    assert len(listed) == 1
    heavy = {"payload", "result", "progress", "runs"}
    assert set(listed[0]) == set(detail) - heavy
    assert listed[0] == {k: v for k, v in detail.items() if k not in heavy}


async def test_jobs_page_newest_first_and_filter_by_status_and_name(api: Api) -> None:
    jobs = await seed(api)
    first_two = sorted((j["job_id"] for j in jobs[:2]), key=UUID, reverse=True)
    want = [jobs[2]["job_id"], *first_two]

    for limit in ("1", "2", "50"):
        pages = await walk(api, "/v1/jobs", "jobs", {"limit": limit})
        assert [i for page in pages for i in page] == want
    named = await walk(api, "/v1/jobs", "jobs", {"name": "nightly"})
    assert named == [first_two]
    pending = await walk(api, "/v1/jobs", "jobs", {"status": "pending,failed"})
    assert pending == [want]
    assert await walk(api, "/v1/jobs", "jobs", {"status": "completed"}) == [[]]
    unnamed = (
        await api.client.post("/v1/jobs", json={"tasks": [{"name": "a", "kind": "echo"}]})
    ).json()["job_id"]
    assert await walk(api, "/v1/jobs", "jobs", {"name": ""}) == [[unnamed]]
    body = (await api.client.get("/v1/jobs?limit=1")).json()["jobs"][0]
    assert set(body) == {"id", "name", "status", "metadata", "created_at", "updated_at"}


async def test_get_job_counts_every_status_and_pages_its_tasks_on_request(api: Api) -> None:
    created = await submit(
        api,
        "dag",
        [
            {"name": "a", "kind": "k"},
            {"name": "b", "kind": "k"},
            {"name": "c", "kind": "k", "depends_on": ["a"]},
        ],
    )
    await api.services.worker.execution.claim_many([UUID(created["tasks"]["a"])], "w")

    whole = (await api.client.get(f"/v1/jobs/{created['job_id']}")).json()
    first = (await api.client.get(f"/v1/jobs/{created['job_id']}?limit=2")).json()
    rest = (
        await api.client.get(
            f"/v1/jobs/{created['job_id']}", params={"limit": "2", "cursor": first["next_cursor"]}
        )
    ).json()

    assert whole["counts"] == {
        "pending": 1,
        "queued": 1,
        "running": 1,
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
    }
    assert (len(whole["tasks"]), whole["next_cursor"]) == (3, None)
    assert [t["name"] for t in first["tasks"]] == ["a", "b"]
    assert [t["name"] for t in rest["tasks"]] == ["c"]
    assert rest["next_cursor"] is None
    assert first["counts"] == whole["counts"] == rest["counts"]


BAD_TASK_QUERIES = [
    ("status=done", "status"),
    ("status=failed,", "status"),
    ("status=queued&status=nope", "status"),
    ("kind=has%20space", "kind"),
    ("kind=" + "k" * 201, "kind"),
    ("kind=a&kind=b", "kind"),
    ("job_id=42", "job_id"),
    ("priority=HIGH", "priority"),
    ("since=2026-01-01", "since"),
    ("since=2026-01-01T00:00:00", "since"),
    ("until=yesterday", "until"),
    ("since=2026-01-01T00:00:00%2B0100", "since"),  # ISO 8601, not RFC 3339: fromisoformat took it
    ("until=2026-W01-4T00:00:00Z", "until"),
    ("since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "until"),
    ("limit=0", "limit"),
    ("limit=501", "limit"),
    ("limit=-1", "limit"),
    ("limit=ten", "limit"),
    ("cursor=nope", "cursor"),
    ("cursor=1.2", "cursor"),  # a results cursor shape, not a task listing's
    ("cursor=99999999999999999999.0." + "0" * 32, "cursor"),
    ("cursor=1.2." + "z" * 32, "cursor"),
    ("stauts=failed", "stauts"),
]


@pytest.mark.parametrize(("query", "field"), BAD_TASK_QUERIES)
async def test_bad_task_listing_input_is_a_400_naming_the_field(
    api: Api, query: str, field: str
) -> None:
    response = await api.client.get(f"/v1/tasks?{query}")

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field


BAD_JOB_QUERIES = [
    ("status=queued", "status"),  # a task status, not a job status
    ("name=%01", "name"),
    ("since=noon", "since"),
    ("limit=1000", "limit"),
    ("cursor=1.2.00000000000000000000000000000000", "cursor"),  # a task cursor
    ("cursor=1.00000000000000000000000000000000", "cursor"),  # a job's task page cursor
    ("kind=echo", "kind"),
]


@pytest.mark.parametrize(("query", "field"), BAD_JOB_QUERIES)
async def test_bad_job_listing_input_is_a_400_naming_the_field(
    api: Api, query: str, field: str
) -> None:
    response = await api.client.get(f"/v1/jobs?{query}")

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("query", "field"),
    [("limit=0", "limit"), ("cursor=x", "cursor"), ("cursor=0." + "0" * 32, "cursor")],
)
async def test_bad_job_task_page_input_is_a_400(api: Api, query: str, field: str) -> None:
    created = await submit(api, "j", [{"name": "a", "kind": "k"}])

    response = await api.client.get(f"/v1/jobs/{created['job_id']}?{query}")

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field


async def test_a_cursor_of_another_paged_route_is_a_400_naming_cursor(api: Api) -> None:
    created = await submit(api, "j", [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k"}])
    await submit(api, "j", [{"name": "a", "kind": "k"}])
    job = f"/v1/jobs/{created['job_id']}"
    task_page = (await api.client.get(f"{job}?limit=1")).json()["next_cursor"]
    results_page = (await api.client.get(f"{job}/results?limit=1")).json()["next_cursor"]
    job_listing = (await api.client.get("/v1/jobs?limit=1")).json()["next_cursor"]
    task_listing = (await api.client.get("/v1/tasks?limit=1")).json()["next_cursor"]

    refused = [
        await api.client.get("/v1/jobs", params={"cursor": task_page}),
        await api.client.get("/v1/jobs", params={"cursor": results_page}),
        await api.client.get("/v1/jobs", params={"cursor": task_listing}),
        await api.client.get("/v1/tasks", params={"cursor": job_listing}),
        await api.client.get(job, params={"limit": "1", "cursor": job_listing}),
        await api.client.get(f"{job}/results", params={"cursor": job_listing}),
    ]

    assert [r.status_code for r in refused] == [400] * 6, [r.text for r in refused]
    assert {r.json()["error"]["field"] for r in refused} == {"cursor"}


async def test_an_empty_cursor_is_the_first_page_on_every_paged_route(api: Api) -> None:
    created = await submit(api, "j", [{"name": "a", "kind": "k"}])
    job = f"/v1/jobs/{created['job_id']}"

    for path in ("/v1/jobs", "/v1/tasks", f"{job}/results"):
        first = await api.client.get(path)
        empty = await api.client.get(f"{path}?cursor=")
        assert (empty.status_code, empty.json()) == (200, first.json()), path
    page = await api.client.get(f"{job}?limit=1&cursor=")
    assert page.status_code == 200
    assert page.json() == (await api.client.get(f"{job}?limit=1")).json()


async def test_an_unknown_job_is_still_a_404_with_a_page_size(api: Api) -> None:
    response = await api.client.get(f"/v1/jobs/{uuid4()}?limit=5")

    assert response.status_code == 404
