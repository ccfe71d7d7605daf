"""The HTTP API's happy paths (spec §7): submission, idempotency, reads, counters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import pytest

from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.entrypoints.api.commands import request_hash
from dtq.entrypoints.api.schemas import SubmitJobRequest, SubmitTaskRequest
from tests.single import claim_one, complete_one
from tests.unit.api_harness import JSON, Api, running_api

# The two request bodies of the seed README, byte for byte.
README_TASK = '{"kind":"echo","payload":{"msg":"hi"}}'
README_DAG = (
    '{"tasks":[{"name":"a","kind":"echo","payload":{"n":1}},'
    '{"name":"b","kind":"echo","payload":{"n":2},"depends_on":["a"]}]}'
)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


# --- POST /v1/tasks ---------------------------------------------------------------------------


async def echo_worker(api: Api) -> None:
    """A live worker serving ``echo`` on the default tier, as in the README (no warnings)."""
    metadata = {"kinds": ["echo"], "priorities": ["default"]}
    await api.services.worker.registry.heartbeat("w-echo", None, metadata)


async def test_readme_task_body_creates_a_queued_one_task_job(api: Api) -> None:
    await echo_worker(api)
    response = await api.client.post("/v1/tasks", content=README_TASK, headers=JSON)

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"task_id", "job_id"}
    task_id = UUID(body["task_id"])
    view = await api.services.api.queries.get_task(task_id)
    assert view.task.job_id == UUID(body["job_id"])
    assert view.task.name == view.task.kind == "echo"
    assert view.task.payload == {"msg": "hi"}
    assert view.task.status is TaskStatus.QUEUED
    assert api.queue.ready_ids("default") == [task_id]


async def test_task_defaults_are_null_payload_three_attempts_default_priority(api: Api) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "noop"})

    task = (await api.services.api.queries.get_task(UUID(response.json()["task_id"]))).task
    assert (task.payload, task.max_attempts, task.priority) == (None, 3, "default")


async def test_task_options_are_applied(api: Api) -> None:
    response = await api.client.post(
        "/v1/tasks",
        json={"kind": "email.send:v2", "payload": [1], "max_attempts": 7, "priority": "high"},
    )

    task_id = UUID(response.json()["task_id"])
    task = (await api.services.api.queries.get_task(task_id)).task
    assert (task.kind, task.max_attempts, task.priority) == ("email.send:v2", 7, "high")
    assert api.queue.ready_ids("high") == [task_id]


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (None, README_TASK),
        ("text/plain", README_TASK),
        ("text/plain", '{"kind": 1, "bogus": true}'),  # refused for its type, not its content
        ("application/x-www-form-urlencoded", "kind=echo&payload=x"),
        ("multipart/form-data; boundary=x", '--x\r\nContent-Disposition: form-data; name="k"'),
        ("+json", README_TASK),
        ("text/plain+json", README_TASK),
    ],
)
async def test_a_submission_not_declared_as_json_is_a_415(
    api: Api, content_type: str | None, body: str
) -> None:
    """A browser sends these (or none, for a typeless Blob) cross-site without a CORS preflight;
    the body is refused for its media type before it is even decoded, and nothing is stored."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path in ("/v1/tasks", "/v1/jobs"):
        response = await api.client.post(path, content=body, headers=headers)

        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert "Content-Type must be application/json" in error["message"]
    assert api.queue.ready_ids("default") == []


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "application/vnd.x+json", "APPLICATION/JSON"],
)
async def test_json_media_types_with_parameters_or_suffix_are_accepted(
    api: Api, content_type: str
) -> None:
    response = await api.client.post(
        "/v1/tasks", content=README_TASK, headers={"Content-Type": content_type}
    )

    assert response.status_code == 201


# --- POST /v1/jobs ----------------------------------------------------------------------------


async def test_readme_dag_body_queues_the_root_and_holds_the_dependent(api: Api) -> None:
    await echo_worker(api)
    response = await api.client.post("/v1/jobs", content=README_DAG, headers=JSON)

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"job_id", "tasks"}
    assert set(body["tasks"]) == {"a", "b"}
    ids = {name: UUID(value) for name, value in body["tasks"].items()}
    view = await api.services.api.queries.get_job(UUID(body["job_id"]))
    status = {task.name: task.status for task in view.tasks}
    assert status == {"a": TaskStatus.QUEUED, "b": TaskStatus.PENDING}
    assert api.queue.ready_ids("default") == [ids["a"]]


async def test_job_name_and_metadata_are_stored(api: Api) -> None:
    response = await api.client.post(
        "/v1/jobs",
        json={
            "name": "nightly report",
            "metadata": {"team": "ops", "n": [1, 2]},
            "tasks": [{"name": "a", "kind": "echo"}],
        },
    )

    job = (await api.services.api.queries.get_job(UUID(response.json()["job_id"]))).job
    assert job.name == "nightly report"
    assert job.metadata == {"team": "ops", "n": [1, 2]}


async def test_task_names_may_use_dots_colons_dashes_underscores(api: Api) -> None:
    response = await api.client.post(
        "/v1/jobs",
        json={
            "tasks": [
                {"name": "img:resize-1_x.v2", "kind": "k"},
                {"name": "B", "kind": "k", "depends_on": ["img:resize-1_x.v2"]},
            ]
        },
    )

    assert response.status_code == 201


async def test_a_job_with_the_maximum_number_of_tasks_is_accepted(api: Api) -> None:
    tasks = [{"name": f"t{i}", "kind": "k"} for i in range(20)]

    response = await api.client.post("/v1/jobs", json={"tasks": tasks})

    assert response.status_code == 201
    assert len(response.json()["tasks"]) == 20


# --- Idempotency-Key --------------------------------------------------------------------------


async def test_same_key_and_body_replays_the_original_ids_with_200(api: Api) -> None:
    headers = {**JSON, "Idempotency-Key": "order-42"}
    first = await api.client.post("/v1/jobs", content=README_DAG, headers=headers)

    again = await api.client.post("/v1/jobs", content=README_DAG, headers=headers)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert len(api.queue.ready_ids("default")) == 1  # nothing new was enqueued
    assert api.sample("orchestrator_jobs_submitted_total") == 1
    assert api.sample("orchestrator_tasks_submitted_total") == 2


async def test_replay_matches_an_equivalent_body_in_another_key_order(api: Api) -> None:
    headers = {"Idempotency-Key": "k-1"}
    first = await api.client.post("/v1/tasks", json={"kind": "echo"}, headers=headers)

    again = await api.client.post(
        "/v1/tasks",
        content='{ "payload": null, "max_attempts": 3, "kind": "echo" }',
        headers={**headers, **JSON},
    )

    assert again.status_code == 200
    assert again.json() == first.json()


async def test_same_key_with_another_body_is_a_409_conflict(api: Api) -> None:
    headers = {"Idempotency-Key": "k-2"}
    await api.client.post("/v1/tasks", json={"kind": "echo", "payload": 1}, headers=headers)

    response = await api.client.post(
        "/v1/tasks", json={"kind": "echo", "payload": 2}, headers=headers
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    assert api.sample("orchestrator_jobs_submitted_total") == 1


async def test_same_key_on_the_other_route_is_a_conflict(api: Api) -> None:
    headers = {"Idempotency-Key": "k-3"}
    await api.client.post("/v1/tasks", json={"kind": "a"}, headers=headers)

    response = await api.client.post(
        "/v1/jobs", json={"tasks": [{"name": "a", "kind": "a"}]}, headers=headers
    )

    assert response.status_code == 409


async def test_without_a_key_equal_bodies_create_two_jobs(api: Api) -> None:
    first = await api.client.post("/v1/tasks", content=README_TASK, headers=JSON)
    second = await api.client.post("/v1/tasks", content=README_TASK, headers=JSON)

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["job_id"] != second.json()["job_id"]


def test_request_hash_ignores_key_order_and_explicit_defaults() -> None:
    explicit = SubmitTaskRequest(kind="echo", payload={"b": 1, "a": 2}, max_attempts=3)
    implicit = SubmitTaskRequest(kind="echo", payload={"a": 2, "b": 1})

    assert request_hash("/v1/tasks", explicit) == request_hash("/v1/tasks", implicit)


def test_request_hash_depends_on_route_and_content() -> None:
    body = SubmitTaskRequest(kind="echo")

    assert request_hash("/v1/tasks", body) != request_hash("/v1/jobs", body)
    assert request_hash("/v1/tasks", body) != request_hash(
        "/v1/tasks", SubmitTaskRequest(kind="echo", payload=0)
    )
    assert len(request_hash("/v1/jobs", SubmitJobRequest(tasks=[]))) == 64


# --- GET /v1/tasks/{id} -----------------------------------------------------------------------


async def test_get_task_returns_every_documented_field(api: Api) -> None:
    created = await api.client.post("/v1/tasks", content=README_TASK, headers=JSON)
    ids = created.json()

    response = await api.client.get(f"/v1/tasks/{ids['task_id']}")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "id",
        "job_id",
        "name",
        "kind",
        "status",
        "priority",
        "payload",
        "attempt",
        "max_attempts",
        "scheduled_at",
        "started_at",
        "finished_at",
        "last_error",
        "created_at",
        "updated_at",
        "result",
        "progress",
        "retry",
        "timeout",
        "runs",
    }
    assert body["id"] == ids["task_id"]
    assert body["job_id"] == ids["job_id"]
    assert body["status"] == "queued"
    assert body["payload"] == {"msg": "hi"}
    assert (body["attempt"], body["max_attempts"]) == (0, 3)
    assert body["started_at"] is None
    assert body["runs"] == []
    assert body["created_at"].endswith("Z")


async def test_get_task_lists_runs_in_start_order_with_their_status(api: Api) -> None:
    created = await api.client.post("/v1/tasks", json={"kind": "flaky"})
    task_id = UUID(created.json()["task_id"])
    execution = api.services.worker.execution
    first = await claim_one(execution, task_id, "w1")
    assert first is not None
    await execution.fail(first, "boom")
    api.clock.advance(60)
    second = await claim_one(execution, task_id, "w2")
    assert second is not None
    await complete_one(execution, second)

    body = (await api.client.get(f"/v1/tasks/{task_id}")).json()

    assert body["status"] == "completed"
    assert body["attempt"] == 2
    runs = body["runs"]
    assert [r["worker_id"] for r in runs] == ["w1", "w2"]
    assert [r["status"] for r in runs] == [RunStatus.FAILED, RunStatus.SUCCEEDED]
    assert [r["attempt_number"] for r in runs] == [1, 2]
    assert runs[0]["error"] == "boom"
    assert runs[0]["started_at"] < runs[1]["started_at"]
    assert set(runs[0]) == {
        "id",
        "attempt_number",
        "worker_id",
        "status",
        "error",
        "started_at",
        "finished_at",
    }


# --- GET /v1/jobs/{id} ------------------------------------------------------------------------


async def test_get_job_returns_the_job_and_all_its_tasks_without_runs(api: Api) -> None:
    created = (await api.client.post("/v1/jobs", content=README_DAG, headers=JSON)).json()

    response = await api.client.get(f"/v1/jobs/{created['job_id']}")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "id",
        "name",
        "status",
        "metadata",
        "created_at",
        "updated_at",
        "tasks",
        "counts",  # issue 14 item 5
        "next_cursor",
    }
    assert body["id"] == created["job_id"]
    assert body["status"] == JobStatus.PENDING
    assert {t["name"]: t["id"] for t in body["tasks"]} == created["tasks"]
    assert all("runs" not in t and t["job_id"] == created["job_id"] for t in body["tasks"])


async def test_get_job_shows_progress(api: Api) -> None:
    created = (await api.client.post("/v1/jobs", content=README_DAG, headers=JSON)).json()
    claim = await claim_one(api.services.worker.execution, UUID(created["tasks"]["a"]), "w1")
    assert claim is not None
    await complete_one(api.services.worker.execution, claim)

    body = (await api.client.get(f"/v1/jobs/{created['job_id']}")).json()

    status = {t["name"]: t["status"] for t in body["tasks"]}
    assert status == {"a": "completed", "b": "queued"}
    assert body["status"] == "running"


# --- submission counters ----------------------------------------------------------------------


async def test_counters_count_created_jobs_and_tasks_only(api: Api) -> None:
    await api.client.post("/v1/tasks", content=README_TASK, headers=JSON)
    await api.client.post("/v1/jobs", content=README_DAG, headers=JSON)
    await api.client.post("/v1/jobs", json={"tasks": [{"name": "a", "kind": "k"}] * 2})  # 400

    assert api.sample("orchestrator_jobs_submitted_total") == 2
    assert api.sample("orchestrator_tasks_submitted_total") == 3
