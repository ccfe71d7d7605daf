"""Cancel and manual retry drills on real processes (issue 14 items 1 and 4, "Done when"): a
running long task is cancelled at its worker within one lease renewal plus a second; a
10,000-task job is cancelled in one call; the manual retry of a failed task reopens its job."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.app import runtime
from tests.e2e.conftest import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: The e2e app's lease renewal interval (``Options(lease_renew_every=...)``), seconds.
RENEW_EVERY = runtime.options.lease_renew_every


def post(cluster: Cluster, path: str, *, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{cluster.url}{path}", timeout=timeout)


def wait_record(cluster: Cluster, event: str, task_id: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in cluster.read_records():
            if record["event"] == event and record["task_id"] == task_id:
                return record
        time.sleep(0.05)
    raise AssertionError(f"no {event!r} record for {task_id}\n{cluster.log('w1')}")


def test_a_running_task_is_cancelled_at_its_worker(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    submitted = cluster.post("/v1/tasks", {"kind": "cancellable", "payload": {"seconds": 60}})
    task_id = submitted["task_id"]
    wait_record(cluster, "start", task_id)

    asked = time.time()
    response = post(cluster, f"/v1/tasks/{task_id}/cancel")
    cancelled = wait_record(cluster, "cancelled", task_id)

    assert response.status_code == 200
    assert response.json() == {"task_id": task_id, "status": "cancelled", "cascaded": 0}
    assert cancelled["t"] - asked <= RENEW_EVERY + 1.0
    view = cluster.get(f"/v1/tasks/{task_id}")
    assert view["status"] == "cancelled"
    assert [run["status"] for run in view["runs"]] == ["cancelled"]
    assert cluster.get(f"/v1/jobs/{submitted['job_id']}")["status"] == "cancelled"
    time.sleep(0.5)  # nothing is reported afterwards
    assert "task cancelled: handler cancelled" in cluster.log("w1")
    assert [run["status"] for run in cluster.get(f"/v1/tasks/{task_id}")["runs"]] == ["cancelled"]


def test_a_10000_task_job_is_cancelled_in_one_call(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    # a chain submitted by mistake: the root runs long, 9,999 dependents wait behind it
    tasks: list[dict[str, Any]] = [{"name": "t0", "kind": "cancellable", "payload": {}}]
    tasks += [
        {"name": f"t{i}", "kind": "record", "depends_on": [f"t{i - 1}"]} for i in range(1, 10_000)
    ]
    submitted = cluster.post("/v1/jobs", {"name": "mistake", "tasks": tasks})
    root = submitted["tasks"]["t0"]
    wait_record(cluster, "start", root)

    response = post(cluster, f"/v1/jobs/{submitted['job_id']}/cancel")

    assert response.status_code == 200, response.text
    assert response.json() == {
        "job_id": submitted["job_id"],
        "status": "cancelled",
        "cancelled": 10_000,
    }
    wait_record(cluster, "cancelled", root)
    results = cluster.get(f"/v1/jobs/{submitted['job_id']}/results?limit=1000")
    assert {r["status"] for r in results["results"]} == {"cancelled"}
    assert [r["status"] for r in cluster.get(f"/v1/tasks/{root}")["runs"]] == ["cancelled"]
    assert not any(r["event"] == "start" and r["task_id"] != root for r in cluster.read_records())


def test_manual_retry_of_a_failed_task_reopens_its_job(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    submitted = cluster.post(
        "/v1/jobs",
        {
            "tasks": [
                {"name": "a", "kind": "fail_first", "max_attempts": 1},
                {"name": "b", "kind": "record", "payload": {"name": "b"}, "depends_on": ["a"]},
            ]
        },
    )
    job = cluster.wait_job(submitted["job_id"])
    assert job["status"] == "failed"
    assert {t["name"]: t["status"] for t in job["tasks"]} == {"a": "failed", "b": "failed"}

    response = post(cluster, f"/v1/tasks/{submitted['tasks']['a']}/retry")

    assert response.status_code == 200
    assert response.json()["reopened"] == 1
    job = cluster.wait_job(submitted["job_id"])
    assert job["status"] == "completed"
    view = cluster.get(f"/v1/tasks/{submitted['tasks']['a']}")
    assert [(r["status"], r["attempt_number"]) for r in view["runs"]] == [
        ("failed", 1),
        ("succeeded", 1),
    ]


def test_a_job_that_workers_are_draining_is_cancelled(cluster: Cluster) -> None:
    """The cancel's pages lock their rows: without that, on a fast drain every page lost its
    serialization conflicts to the claims and completions until no task was left to cancel
    (200 ``completed`` with ``cancelled`` 0, 5 times of 5 on a 400-task job)."""
    cluster.start_orchestrator()
    cluster.start_worker("w1", WORKER_CONCURRENCY="4")
    cluster.start_worker("w2", WORKER_CONCURRENCY="4")
    tasks = [{"name": f"t{i}", "kind": "record"} for i in range(1_000)]
    job_id = cluster.post("/v1/jobs", {"tasks": tasks})["job_id"]
    deadline = time.monotonic() + 30
    while cluster.get(f"/v1/jobs/{job_id}?limit=1")["counts"]["completed"] < 50:
        assert time.monotonic() < deadline, cluster.log("w1")
        time.sleep(0.01)

    response = post(cluster, f"/v1/jobs/{job_id}/cancel")

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["cancelled"] > 0
    time.sleep(1.0)  # claims and completions that waited for the cancel have settled
    counts = cluster.get(f"/v1/jobs/{job_id}?limit=1")["counts"]
    assert counts["cancelled"] == body["cancelled"]
    assert counts["completed"] + counts["cancelled"] == 1_000
