"""The HTTP worker protocol (issue 15 item 1) through the ASGI app on the memory adapters:
claim (200/204/400), heartbeat, result, failure, replays, stale and foreign runs, kinds the
worker did not list, and a client that disconnects during a held claim."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest

from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.ports import LeaseState
from dtq.application.registry import WorkerRegistryService
from dtq.application.remote import RemoteWorkerService, RunNotOwned
from dtq.domain.errors import InvalidPayload
from dtq.entrypoints.worker.http import claim_from_wire
from tests.unit.api_harness import Api, http_scope, running_api

W1 = {"X-Worker-Id": "w1"}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def submit(api: Api, kind: str = "echo", **fields: Any) -> str:
    created = await api.client.post("/v1/tasks", json={"kind": kind, **fields})
    assert created.status_code == 201, created.text
    task_id: str = created.json()["task_id"]
    return task_id


async def submit_direct(api: Api) -> str:
    """Submit through the service (the test client serves one request at a time)."""
    result = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="echo", kind="echo"),))
    )
    return str(result.task_ids["echo"])


async def claim(api: Api, **fields: Any) -> Any:
    body = {"worker_id": "w1", "kinds": ["echo"], "wait": "0s", **fields}
    return await api.client.post("/v1/worker/claim", json=body)


async def task(api: Api, task_id: str) -> Any:
    return (await api.client.get(f"/v1/tasks/{task_id}")).json()


async def test_claim_returns_the_task_running_with_its_run_lease_and_no_marker(api: Api) -> None:
    task_id = await submit(api, payload={"n": 1})

    response = await claim(api, max=10)

    assert response.status_code == 200, response.text
    [claimed] = response.json()["tasks"]
    assert claimed["task_id"] == task_id
    assert (claimed["kind"], claimed["payload"], claimed["attempt"]) == ("echo", {"n": 1}, 1)
    assert (claimed["parents"], claimed["checkpoint"], claimed["timeout"]) == ({}, None, None)
    stored = await task(api, task_id)
    assert stored["status"] == "running"
    assert stored["runs"][0]["id"] == claimed["run_id"]
    assert stored["runs"][0]["worker_id"] == "w1"
    lease = api.queue.get_lease(UUID(task_id))
    assert lease is not None and str(lease.run_id) == claimed["run_id"]
    assert not api.queue.has_marker(UUID(task_id))


async def test_claim_answers_204_when_nothing_arrives_within_wait(api: Api) -> None:
    response = await claim(api, wait="50ms")

    assert (response.status_code, response.content) == (204, b"")


async def test_claim_gives_parents_results_and_the_task_timeout(api: Api) -> None:
    job = await api.client.post(
        "/v1/jobs",
        json={
            "tasks": [
                {"name": "a", "kind": "echo"},
                {"name": "b", "kind": "echo", "depends_on": ["a"], "timeout": "90s"},
            ]
        },
    )
    assert job.status_code == 201
    [first] = (await claim(api)).json()["tasks"]
    done = await api.client.post(
        f"/v1/worker/runs/{first['run_id']}/result", json={"result": {"x": 1}}, headers=W1
    )
    assert done.status_code == 200

    [second] = (await claim(api)).json()["tasks"]

    assert second["parents"] == {"a": {"x": 1}}
    assert second["timeout"] == "1m30s"


async def test_result_completes_the_task_and_a_replay_is_a_200_duplicate(api: Api) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    url = f"/v1/worker/runs/{claimed['run_id']}/result"

    first = await api.client.post(url, json={"result": [1, 2]}, headers=W1)
    again = await api.client.post(url, json={"result": [1, 2]}, headers=W1)

    assert (first.status_code, first.json()["outcome"]) == (200, "recorded")
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    stored = await task(api, task_id)
    assert (stored["status"], stored["result"]) == ("completed", [1, 2])
    assert api.queue.get_lease(UUID(task_id)) is None


async def test_failure_schedules_a_retry_and_a_permanent_one_fails_the_task(api: Api) -> None:
    retried_id = await submit(api, max_attempts=3)
    [retried] = (await claim(api)).json()["tasks"]
    failure = await api.client.post(
        f"/v1/worker/runs/{retried['run_id']}/failure", json={"error": "boom"}, headers=W1
    )
    permanent_id = await submit(api, max_attempts=3)
    [permanent] = (await claim(api)).json()["tasks"]
    final = await api.client.post(
        f"/v1/worker/runs/{permanent['run_id']}/failure",
        json={"error": "bad input", "permanent": True},
        headers=W1,
    )
    replay = await api.client.post(
        f"/v1/worker/runs/{permanent['run_id']}/failure",
        json={"error": "bad input", "permanent": True},
        headers=W1,
    )

    assert failure.status_code == 200
    assert failure.json()["outcome"] == "recorded" and failure.json()["retry_at"] is not None
    assert (await task(api, retried_id))["status"] == "queued"
    assert (final.json()["outcome"], final.json()["retry_at"]) == ("recorded", None)
    assert (replay.status_code, replay.json()["outcome"]) == (200, "duplicate")
    stored = await task(api, permanent_id)
    assert (stored["status"], stored["last_error"]) == ("failed", "bad input")


async def test_a_report_on_a_reclaimed_run_is_409_stale_run_and_changes_nothing(api: Api) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    remote = api.services.api.remote
    held = await remote.load(UUID(claimed["run_id"]), "w1")
    await api.services.worker.execution.hand_back(held, "test: run taken away")
    run = f"/v1/worker/runs/{claimed['run_id']}"

    result = await api.client.post(f"{run}/result", json={"result": 1}, headers=W1)
    failure = await api.client.post(f"{run}/failure", json={"error": "x"}, headers=W1)
    heartbeat = await api.client.post(f"{run}/heartbeat", json={}, headers=W1)

    assert (result.status_code, result.json()["error"]["code"]) == (409, "stale_run")
    assert (failure.status_code, failure.json()["error"]["code"]) == (409, "stale_run")
    assert (heartbeat.status_code, heartbeat.json()["error"]["code"]) == (409, "lease_lost")
    stored = await task(api, task_id)
    assert (stored["status"], stored["result"], stored["attempt"]) == ("queued", None, 0)


async def test_a_report_from_another_worker_id_is_409_and_changes_nothing(api: Api) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    run = f"/v1/worker/runs/{claimed['run_id']}"
    other = {"X-Worker-Id": "w2"}

    result = await api.client.post(f"{run}/result", json={"result": 1}, headers=other)
    heartbeat = await api.client.post(f"{run}/heartbeat", json={}, headers=other)

    assert (result.status_code, result.json()["error"]["code"]) == (409, "run_not_owned")
    assert (heartbeat.status_code, heartbeat.json()["error"]["code"]) == (409, "run_not_owned")
    assert (await task(api, task_id))["status"] == "running"


async def test_heartbeat_extends_the_lease_stores_progress_then_409_once_done(api: Api) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    run = f"/v1/worker/runs/{claimed['run_id']}"
    before = api.queue.get_lease(UUID(task_id))
    api.clock.advance(5.0)

    beat = await api.client.post(f"{run}/heartbeat", json={"progress": {"rows": 7}}, headers=W1)
    after = api.queue.get_lease(UUID(task_id))
    stored = await task(api, task_id)
    await api.client.post(f"{run}/result", json={}, headers=W1)
    late = await api.client.post(f"{run}/heartbeat", json={}, headers=W1)

    assert beat.status_code == 200, beat.text
    assert beat.json()["cancel"] is False
    assert before is not None and after is not None and after.deadline_ms > before.deadline_ms
    assert stored["progress"] == {"rows": 7}
    assert (late.status_code, late.json()["error"]["code"]) == (409, "lease_lost")


async def test_an_unknown_run_is_404_run_not_found(api: Api) -> None:
    response = await api.client.post(
        f"/v1/worker/runs/{uuid4()}/result", json={"result": 1}, headers=W1
    )

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "run_not_found"


async def test_an_unstorable_result_is_a_400_naming_result_and_the_run_stays_live(
    api: Api,
) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    url = f"/v1/worker/runs/{claimed['run_id']}/result"

    response = await api.client.post(url, json={"result": {"a": "x\u0000y"}}, headers=W1)

    assert response.status_code == 400
    assert response.json()["error"]["field"] == "result.a"
    assert (await task(api, task_id))["status"] == "running"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max": 0}, "max"),
        ({"max": 1000}, "max"),
        ({"wait": "31s"}, "wait"),
        ({"wait": "soon"}, "wait"),
        ({"wait": "-1s"}, "wait"),
        ({"kinds": []}, "kinds"),
        ({"worker_id": ""}, "worker_id"),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_bad_claims_are_400_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    response = await claim(api, **body)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("wait", "message"),
    [
        ("30s1ns", "must be between 0s and 30s, got '30s1ns'"),
        ("30.0000000001s", "must be between 0s and 30s, got '30.0000000001s'"),
        ("-1ns", "must be between 0s and 30s, got '-1ns'"),
        (" 1s", "not a duration: ' 1s' (use e.g. 500ms, 30s, 2m, 1h30m)"),
        ("1s\n", "not a duration: '1s\\n' (use e.g. 500ms, 30s, 2m, 1h30m)"),
    ],
)
async def test_a_claim_wait_is_checked_exactly_like_the_other_body_durations(
    api: Api, wait: str, message: str
) -> None:
    task_id = await submit(api)

    response = await claim(api, wait=wait)

    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "code": "validation_error",
        "message": message,
        "field": "wait",
    }
    assert (await task(api, task_id))["status"] == "queued"


async def test_a_claim_wait_of_exactly_30s_is_taken(api: Api) -> None:
    await submit(api)

    response = await claim(api, wait="30s")

    assert response.status_code == 200, response.text


async def test_bad_run_requests_are_400_naming_the_field(api: Api) -> None:
    bad_id = await api.client.post("/v1/worker/runs/nope/result", json={}, headers=W1)
    no_worker = await api.client.post(f"/v1/worker/runs/{uuid4()}/result", json={})
    nul_error = await api.client.post(
        f"/v1/worker/runs/{uuid4()}/failure", json={"error": "a\u0000"}, headers=W1
    )
    unknown = await api.client.post(
        f"/v1/worker/runs/{uuid4()}/heartbeat", json={"progres": 1}, headers=W1
    )

    assert (bad_id.status_code, bad_id.json()["error"]["field"]) == (400, "run_id")
    assert (no_worker.status_code, no_worker.json()["error"]["field"]) == (400, "X-Worker-Id")
    assert (nul_error.status_code, nul_error.json()["error"]["field"]) == (400, "error")
    assert (unknown.status_code, unknown.json()["error"]["field"]) == (400, "progres")


async def test_a_task_of_a_kind_the_worker_did_not_list_is_routed_not_failed(api: Api) -> None:
    task_id = await submit(api, kind="resize")

    response = await claim(api, kinds=["echo"], wait="200ms")

    assert response.status_code == 204
    stored = await task(api, task_id)
    assert (stored["status"], stored["runs"]) == ("queued", [])
    assert api.queue.ready_ids("default") == []
    assert api.queue.routed_ids("default", "resize") == [UUID(task_id)]
    assert api.queue.has_marker(UUID(task_id))
    taken = await claim(api, kinds=["resize"])
    assert taken.json()["tasks"][0]["task_id"] == task_id


async def test_registry_upserts_the_worker_row(api: Api) -> None:
    response = await api.client.post(
        "/v1/worker/registry",
        json={"worker_id": "w1", "hostname": "box", "metadata": {"kinds": ["echo"]}},
    )
    listed = (await api.client.get("/v1/workers")).json()["workers"]

    assert response.status_code == 204
    assert [(w["id"], w["hostname"], w["metadata"]) for w in listed] == [
        ("w1", "box", {"kinds": ["echo"]})
    ]


async def workers(api: Api) -> list[Any]:
    listed: list[Any] = (await api.client.get("/v1/workers")).json()["workers"]
    return listed


async def test_a_worker_that_claims_is_live_for_the_kinds_and_priorities_it_claims(
    api: Api,
) -> None:
    await claim(api, kinds=["echo", "resize"], priorities=["high", "default"])

    [row] = await workers(api)
    served = await api.client.post("/v1/tasks", json={"kind": "resize", "priority": "high"})
    unserved = await api.client.post("/v1/tasks", json={"kind": "never.served"})

    assert (row["id"], row["hostname"]) == ("w1", None)
    assert row["metadata"] == {"kinds": ["echo", "resize"], "priorities": ["high", "default"]}
    assert "warnings" not in served.json()
    assert [w["code"] for w in unserved.json()["warnings"]] == ["no_worker_for_kind"]


async def test_claims_rewrite_the_registry_row_only_when_it_is_old_or_lacks_what_they_name(
    api: Api,
) -> None:
    await claim(api)
    [first] = await workers(api)
    api.clock.advance(5)
    await claim(api)
    [unchanged] = await workers(api)
    await claim(api, kinds=["resize"], priorities=["high"])
    [widened] = await workers(api)
    api.clock.advance(31)  # past WORKER_HEARTBEAT_INTERVAL (30s)
    await claim(api, kinds=["resize"])
    [refreshed] = await workers(api)

    assert unchanged["last_heartbeat_at"] == first["last_heartbeat_at"]
    assert widened["last_heartbeat_at"] > first["last_heartbeat_at"]
    assert widened["metadata"] == {"kinds": ["echo", "resize"], "priorities": ["default", "high"]}
    assert refreshed["last_heartbeat_at"] > widened["last_heartbeat_at"]
    assert refreshed["metadata"] == widened["metadata"]


async def test_a_claim_keeps_the_hostname_and_metadata_the_worker_registered(api: Api) -> None:
    await api.client.post(
        "/v1/worker/registry",
        json={"worker_id": "w1", "hostname": "box", "metadata": {"kinds": [], "pid": 7}},
    )

    await claim(api)

    [row] = await workers(api)
    assert (row["hostname"], row["metadata"]) == (
        "box",
        {"kinds": ["echo"], "pid": 7, "priorities": ["default"]},
    )


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"kinds": "notalist"}, "metadata.kinds"),
        ({"priorities": [5], "kinds": [{}]}, "metadata.kinds"),
        ({"kinds": ["a b"]}, "metadata.kinds"),
        ({"kinds": ["echo"], "priorities": [5]}, "metadata.priorities"),
        ({"priorities": ["High"]}, "metadata.priorities"),
        ({"priorities": "default"}, "metadata.priorities"),
    ],
)
async def test_registry_kinds_or_priorities_that_are_not_lists_of_names_are_a_400(
    api: Api, metadata: dict[str, Any], field: str
) -> None:
    response = await api.client.post(
        "/v1/worker/registry", json={"worker_id": "w1", "metadata": metadata}
    )

    assert response.status_code == 400, response.text
    assert (response.json()["error"]["code"], response.json()["error"]["field"]) == (
        "validation_error",
        field,
    )
    assert await workers(api) == []


async def test_registry_remove_deletes_the_row_and_a_later_claim_records_it_again(
    api: Api,
) -> None:
    await api.client.post("/v1/worker/registry", json={"worker_id": "w1", "hostname": "box"})
    await claim(api)

    removed = await api.client.post("/v1/worker/registry/remove", json={"worker_id": "w1"})
    gone = await workers(api)
    again = await api.client.post("/v1/worker/registry/remove", json={"worker_id": "w1"})
    await claim(api)

    assert (removed.status_code, again.status_code) == (204, 204)
    assert gone == []
    assert [w["id"] for w in await workers(api)] == ["w1"]


async def asgi_post(
    api: Api,
    path: str,
    body: bytes,
    *,
    disconnect: asyncio.Event | None = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> tuple[int, bytes]:
    """POST to the app on this event loop (the test client serves one request at a time, in
    its own thread); ``disconnect`` set: the client hangs up. ``headers`` are sent as given,
    after the JSON ``Content-Type`` (the test client would merge a repeated one)."""
    hang_up = asyncio.Event() if disconnect is None else disconnect
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = http_scope(path, [(b"content-type", b"application/json"), (b"host", b"test"), *headers])
    await api.app(scope, receive, send)  # type: ignore[arg-type]
    [status] = [m["status"] for m in sent if m["type"] == "http.response.start"]
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, content


async def test_a_held_claim_is_served_by_a_task_submitted_meanwhile(api: Api) -> None:
    body = b'{"worker_id": "w1", "kinds": ["echo"], "wait": "5s"}'
    held = asyncio.ensure_future(asgi_post(api, "/v1/worker/claim", body))
    await asyncio.sleep(0.05)
    task_id = await submit_direct(api)

    status, content = await asyncio.wait_for(held, timeout=5)

    assert status == 200
    assert json.loads(content)["tasks"][0]["task_id"] == task_id


async def test_a_client_that_disconnects_during_a_held_claim_strands_nothing(api: Api) -> None:
    """The client hangs up while the claim is held; a task submitted during the hold is popped
    by it and must go back to the ready list unclaimed."""
    body = b'{"worker_id": "w1", "kinds": ["echo"], "wait": "1s"}'
    disconnected = asyncio.Event()
    held = asyncio.ensure_future(asgi_post(api, "/v1/worker/claim", body, disconnect=disconnected))
    await asyncio.sleep(0.1)
    disconnected.set()
    await asyncio.sleep(0.05)
    task_id = await submit_direct(api)  # popped by the hold after its client left

    status, _ = await asyncio.wait_for(held, timeout=5)

    stored = await task(api, task_id)
    assert (stored["status"], stored["runs"]) == ("queued", [])
    assert api.queue.ready_ids("default") == [UUID(task_id)]
    assert api.queue.has_marker(UUID(task_id))
    assert status == 204


async def test_release_hands_the_task_back_at_once_without_charging_a_retry(api: Api) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    url = f"/v1/worker/runs/{claimed['run_id']}/release"

    released = await api.client.post(url, json={"progress": {"page": 3}}, headers=W1)
    again = await api.client.post(url, json={}, headers=W1)

    assert (released.status_code, released.json()["outcome"]) == (200, "recorded")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "stale_run")
    stored = await task(api, task_id)
    assert (stored["status"], stored["attempt"], stored["progress"]) == ("queued", 0, {"page": 3})
    [reclaimed] = (await claim(api)).json()["tasks"]
    assert (reclaimed["attempt"], reclaimed["checkpoint"]) == (1, {"page": 3})


async def test_a_failure_writes_its_progress_as_the_retry_checkpoint(api: Api) -> None:
    await submit(api, max_attempts=2, retry={"delay": "0s"})
    [claimed] = (await claim(api)).json()["tasks"]

    await api.client.post(
        f"/v1/worker/runs/{claimed['run_id']}/failure",
        json={"error": "flaky", "progress": {"done": 5}},
        headers=W1,
    )
    stored = await task(api, claimed["task_id"])

    assert (stored["status"], stored["progress"]) == ("queued", {"done": 5})


async def test_a_null_progress_clears_the_checkpoint_and_an_absent_one_keeps_it(api: Api) -> None:
    """``"progress": null`` is the handler's ``task.progress(None)`` (a clean start for the
    retry), as in a native worker; leaving the field out reports nothing."""
    await submit(api, max_attempts=3, retry={"delay": "0s"})
    [first] = (await claim(api)).json()["tasks"]
    run = f"/v1/worker/runs/{first['run_id']}"
    await api.client.post(f"{run}/heartbeat", json={"progress": 5}, headers=W1)
    await api.client.post(f"{run}/heartbeat", json={}, headers=W1)
    kept = (await task(api, first["task_id"]))["progress"]
    await api.client.post(f"{run}/heartbeat", json={"progress": None}, headers=W1)
    cleared = (await task(api, first["task_id"]))["progress"]
    await api.client.post(f"{run}/heartbeat", json={"progress": 6}, headers=W1)
    failed = await api.client.post(
        f"{run}/failure", json={"error": "x", "progress": None}, headers=W1
    )
    retried = await task(api, first["task_id"])

    assert (kept, cleared) == (5, None)
    assert failed.status_code == 200, failed.text
    # the failure's null cleared the heartbeat's 6: the retry's checkpoint is None
    assert (retried["status"], retried["progress"]) == ("queued", None)


async def test_a_null_progress_with_a_result_clears_it(api: Api) -> None:
    first, second = await submit(api), await submit(api)
    claimed = {t["task_id"]: t["run_id"] for t in (await claim(api, max=2)).json()["tasks"]}
    for task_id in (first, second):
        url = f"/v1/worker/runs/{claimed[task_id]}/heartbeat"
        await api.client.post(url, json={"progress": 9}, headers=W1)

    await api.client.post(
        f"/v1/worker/runs/{claimed[first]}/result", json={"progress": None}, headers=W1
    )
    reports = [{"run_id": claimed[second], "result": 1, "progress": None}]
    await api.client.post("/v1/worker/results", json={"reports": reports}, headers=W1)

    assert (await task(api, first))["progress"] is None
    assert (await task(api, second))["progress"] is None


async def test_batched_results_answer_per_report_in_one_request(api: Api) -> None:
    first, second = await submit(api), await submit(api)
    claimed = (await claim(api, max=2)).json()["tasks"]
    by_task = {t["task_id"]: t["run_id"] for t in claimed}
    remote = api.services.api.remote
    held = await remote.load(UUID(by_task[second]), "w1")
    await api.services.worker.execution.hand_back(held, "test: run taken away")
    reports = [
        {"run_id": by_task[first], "result": {"n": 1}, "progress": "last"},
        {"run_id": by_task[second], "result": 2},
        {"run_id": str(uuid4())},
    ]

    response = await api.client.post("/v1/worker/results", json={"reports": reports}, headers=W1)
    replay = await api.client.post("/v1/worker/results", json={"reports": reports[:1]}, headers=W1)
    foreign = await api.client.post(
        "/v1/worker/results", json={"reports": reports[:1]}, headers={"X-Worker-Id": "w2"}
    )
    bad = await api.client.post(
        "/v1/worker/results",
        json={"reports": [{"run_id": by_task[first], "result": "a\u0000"}]},
        headers=W1,
    )

    assert response.json()["outcomes"] == ["recorded", "stale_run", "run_not_found"]
    assert replay.json()["outcomes"] == ["duplicate"]
    assert foreign.json()["outcomes"] == ["run_not_owned"]
    assert (bad.status_code, bad.json()["error"]["field"]) == (400, "reports[0].result")
    done = await task(api, first)
    assert (done["status"], done["result"], done["progress"]) == ("completed", {"n": 1}, "last")
    assert (await task(api, second))["status"] == "queued"


async def test_registry_metadata_that_cannot_be_stored_is_a_400(api: Api) -> None:
    nul = await api.client.post(
        "/v1/worker/registry", json={"worker_id": "w1", "metadata": {"k": "a\u0000"}}
    )
    with pytest.raises(InvalidPayload) as big:  # past this harness's 64 KiB body limit
        await api.services.api.remote.register("w1", None, {"k": "x" * 70_000})

    assert (nul.status_code, nul.json()["error"]["field"]) == (400, "metadata.k")
    assert nul.json()["error"]["code"] == "invalid_metadata"
    assert (big.value.code, big.value.field) == ("invalid_metadata", "metadata")
    assert (await api.client.get("/v1/workers")).json()["workers"] == []


async def test_a_cancelled_running_task_answers_cancel_true_and_refuses_its_report(
    api: Api,
) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    run = f"/v1/worker/runs/{claimed['run_id']}"

    cancelled = await api.client.post(f"/v1/tasks/{task_id}/cancel")
    beat = await api.client.post(f"{run}/heartbeat", json={}, headers=W1)
    result = await api.client.post(f"{run}/result", json={"result": 1}, headers=W1)

    assert cancelled.status_code == 200, cancelled.text
    assert (beat.status_code, beat.json()["cancel"]) == (200, True)
    assert (result.status_code, result.json()["error"]["code"]) == (409, "stale_run")
    assert (await task(api, task_id))["status"] == "cancelled"


async def test_a_claimed_task_carries_its_jobs_trace_context_to_the_http_worker(api: Api) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="t", kind="echo"),), trace_context=traceparent)
    )
    untraced = await submit_direct(api)

    response = await claim(api, max=10)

    by_id = {item["task_id"]: item for item in response.json()["tasks"]}
    assert by_id[str(traced.task_ids["t"])]["traceparent"] == traceparent
    assert by_id[untraced]["traceparent"] is None
    rebuilt = claim_from_wire(by_id[str(traced.task_ids["t"])], "w1")
    assert rebuilt.trace_context == traceparent


@pytest.mark.parametrize(
    ("path", "body", "field", "words"),
    [
        ("/v1/worker/registry", {"worker_id": "w1", "hostname": "h\u0000"}, "hostname", "control"),
        ("/v1/worker/registry", {"worker_id": "w1", "hostname": "box\n"}, "hostname", "control"),
        ("/v1/worker/runs/{run}/failure", {"error": "a\u0000"}, "error", "NUL"),
        ("/v1/worker/runs/{run}/release", {"reason": "a\u0000"}, "reason", "NUL"),
    ],
)
async def test_a_refused_text_field_is_explained_in_words(
    api: Api, path: str, body: dict[str, Any], field: str, words: str
) -> None:
    """A pattern's refusal says what the field may hold (not the regex), and a final newline
    is refused where control characters are (``$`` alone matches before it)."""
    response = await api.client.post(
        path.format(run=uuid4()), json=body, headers={"X-Worker-Id": "w1"}
    )

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert words in error["message"]
    assert "^" not in error["message"]


async def test_a_claim_whose_x_worker_id_is_not_its_worker_id_is_400_and_claims_nothing(
    api: Api,
) -> None:
    task_id = await submit(api)
    body = {"worker_id": "body-id", "kinds": ["echo"], "wait": "0s"}

    refused = await api.client.post(
        "/v1/worker/claim", json=body, headers={"X-Worker-Id": "hdr-id"}
    )
    same = await api.client.post("/v1/worker/claim", json=body, headers={"X-Worker-Id": "body-id"})

    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["field"] == "X-Worker-Id"
    assert "'hdr-id'" in error["message"]
    assert "'body-id'" in error["message"]
    assert same.status_code == 200  # the task was still queued after the refusal
    assert same.json()["tasks"][0]["task_id"] == task_id


#: ``X-Worker-Id`` twice, with another value and with the same one.
REPEATED_WORKER_IDS = [
    ((b"x-worker-id", b"w1"), (b"x-worker-id", b"w2")),
    ((b"x-worker-id", b"w1"), (b"x-worker-id", b"w1")),
]


@pytest.mark.parametrize("twice", REPEATED_WORKER_IDS)
@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("runs/{run}/heartbeat", {"progress": 1}),
        ("runs/{run}/result", {"result": 1}),
        ("runs/{run}/failure", {"error": "x", "permanent": True}),
        ("runs/{run}/release", {}),
        ("results", {"reports": [{"run_id": "{run}", "result": 1}]}),
    ],
)
async def test_a_report_with_x_worker_id_twice_is_400_and_changes_nothing(
    api: Api, route: str, body: dict[str, Any], twice: tuple[tuple[bytes, bytes], ...]
) -> None:
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    run = claimed["run_id"]
    raw = json.dumps(body).replace("{run}", run).encode()

    status, answer = await asgi_post(api, f"/v1/worker/{route.format(run=run)}", raw, headers=twice)

    assert status == 400, answer
    error = json.loads(answer)["error"]
    assert (error["code"], error["field"]) == ("validation_error", "X-Worker-Id")
    assert error["message"] == "X-Worker-Id given more than once"
    stored = await task(api, task_id)
    assert (stored["status"], stored["result"], stored["progress"]) == ("running", None, None)
    assert [r["id"] for r in stored["runs"]] == [run]


@pytest.mark.parametrize("twice", REPEATED_WORKER_IDS)
async def test_a_claim_with_x_worker_id_twice_is_400_and_claims_nothing(
    api: Api, twice: tuple[tuple[bytes, bytes], ...]
) -> None:
    task_id = await submit(api)
    body = b'{"worker_id": "w1", "kinds": ["echo"], "wait": "0s"}'

    status, answer = await asgi_post(api, "/v1/worker/claim", body, headers=twice)

    assert status == 400, answer
    error = json.loads(answer)["error"]
    assert (error["code"], error["field"]) == ("validation_error", "X-Worker-Id")
    assert error["message"] == "X-Worker-Id given more than once"
    assert (await task(api, task_id))["status"] == "queued"


async def test_a_heartbeat_renews_a_claimed_lease_while_the_database_is_down(api: Api) -> None:
    # Given a run claimed over HTTP, then the database down
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    run = f"/v1/worker/runs/{claimed['run_id']}"
    before = api.queue.get_lease(UUID(task_id))
    api.store.available = False
    api.clock.advance(5.0)

    # When its worker, and another worker id, send heartbeats
    beat = await api.client.post(f"{run}/heartbeat", json={}, headers=W1)
    foreign = await api.client.post(f"{run}/heartbeat", json={}, headers={"X-Worker-Id": "w2"})
    unknown = await api.client.post(f"/v1/worker/runs/{uuid4()}/heartbeat", json={}, headers=W1)

    # Then the lease is extended from Redis alone; the other worker is refused, and a run this
    # process never handed out stays a 503 (nothing to check ownership against)
    after = api.queue.get_lease(UUID(task_id))
    assert beat.status_code == 200, beat.text
    assert beat.json()["cancel"] is False
    assert before is not None and after is not None and after.deadline_ms > before.deadline_ms
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (409, "run_not_owned")
    assert unknown.status_code == 503
    assert api.queue.get_lease(UUID(task_id)) == after


async def test_a_heartbeat_while_the_database_is_down_still_loses_a_taken_over_lease(
    api: Api,
) -> None:
    # Given a run handed back (its lease deleted) and the task claimed again by w2
    task_id = await submit(api)
    [first] = (await claim(api)).json()["tasks"]
    held = await api.services.api.remote.load(UUID(first["run_id"]), "w1")
    await api.services.worker.execution.hand_back(held, "test: run taken away")
    [second] = (await claim(api, worker_id="w2")).json()["tasks"]
    api.store.available = False
    api.clock.advance(5.0)

    # When the first run's worker sends a heartbeat
    late = await api.client.post(
        f"/v1/worker/runs/{first['run_id']}/heartbeat", json={}, headers=W1
    )

    # Then the lease of the new run is left alone: the old run's lease is lost
    assert (late.status_code, late.json()["error"]["code"]) == (409, "lease_lost")
    lease = api.queue.get_lease(UUID(task_id))
    assert lease is not None and str(lease.run_id) == second["run_id"]


async def test_a_heartbeat_learns_a_run_so_it_renews_it_during_a_later_outage(api: Api) -> None:
    # Given a run claimed through another API process, renewed once through this one while the
    # database is up (this one never handed it out)
    task_id = await submit(api)
    [claimed] = (await claim(api)).json()["tasks"]
    run_id = UUID(claimed["run_id"])
    other = RemoteWorkerService(
        execution=api.services.worker.execution,
        store=api.store,
        queue=api.queue,
        registry=WorkerRegistryService(store=api.store),
        clock=api.clock,
    )
    await other.heartbeat(run_id, "w1")
    api.store.available = False
    api.clock.advance(5.0)

    # When the worker's next heartbeats reach it during the outage
    renewal = await other.heartbeat(run_id, "w1")
    with pytest.raises(RunNotOwned):
        await other.heartbeat(run_id, "w2")

    # Then the lease is extended
    lease = api.queue.get_lease(UUID(task_id))
    assert renewal.state is LeaseState.EXTENDED
    assert lease is not None and lease.run_id == run_id
    assert lease.deadline_ms == int(renewal.lease_expires_at.timestamp() * 1000)


async def test_with_tokens_a_heartbeat_renews_the_lease_while_the_database_is_down() -> None:
    """The token check reads the database too: a worker's token confirmed before the outage
    is taken during it, or every heartbeat was a 503 and the task ran twice (API_AUTH=tokens
    is the default)."""
    from dataclasses import replace

    from dtq.domain.tokens import Scope
    from tests.unit.api_harness import SETTINGS

    async with running_api(replace(SETTINGS, api_auth="tokens")) as api:
        tokens = api.services.api.tokens
        worker = (await tokens.create("workers", {Scope.WORKER})).secret
        submitter = (await tokens.create("submitter", {Scope.SUBMIT})).secret
        bearer = {"Authorization": f"Bearer {worker}", **W1}
        created = await api.client.post(
            "/v1/tasks", json={"kind": "echo"}, headers={"Authorization": f"Bearer {submitter}"}
        )
        body = {"worker_id": "w1", "kinds": ["echo"], "wait": "0s"}
        [claimed] = (await api.client.post("/v1/worker/claim", json=body, headers=bearer)).json()[
            "tasks"
        ]
        run = f"/v1/worker/runs/{claimed['run_id']}"
        before = api.queue.get_lease(UUID(created.json()["task_id"]))
        api.store.available = False
        api.clock.advance(5.0)  # past the token cache's second

        beat = await api.client.post(f"{run}/heartbeat", json={}, headers=bearer)
        stranger = await api.client.post(
            f"{run}/heartbeat", json={}, headers={"Authorization": "Bearer dtq_" + "x" * 43, **W1}
        )
        after = api.queue.get_lease(UUID(created.json()["task_id"]))

    assert beat.status_code == 200, beat.text
    assert before is not None and after is not None and after.deadline_ms > before.deadline_ms
    assert stranger.status_code == 503  # a token never seen cannot be checked: no guess
