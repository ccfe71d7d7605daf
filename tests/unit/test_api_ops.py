"""Operational routes of the HTTP API: /healthz, /metrics, /v1/workers, /schema (spec §7, §9)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.health import HealthService
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.metrics import OrchestratorMetrics, WorkerMetrics, new_registry
from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


# --- /healthz ---------------------------------------------------------------------------------


async def test_healthz_is_200_when_both_backends_answer(api: Api) -> None:
    response = await api.client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"store": "ok", "queue": "ok"}}


class DownStore(InMemoryStore):
    """A store whose ping fails the way a real adapter reports an outage."""

    async def ping(self) -> None:
        raise BackendUnavailable("connection refused")


class DownQueue(InMemoryQueue):
    async def ping(self) -> None:
        raise BackendUnavailable("redis timed out")


@pytest.mark.parametrize(
    ("store_down", "queue_down", "failing"),
    [(True, False, {"store"}), (False, True, {"queue"}), (True, True, {"store", "queue"})],
)
async def test_healthz_is_503_naming_the_failed_backend(
    store_down: bool, queue_down: bool, failing: set[str]
) -> None:
    clock = FakeClock()
    store = (DownStore if store_down else InMemoryStore)(clock)
    queue = (DownQueue if queue_down else InMemoryQueue)(clock)
    async with running_api(health=HealthService(store=store, queue=queue)) as api:
        response = await api.client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert {name for name, state in body["checks"].items() if state != "ok"} == failing
    if store_down:
        assert "connection refused" in body["checks"]["store"]


# --- /metrics ---------------------------------------------------------------------------------


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_metrics_is_prometheus_text_with_process_and_orchestrator_metrics(api: Api) -> None:
    response = await api.client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = set(families(response.text))
    assert {"process_cpu_seconds", "python_gc_objects_collected", "python_info"} <= names
    assert {
        "orchestrator_tasks_submitted",
        "orchestrator_jobs_submitted",
        "orchestrator_reconcile_runs",
        "orchestrator_reconcile_duration_seconds",
    } <= names


async def test_metrics_label_requests_by_route_template_and_status(api: Api) -> None:
    created = await api.client.post("/v1/tasks", json={"kind": "echo"})
    task_id = created.json()["task_id"]
    await api.client.get(f"/v1/tasks/{task_id}")
    await api.client.get("/v1/tasks/not-a-uuid")
    await api.client.get("/no/such/route")
    await api.client.delete(f"/v1/jobs/{task_id}")

    text = (await api.client.get("/metrics")).text

    samples = {
        (s.labels["method"], s.labels["route"], s.labels["status"]): s.value
        for s in families(text)["orchestrator_http_requests"].samples
        if s.name == "orchestrator_http_requests_total"
    }
    assert samples[("POST", "/v1/tasks", "201")] == 1
    assert samples[("GET", "/v1/tasks/{id}", "200")] == 1
    assert samples[("GET", "/v1/tasks/{id}", "400")] == 1
    assert samples[("GET", "unmatched", "404")] == 1
    assert samples[("DELETE", "unmatched", "405")] == 1
    assert not any(task_id in route or "not-a-uuid" in route for _, route, _ in samples)
    duration = api.sample(
        "orchestrator_http_request_duration_seconds_count",
        {"method": "GET", "route": "/v1/tasks/{id}"},
    )
    assert duration == 2


async def test_each_app_has_its_own_registry() -> None:
    async with running_api() as first, running_api() as second:
        await first.client.post("/v1/tasks", json={"kind": "echo"})

        assert first.sample("orchestrator_tasks_submitted_total") == 1
        assert second.sample("orchestrator_tasks_submitted_total") == 0


def test_worker_metrics_live_beside_orchestrator_metrics_in_one_registry() -> None:
    registry = new_registry()
    OrchestratorMetrics(registry)
    worker = WorkerMetrics(registry)

    worker.tasks_claimed.labels(kind="echo").inc()
    worker.handler_duration.labels(kind="echo").observe(0.2)
    worker.shutdowns.labels(reason="signal").inc()

    assert registry.get_sample_value("worker_tasks_claimed_total", {"kind": "echo"}) == 1
    assert registry.get_sample_value("worker_handler_duration_seconds_count", {"kind": "echo"})
    assert registry.get_sample_value("worker_shutdowns_total", {"reason": "signal"}) == 1


# --- /v1/workers ------------------------------------------------------------------------------


async def test_workers_lists_those_seen_within_the_default_two_minutes(api: Api) -> None:
    await api.services.worker.registry.heartbeat("old", "host-a", {})
    api.clock.advance(150)
    await api.services.worker.registry.heartbeat("new", "host-b", {"kinds": ["echo"]})

    response = await api.client.get("/v1/workers")

    assert response.status_code == 200
    workers = response.json()["workers"]
    assert [w["id"] for w in workers] == ["new"]
    assert workers[0]["hostname"] == "host-b"
    assert workers[0]["metadata"] == {"kinds": ["echo"]}
    assert workers[0]["redis_key_prefix"] == "{dto}:"  # the default REDIS_KEY_PREFIX's tag
    assert set(workers[0]) == {
        "id",
        "hostname",
        "last_heartbeat_at",
        "metadata",
        "redis_key_prefix",
    }


@pytest.mark.parametrize(("window", "expected"), [("5m", {"old", "new"}), ("90s", {"new"})])
async def test_active_since_widens_or_narrows_the_window(
    api: Api, window: str, expected: set[str]
) -> None:
    await api.services.worker.registry.heartbeat("old", None, {})
    api.clock.advance(150)
    await api.services.worker.registry.heartbeat("new", None, {})

    response = await api.client.get("/v1/workers", params={"active_since": window})

    assert {w["id"] for w in response.json()["workers"]} == expected


@pytest.mark.parametrize(
    "window",
    [
        *("0s", "-5m", "abc", "", "5", "1d", "5m junk", "1e3s", "\uff15m", "1\u0665s"),
        *(" 5m", "5m ", "-1ns", "2562047h47m16.5s", "2562047h47m17s"),  # exact, as in a body
    ],
)
async def test_active_since_must_be_a_positive_duration(api: Api, window: str) -> None:
    response = await api.client.get("/v1/workers", params={"active_since": window})

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("validation_error", "active_since")


@pytest.mark.parametrize("window", ["1h30m", "1.5h", "300ms", "2562047h", "1ns", "2562047h47m16s"])
async def test_active_since_accepts_go_durations(api: Api, window: str) -> None:
    response = await api.client.get("/v1/workers", params={"active_since": window})

    assert response.status_code == 200


# --- /schema ----------------------------------------------------------------------------------


async def test_openapi_document_lists_every_route_with_its_error_responses(api: Api) -> None:
    response = await api.client.get("/schema/openapi.json")

    assert response.status_code == 200
    document = response.json()
    assert document["info"]["title"] == "dtq"
    assert document["info"]["version"]
    operations = {
        (method.upper(), path): set(operation["responses"])
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    assert operations == {
        ("GET", "/healthz"): {"200", "503", "500"},
        ("GET", "/metrics"): {"200", "500"},
        ("POST", "/v1/tasks"): {"201", "200", "400", "409", "413", "415", "500", "503"},
        ("GET", "/v1/tasks/{id}"): {"200", "400", "404", "500", "503"},
        ("POST", "/v1/jobs"): {"201", "200", "400", "409", "413", "415", "500", "503"},
        ("GET", "/v1/jobs/{id}"): {"200", "400", "404", "500", "503"},
        ("GET", "/v1/jobs/{id}/results"): {"200", "400", "404", "500", "503"},
        ("POST", "/v1/webhooks"): {"201", "400", "413", "415", "500", "503"},  # issue 16 item 2
        ("GET", "/v1/webhooks"): {"200", "500", "503"},
        ("DELETE", "/v1/webhooks/{id}"): {"204", "400", "404", "500", "503"},
        ("GET", "/v1/webhooks/{id}/deliveries"): {"200", "400", "404", "500", "503"},
        ("POST", "/v1/tasks/{id}/cancel"): {"200", "400", "404", "409", "500", "503"},
        ("POST", "/v1/tasks/{id}/retry"): {"200", "400", "404", "409", "500", "503"},
        ("POST", "/v1/jobs/{id}/cancel"): {"200", "400", "404", "409", "500", "503"},
        ("GET", "/v1/workers"): {"200", "400", "500", "503"},
        ("GET", "/v1/tasks"): {"200", "400", "500", "503"},  # listing (issue 14 item 5)
        ("GET", "/v1/jobs"): {"200", "400", "500", "503"},
        ("POST", "/v1/artifacts"): {"201", "413", "500", "503"},
        ("GET", "/v1/artifacts/{id}"): {"200", "400", "404", "416", "500", "503"},
        ("POST", "/v1/worker/claim"): {"200", "204", "400", "413", "415", "500", "503"},
        ("POST", "/v1/worker/runs/{run_id}/heartbeat"): {
            "200",
            "400",
            "404",
            "409",
            "413",
            "415",
            "500",
            "503",
        },
        ("POST", "/v1/worker/runs/{run_id}/result"): {
            "200",
            "400",
            "404",
            "409",
            "413",
            "415",
            "500",
            "503",
        },
        ("POST", "/v1/worker/runs/{run_id}/failure"): {
            "200",
            "400",
            "404",
            "409",
            "413",
            "415",
            "500",
            "503",
        },
        ("POST", "/v1/worker/runs/{run_id}/release"): {
            "200",
            "400",
            "404",
            "409",
            "413",
            "415",
            "500",
            "503",
        },
        ("POST", "/v1/worker/registry"): {"204", "400", "413", "415", "500", "503"},
        ("POST", "/v1/worker/registry/remove"): {"204", "400", "413", "415", "500", "503"},
        ("POST", "/v1/worker/results"): {"200", "400", "413", "415", "500", "503"},
        ("HEAD", "/v1/artifacts/{id}"): {"200", "400", "404", "500", "503"},
        ("GET", "/v1/tasks/{id}/explain"): {"200", "400", "404", "500", "503"},
        # bulk operations (issue 14 item 6): 202 the operation, 200 a dry run
        ("POST", "/v1/tasks/cancel"): {"202", "200", "400", "409", "413", "415", "500", "503"},
        ("POST", "/v1/tasks/retry"): {"202", "200", "400", "409", "413", "415", "500", "503"},
        ("GET", "/v1/operations/{id}"): {"200", "400", "404", "500", "503"},
        ("GET", "/v1/events"): {"200", "400", "404", "500", "503"},  # issue 16 item 1
    }
    error_ref = document["paths"]["/v1/jobs"]["post"]["responses"]["400"]["content"][
        "application/json"
    ]["schema"]["$ref"]
    assert error_ref.endswith("/ErrorBody")


async def test_openapi_documents_constraints_and_the_idempotency_header(api: Api) -> None:
    document = (await api.client.get("/schema/openapi.json")).json()

    schemas = document["components"]["schemas"]
    task_schema = schemas["TaskSpecRequest"]["properties"]
    assert task_schema["kind"]["maxLength"] == 200
    assert task_schema["max_attempts"]["maximum"] == 100
    assert task_schema["depends_on"]["items"]["pattern"] == task_schema["name"]["pattern"]
    for request in ("SubmitTaskRequest", "SubmitJobRequest", "TaskSpecRequest"):
        assert schemas[request]["additionalProperties"] is False
    assert "additionalProperties" not in schemas["TaskDetailBody"]
    id_parameter = document["paths"]["/v1/tasks/{id}"]["get"]["parameters"][0]
    assert id_parameter["schema"]["format"] == "uuid"
    parameters = document["paths"]["/v1/jobs"]["post"]["parameters"]
    assert [(p["name"], p["in"]) for p in parameters] == [
        ("Idempotency-Key", "header"),
        ("traceparent", "header"),  # issue 16 item 5
    ]


async def test_schema_ui_is_served(api: Api) -> None:
    response = await api.client.get("/schema")

    assert response.status_code == 200
