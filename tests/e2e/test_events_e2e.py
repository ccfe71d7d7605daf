"""The event stream survives an orchestrator crash (issue 16 "Done when"): real
``dtq orchestrator`` and ``dtq-worker`` processes run a chain of tasks; the test reads the
stream, kills the orchestrator with SIGKILL mid-job, starts a new one, resumes with
``Last-Event-ID`` and gets every transition, in order, none missing and none twice: exactly the
outbox rows the database holds for the job."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

CHAIN = 4


def read_events(
    url: str, job_id: str, *, until: str, last_id: str | None = None, timeout: float = 60
) -> list[dict[str, Any]]:
    """Read ``GET /v1/events?job_id=`` until an event of type ``until`` arrived; each event's
    decoded data (with its SSE ``id`` checked against the body's)."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with httpx.stream(
        "GET",
        f"{url}/v1/events",
        params={"job_id": job_id},
        headers=headers,
        timeout=httpx.Timeout(timeout, read=20),
    ) as response:
        assert response.status_code == 200, response.read()
        sse_id = None
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"no {until} within {timeout}s: {found}"
            if line.startswith("id: "):
                sse_id = line[4:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["id"] == sse_id
                found.append(event)
                if event["type"] == until:
                    break
    return found


def stored_events(dsn: str, job_id: str) -> list[tuple[str, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT type, task_id::text FROM events WHERE job_id = %s ORDER BY created_at, id",
            (job_id,),
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def test_a_stream_resumed_after_an_orchestrator_crash_has_every_transition_in_order(
    cluster: Cluster,
) -> None:
    cluster.env["EVENTS_POLL_INTERVAL"] = "50ms"
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    tasks = [
        {"name": f"t{i}", "kind": "record", "payload": {"sleep": 0.4}}
        | ({"depends_on": [f"t{i - 1}"]} if i else {})
        for i in range(CHAIN)
    ]
    job = cluster.post("/v1/jobs", {"tasks": tasks})
    job_id = job["job_id"]

    before = read_events(cluster.url, job_id, until="task.completed")  # t0 done, t1 promoted
    cluster.signal("orchestrator", signal.SIGKILL)
    cluster.wait_exit("orchestrator")
    cluster.start_orchestrator()
    after = read_events(cluster.url, job_id, until="job.completed", last_id=before[-1]["id"])

    streamed = before + after
    assert [e["id"] for e in streamed] == list(dict.fromkeys(e["id"] for e in streamed))
    assert [(e["type"], e["task_id"]) for e in streamed] == stored_events(
        cluster.env["CRDB_DSN"], job_id
    )
    for name, task_id in job["tasks"].items():
        mine = [e["type"] for e in streamed if e["task_id"] == task_id]
        first = "task.queued" if name == "t0" else "task.pending"
        assert mine[0] == first and mine[-1] == "task.completed", (name, mine)
        assert mine.index("task.running") < mine.index("task.completed")
    assert streamed[0]["type"] == "job.submitted" and streamed[-1]["type"] == "job.completed"
    assert len([e for e in streamed if e["type"] == "task.completed"]) == CHAIN
