"""Explain (issue 14 item 7): each reason code in a staged situation, on the memory adapters
through ``GET /v1/tasks/{id}/explain`` (FakeClock; decision order in application/explain.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from dtq.application.ports import QueueSnapshot
from dtq.application.registry import WorkerRegistryService
from dtq.domain.errors import BackendUnavailable
from tests.single import claim_one, complete_one, pop_one
from tests.unit.api_harness import Api, running_api

ECHO = {"kinds": ["echo"], "priorities": ["default"]}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def live_worker(api: Api, metadata: dict[str, Any] = ECHO, worker: str = "w1") -> None:
    await api.services.worker.registry.heartbeat(worker, "host", metadata)


async def submit(api: Api, **body: Any) -> UUID:
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **body})
    assert response.status_code == 201, response.text
    return UUID(response.json()["task_id"])


async def explain(api: Api, task_id: UUID | str) -> dict[str, Any]:
    response = await api.client.get(f"/v1/tasks/{task_id}/explain")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"task_id", "status", "reason", "message", "details"}
    assert body["task_id"] == str(task_id)
    return body


# --- terminal ---------------------------------------------------------------------------------


async def test_a_completed_task_is_terminal_with_its_last_run(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api)
    popped = await pop_one(api.queue, ["default"], 0)
    claim = await claim_one(api.services.worker.execution, task_id, "w1")
    assert popped == task_id and claim is not None
    await complete_one(api.services.worker.execution, claim)

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("completed", "terminal")
    assert body["details"]["status"] == "completed"
    assert body["details"]["finished_at"] is not None
    assert body["details"]["last_run"] == {
        "id": str(claim.run.id),
        "status": "succeeded",
        "error": None,
    }


async def test_a_failed_task_is_terminal_with_its_last_error(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api, max_attempts=1)
    await pop_one(api.queue, ["default"], 0)
    claim = await claim_one(api.services.worker.execution, task_id, "w1")
    assert claim is not None
    await api.services.worker.execution.fail(claim, "boom")

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("failed", "terminal")
    assert body["details"]["last_error"] == "boom"
    assert "boom" in body["message"]


# --- waiting_on_dependencies ------------------------------------------------------------------


async def test_a_pending_dependent_names_each_dependency_and_its_status(api: Api) -> None:
    await live_worker(api)
    response = await api.client.post(
        "/v1/jobs",
        json={
            "tasks": [
                {"name": "a", "kind": "echo"},
                {"name": "b", "kind": "echo"},
                {"name": "c", "kind": "echo", "depends_on": ["a", "b"]},
            ]
        },
    )
    ids = response.json()["tasks"]
    await pop_one(api.queue, ["default"], 0)
    claim = await claim_one(api.services.worker.execution, UUID(ids["a"]), "w1")
    assert claim is not None
    await complete_one(api.services.worker.execution, claim)

    body = await explain(api, ids["c"])

    assert (body["status"], body["reason"]) == ("pending", "waiting_on_dependencies")
    assert body["details"]["dependencies"] == [
        {"task_id": ids["a"], "name": "a", "status": "completed"},
        {"task_id": ids["b"], "name": "b", "status": "queued"},
    ]
    assert body["details"]["waiting_on"] == ["b"]


# --- scheduled --------------------------------------------------------------------------------


async def test_a_delayed_task_is_scheduled_until_its_due_time(api: Api) -> None:
    task_id = await submit(api, delay="90s")  # no worker either: scheduled comes first

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("queued", "scheduled")
    due = datetime.fromisoformat(body["details"]["scheduled_at"])
    assert due == api.clock.now() + timedelta(seconds=90)
    assert body["details"]["due_in"] == pytest.approx(90)
    assert body["message"] == f"scheduled: due at {due.isoformat()}"


async def test_a_task_given_run_at_is_scheduled_without_being_called_a_delay(api: Api) -> None:
    due = api.clock.now() + timedelta(hours=1)
    task_id = await submit(api, run_at=due.isoformat())

    body = await explain(api, task_id)

    assert body["reason"] == "scheduled"
    assert datetime.fromisoformat(body["details"]["scheduled_at"]) == due
    # the task keeps its due time only, not whether run_at or delay set it
    assert body["message"] == f"scheduled: due at {due.isoformat()}"


async def test_a_retry_waiting_out_its_backoff_is_scheduled(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api, retry={"delay": "10m"})
    await pop_one(api.queue, ["default"], 0)
    claim = await claim_one(api.services.worker.execution, task_id, "w1")
    assert claim is not None
    await api.services.worker.execution.fail(claim, "flaky")

    body = await explain(api, task_id)

    assert body["reason"] == "scheduled"
    assert body["details"]["attempt"] == 1
    assert body["message"].startswith("scheduled: due at ")
    assert body["message"].endswith("(a retry's backoff)")


# --- queued_no_worker -------------------------------------------------------------------------


async def test_no_live_worker_at_all_misses_priority_and_kind(api: Api) -> None:
    task_id = await submit(api)

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("queued", "queued_no_worker")
    assert body["details"]["missing"] == ["priority", "kind"]
    assert body["details"]["live_workers"] == 0


async def test_a_priority_nobody_polls_is_queued_no_worker(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api, priority="bulk")

    body = await explain(api, task_id)

    assert body["reason"] == "queued_no_worker"
    assert body["details"]["missing"] == ["priority"]
    assert "'bulk'" in body["message"]


async def test_a_kind_no_poller_of_its_priority_registered_is_queued_no_worker(api: Api) -> None:
    await live_worker(api, {"kinds": ["other"], "priorities": ["default"]})
    await live_worker(api, {"kinds": ["echo"], "priorities": ["high"]}, worker="w2")
    task_id = await submit(api)

    body = await explain(api, task_id)

    assert body["reason"] == "queued_no_worker"
    assert body["details"]["missing"] == ["kind"]


async def test_a_worker_silent_past_the_live_window_does_not_count(api: Api) -> None:
    await live_worker(api)
    api.clock.advance(121)  # GET /v1/workers' default window is 2m
    task_id = await submit(api)

    assert (await explain(api, task_id))["reason"] == "queued_no_worker"


async def test_a_worker_on_another_redis_key_prefix_does_not_count(api: Api) -> None:
    """It pops another deployment's lists (a mistyped REDIS_KEY_PREFIX): nothing it registered
    serves this queue's tasks."""
    typo = WorkerRegistryService(store=api.services.store, queue_prefix="{typo}:")
    await typo.heartbeat("w-typo", "host", ECHO)
    task_id = await submit(api)

    body = await explain(api, task_id)

    assert body["reason"] == "queued_no_worker"
    assert body["details"]["live_workers"] == 0


# --- queued, delivery_in_flight ---------------------------------------------------------------


async def test_a_served_task_on_its_ready_list_is_queued_with_depth_and_position(api: Api) -> None:
    await live_worker(api)
    first = await submit(api)
    second = await submit(api)
    third = await submit(api)

    body = await explain(api, second)

    assert (body["status"], body["reason"]) == ("queued", "queued")
    assert body["details"]["ready_depth"] == 3
    assert body["details"]["position"] == 1
    assert body["details"]["on_ready_list"] is True
    assert (await explain(api, first))["details"]["position"] == 0
    assert (await explain(api, third))["details"]["position"] == 2


async def test_a_popped_unclaimed_task_is_a_delivery_in_flight_with_its_marker_ttl(
    api: Api,
) -> None:
    await live_worker(api)
    task_id = await submit(api)
    assert await pop_one(api.queue, ["default"], 0) == task_id
    api.clock.advance(5)

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("queued", "delivery_in_flight")
    ttl = api.services.settings.pending_marker_ttl - 5
    assert body["details"]["marker_ttl"] == pytest.approx(ttl)


async def test_a_queued_task_redis_lost_is_queued_on_no_ready_list(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api)
    api.queue.flush()

    body = await explain(api, task_id)

    assert body["reason"] == "queued"
    assert body["details"]["on_ready_list"] is False
    assert body["details"]["position"] is None
    assert "reconciler" in body["message"]


# --- running, lease_lost ----------------------------------------------------------------------


async def test_a_claimed_task_is_running_with_worker_run_and_lease_deadline(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api)
    await pop_one(api.queue, ["default"], 0)
    claim = await claim_one(api.services.worker.execution, task_id, "w1")
    assert claim is not None
    lease = api.queue.get_lease(task_id)
    assert lease is not None

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("running", "running")
    assert body["details"]["worker_id"] == "w1"
    assert body["details"]["run_id"] == str(claim.run.id)
    deadline = datetime.fromisoformat(body["details"]["lease_deadline"])
    assert deadline == datetime.fromtimestamp(lease.deadline_ms / 1000, UTC)


async def test_a_running_task_past_its_lease_deadline_says_the_lease_ran_out(api: Api) -> None:
    await live_worker(api)
    task_id = await submit(api)
    await pop_one(api.queue, ["default"], 0)
    assert await claim_one(api.services.worker.execution, task_id, "w1") is not None
    api.clock.advance(api.services.settings.lease_duration + 0.5)  # the key lives a while more

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("running", "running")
    deadline = datetime.fromisoformat(body["details"]["lease_deadline"])
    assert f"lease ran out at {deadline.isoformat()} without a renewal" in body["message"]
    assert "reconciler reclaims the run" in body["message"]


async def test_a_running_task_whose_lease_expired_is_lease_lost_with_its_reclaim_time(
    api: Api,
) -> None:
    await live_worker(api)
    task_id = await submit(api)
    await pop_one(api.queue, ["default"], 0)
    claim = await claim_one(api.services.worker.execution, task_id, "w1")
    assert claim is not None
    started = (await api.services.api.queries.get_task(task_id)).task.started_at
    assert started is not None
    api.clock.advance(api.services.settings.lease_duration * 3)  # the lease lapses

    body = await explain(api, task_id)

    assert (body["status"], body["reason"]) == ("running", "lease_lost")
    assert body["details"]["worker_id"] == "w1"
    assert body["details"]["run_id"] == str(claim.run.id)
    reclaim_after = datetime.fromisoformat(body["details"]["reclaim_after"])
    assert reclaim_after == started + timedelta(seconds=api.services.settings.stale_running_after)


# --- errors -----------------------------------------------------------------------------------


async def test_unknown_and_malformed_ids_are_404_and_400(api: Api) -> None:
    unknown = await api.client.get(f"/v1/tasks/{uuid4()}/explain")
    malformed = await api.client.get("/v1/tasks/nope/explain")

    assert unknown.status_code == 404
    assert unknown.json()["error"]["field"] == "id"
    assert malformed.status_code == 400
    assert malformed.json()["error"]["field"] == "id"


async def test_a_redis_outage_is_503_only_for_the_codes_that_read_redis(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await live_worker(api)
    queued = await submit(api)
    delayed = await submit(api, delay="1h")

    async def down(task_id: UUID, priority: str, kind: str | None = None) -> QueueSnapshot:
        raise BackendUnavailable("redis inspect failed: ConnectionError")

    monkeypatch.setattr(api.queue, "inspect", down)  # the memory queue is its own inspector
    outage = await api.client.get(f"/v1/tasks/{queued}/explain")

    assert outage.status_code == 503
    assert outage.json()["error"]["code"] == "backend_unavailable"
    assert (await explain(api, delayed))["reason"] == "scheduled"  # read from the database only
