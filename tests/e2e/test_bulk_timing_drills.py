"""The issue 14 drills not covered elsewhere, on real processes ("Done when"): delayed tasks run
on time (never early), exponential retry gaps as specified, and a bulk retry by filter that
reopens failed jobs through a background operation (item 6).

Bounds on lateness are generous (the machine is shared); the benchmark measures the p99. Each
gap is measured between the starts of two deliveries as the worker recorded them, so it holds
the backoff plus the handler's failure report: it is never shorter than the backoff.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: Allowed lateness of a delayed start or a retry on this shared machine, seconds.
LATE = 1.5


def starts(cluster: Cluster, task_id: str, count: int, timeout: float = 30) -> list[float]:
    """Wall-clock times of the task's first ``count`` ``start`` records, in order."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(
            r["t"]
            for r in cluster.read_records()
            if r["event"] == "start" and r["task_id"] == task_id
        )
        if len(found) >= count:
            return found[:count]
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} starts of {task_id}\n{cluster.log('w1')}")


def warm_up(cluster: Cluster) -> None:
    """Wait until the worker runs tasks (its start is not part of any timing)."""
    warm = cluster.post("/v1/tasks", {"kind": "record"})
    assert cluster.wait_job(warm["job_id"])["status"] == "completed"


def test_delayed_tasks_start_on_time_never_early(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    warm_up(cluster)
    submitted_at = time.time()
    run_at = datetime.now(UTC) + timedelta(seconds=2)
    job = cluster.post(
        "/v1/jobs",
        {
            "tasks": [
                {"name": "d1", "kind": "record", "delay": "1500ms"},
                {"name": "d2", "kind": "record", "delay": "2500ms"},
                {"name": "r", "kind": "record", "run_at": run_at.isoformat()},
                {"name": "now", "kind": "record"},
            ]
        },
    )
    ids = job["tasks"]

    due = {"d1": submitted_at + 1.5, "d2": submitted_at + 2.5, "r": run_at.timestamp()}
    for name, at in due.items():
        [started] = starts(cluster, ids[name], 1)
        assert started >= at - 0.05, f"{name} started {at - started:.3f} s early"
        assert started - at <= LATE, f"{name} started {started - at:.3f} s late"
    [now] = starts(cluster, ids["now"], 1)
    assert now < due["d1"]  # an undelayed task does not wait for the others
    assert cluster.wait_job(job["job_id"])["status"] == "completed"


def test_exponential_retry_gaps_double_up_to_max_delay(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    warm_up(cluster)
    retry = {"backoff": "exponential", "delay": "400ms", "max_delay": "1s"}
    submitted = cluster.post(
        "/v1/tasks", {"kind": "always_fail", "max_attempts": 4, "retry": retry}
    )

    times = starts(cluster, submitted["task_id"], 4)

    gaps = [b - a for a, b in itertools.pairwise(times)]
    expected = [0.4, 0.8, 1.0]  # delay * 2^(attempt-1), the third capped at max_delay
    for gap, want in zip(gaps, expected, strict=True):
        assert want - 0.05 <= gap <= want + LATE, (gaps, expected)
    job = cluster.wait_job(submitted["job_id"])
    assert job["status"] == "failed"
    view = cluster.get(f"/v1/tasks/{submitted['task_id']}")
    assert [r["status"] for r in view["runs"]] == ["failed"] * 4
    assert view["retry"]["backoff"] == "exponential"


def wait_operation(cluster: Cluster, location: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = cluster.get(location)
        if body["status"] != "running":
            return body
        time.sleep(0.1)
    raise AssertionError(f"operation {location} still running\n{cluster.log('orchestrator')}")


def test_bulk_retry_by_filter_reopens_every_failed_job(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    jobs = [
        cluster.post(
            "/v1/jobs",
            {
                "name": "nightly",
                "tasks": [
                    {"name": "a", "kind": "fail_first", "max_attempts": 1},
                    {"name": "b", "kind": "record", "depends_on": ["a"]},
                ],
            },
        )
        for _ in range(20)
    ]
    for job in jobs:
        assert cluster.wait_job(job["job_id"])["status"] == "failed"
    body = {"kind": "fail_first", "status": "failed"}
    dry = httpx.post(f"{cluster.url}/v1/tasks/retry", json={**body, "dry_run": True}, timeout=30)
    assert dry.json() == {"matched": 20, "changed": 0, "dry_run": True}

    accepted = httpx.post(f"{cluster.url}/v1/tasks/retry", json=body, timeout=30)

    assert accepted.status_code == 202, accepted.text
    done = wait_operation(cluster, accepted.headers["location"])
    assert done["status"] == "succeeded"
    assert (done["matched"], done["changed"], done["skipped"]) == (20, 20, 0)
    assert done["cascaded"] == 20  # each job's b, failed by the cascade, back to pending
    for job in jobs:
        finished = cluster.wait_job(job["job_id"])
        assert finished["status"] == "completed"
        runs = cluster.get(f"/v1/tasks/{job['tasks']['a']}")["runs"]
        assert [r["status"] for r in runs] == ["failed", "succeeded"]
