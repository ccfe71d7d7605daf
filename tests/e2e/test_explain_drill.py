"""Explain drill (issue 14 item 7) on real processes: an orchestrator and one worker polling the
default tier stage five situations, each answered by its own reason code; the submit to a
priority nobody polls carries a warning."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e


def wait_for(cluster: Cluster, path: str, check: Any, timeout: float = 20) -> dict[str, Any]:
    """GET ``path`` until ``check(body)`` holds; the last body."""
    deadline = time.monotonic() + timeout
    body = cluster.get(path)
    while not check(body) and time.monotonic() < deadline:
        time.sleep(0.1)
        body = cluster.get(path)
    assert check(body), f"{path}: {body}\n{cluster.log('orchestrator')}\n{cluster.log('w1')}"
    return body


def explain(cluster: Cluster, task_id: str) -> dict[str, Any]:
    return cluster.get(f"/v1/tasks/{task_id}/explain")


def test_explain_answers_each_staged_situation_with_its_own_code(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    wait_for(cluster, "/v1/workers", lambda body: len(body["workers"]) == 1)
    time.sleep(1.1)  # past the API's one-second registry cache, which may predate the worker

    unpolled = cluster.post("/v1/tasks", {"kind": "record", "priority": "nobody"})
    delayed = cluster.post("/v1/tasks", {"kind": "record", "delay": "1h"})
    chain = cluster.post(
        "/v1/jobs",
        {
            "tasks": [
                {"name": "long", "kind": "record", "payload": {"sleep": 60}},
                {"name": "after", "kind": "record", "depends_on": ["long"]},
            ]
        },
    )
    done = cluster.post("/v1/tasks", {"kind": "record"})

    assert [w["code"] for w in unpolled["warnings"]] == ["no_worker_for_priority"]
    assert "warnings" not in delayed and "warnings" not in chain and "warnings" not in done
    cluster.wait_job(done["job_id"])
    long_id, after_id = chain["tasks"]["long"], chain["tasks"]["after"]
    running = wait_for(
        cluster, f"/v1/tasks/{long_id}/explain", lambda body: body["reason"] == "running"
    )

    assert running["details"]["worker_id"]
    assert explain(cluster, unpolled["task_id"])["reason"] == "queued_no_worker"
    assert explain(cluster, unpolled["task_id"])["details"]["missing"] == ["priority"]
    assert explain(cluster, delayed["task_id"])["reason"] == "scheduled"
    waiting = explain(cluster, after_id)
    assert waiting["reason"] == "waiting_on_dependencies"
    assert waiting["details"]["waiting_on"] == ["long"]
    finished = explain(cluster, done["task_id"])
    assert (finished["reason"], finished["details"]["status"]) == ("terminal", "completed")
