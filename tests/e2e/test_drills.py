"""End-to-end drills: real orchestrator and worker processes, real PostgreSQL and Redis."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
import redis

from tests.e2e.conftest import REDIS_URL, Cluster, delete_prefix

pytestmark = pytest.mark.e2e


def layered_dag(size: int, seed: int = 7) -> list[dict[str, Any]]:
    """Fan-out, fan-in and diamonds: each task depends on 1-3 tasks of the previous layer."""
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = [{"name": "root", "kind": "record", "payload": {"name": "root"}}]
    previous = ["root"]
    while len(tasks) < size:
        width = min(rng.choice([1, 3, 6, 9]), size - len(tasks))
        layer = []
        for i in range(width):
            name = f"n{len(tasks)}_{i}"
            deps = rng.sample(previous, k=min(len(previous), rng.randint(1, 3)))
            payload = {"name": name, "sleep": rng.choice([0, 0.01, 0.05])}
            tasks.append({"name": name, "kind": "record", "payload": payload, "depends_on": deps})
            layer.append(name)
        previous = layer
    return tasks


def task_view(cluster: Cluster, task_id: str) -> dict[str, Any]:
    return cluster.get(f"/v1/tasks/{task_id}")


def test_a_50_task_dag_completes_in_dependency_order(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    tasks = layered_dag(50)
    submitted = cluster.post("/v1/jobs", {"name": "dag50", "tasks": tasks})
    job = cluster.wait_job(submitted["job_id"])
    assert job["status"] == "completed"
    assert {t["status"] for t in job["tasks"]} == {"completed"}
    events = cluster.read_records()
    start = {e["name"]: e["t"] for e in events if e["event"] == "start"}
    end = {e["name"]: e["t"] for e in events if e["event"] == "end"}
    assert set(start) == {t["name"] for t in tasks}
    for task in tasks:
        for dep in task.get("depends_on", []):
            assert start[task["name"]] >= end[dep], f"{task['name']} started before {dep} ended"
    assert len({e["pid"] for e in events}) >= 1


def test_flaky_handler_succeeds_on_the_third_run(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    submitted = cluster.post(
        "/v1/tasks", {"kind": "flaky", "payload": {"fail_times": 2}, "max_attempts": 3}
    )
    job = cluster.wait_job(submitted["job_id"])
    assert job["status"] == "completed"
    view = task_view(cluster, submitted["task_id"])
    assert [r["status"] for r in view["runs"]] == ["failed", "failed", "succeeded"]
    assert [r["attempt_number"] for r in view["runs"]] == [1, 2, 3]
    assert view["status"] == "completed"


def test_exhausted_task_fails_and_cascades_to_every_dependent(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    submitted = cluster.post(
        "/v1/jobs",
        {
            "tasks": [
                {"name": "a", "kind": "always_fail", "payload": {}, "max_attempts": 3},
                {"name": "b", "kind": "record", "payload": {"name": "b"}, "depends_on": ["a"]},
                {"name": "c", "kind": "record", "payload": {"name": "c"}, "depends_on": ["b"]},
            ]
        },
    )
    job = cluster.wait_job(submitted["job_id"])
    assert job["status"] == "failed"
    status = {t["name"]: t["status"] for t in job["tasks"]}
    assert status == {"a": "failed", "b": "failed", "c": "failed"}
    view = task_view(cluster, submitted["tasks"]["a"])
    assert [r["status"] for r in view["runs"]] == ["failed"] * 3
    assert "always fails" in view["last_error"]


def test_unknown_kind_stays_queued_and_permanent_error_fails_in_one_run(cluster: Cluster) -> None:
    """A kind no live worker registers waits, queued and explained, instead of failing (kind-aware
    routing, issue 15 item 2); a permanent error still fails in one run."""
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    unknown = cluster.post("/v1/tasks", {"kind": "nobody.handles.this", "payload": {}})
    poison = cluster.post("/v1/tasks", {"kind": "poison", "payload": {}, "max_attempts": 5})
    assert cluster.wait_job(poison["job_id"])["status"] == "failed"
    assert len(task_view(cluster, poison["task_id"])["runs"]) == 1
    deadline = time.monotonic() + 10
    explained: dict[str, Any] = {}
    while time.monotonic() < deadline:  # the worker's first registry heartbeat makes it live
        explained = cluster.get(f"/v1/tasks/{unknown['task_id']}/explain")
        if explained["reason"] == "queued_no_worker":
            break
        time.sleep(0.1)
    assert explained["reason"] == "queued_no_worker", explained
    view = task_view(cluster, unknown["task_id"])
    assert (view["status"], view["runs"]) == ("queued", [])


def test_sigkilled_worker_task_is_reclaimed_and_finished_elsewhere(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    submitted = cluster.post("/v1/tasks", {"kind": "sleep_first", "payload": {"seconds": 60}})
    deadline = time.monotonic() + 20
    first: list[dict[str, Any]] = []
    while not first and time.monotonic() < deadline:
        first = [e for e in cluster.read_records() if e["event"] == "start" and e["first"]]
        time.sleep(0.05)
    assert first, "the handler never started"
    victim = next(n for n, p in cluster.procs.items() if p.pid == first[0]["pid"])
    killed_at = time.time()
    cluster.signal(victim, signal.SIGKILL)
    job = cluster.wait_job(submitted["job_id"], timeout=30)
    recovered_in = max(e["t"] for e in cluster.read_records() if e["event"] == "end") - killed_at
    assert job["status"] == "completed"
    view = task_view(cluster, submitted["task_id"])
    runs = view["runs"]
    assert [r["status"] for r in runs] == ["dead", "succeeded"]
    assert runs[0]["attempt_number"] == runs[1]["attempt_number"] == 1
    assert runs[0]["worker_id"] != runs[1]["worker_id"]
    # lease (2 s) + stale threshold (2 s) + one reconcile interval (0.5 s), plus process slack
    bound = 2 + 2 + 0.5
    print(f"\nSIGKILL recovery: {recovered_in:.2f} s (bound {bound} s)")
    assert recovered_in <= bound + 1.5


def test_sigterm_hands_the_task_back_at_once(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    submitted = cluster.post("/v1/tasks", {"kind": "sleep_first", "payload": {"seconds": 60}})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not cluster.read_records():
        time.sleep(0.05)
    cluster.start_worker("w2")
    stopped_at = time.time()
    cluster.signal("w1", signal.SIGTERM)
    assert cluster.wait_exit("w1") == 0
    job = cluster.wait_job(submitted["job_id"], timeout=20)
    finished = max(e["t"] for e in cluster.read_records() if e["event"] == "end")
    assert job["status"] == "completed"
    runs = task_view(cluster, submitted["task_id"])["runs"]
    assert [r["status"] for r in runs] == ["dead", "succeeded"]
    assert runs[0]["attempt_number"] == runs[1]["attempt_number"] == 1
    # handed back at once: well before lease + stale threshold would have reclaimed it
    assert finished - stopped_at < 2.0 + 2.0


def test_redis_loss_mid_run_loses_no_task(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    tasks = [
        {"name": f"t{i}", "kind": "record", "payload": {"name": f"t{i}", "sleep": 0.01}}
        for i in range(500)
    ]
    submitted = cluster.post("/v1/jobs", {"tasks": tasks})
    deadline = time.monotonic() + 30
    while len(cluster.read_records()) < 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    client = redis.Redis.from_url(REDIS_URL)
    deleted = delete_prefix(client, cluster.env["REDIS_KEY_PREFIX"])
    client.close()
    assert deleted > 0
    job = cluster.wait_job(submitted["job_id"], timeout=90)
    assert job["status"] == "completed"
    assert Counter(t["status"] for t in job["tasks"]) == {"completed": 500}
    executions: dict[str, int] = defaultdict(int)
    for event in cluster.read_records():
        if event["event"] == "end":
            executions[event["task_id"]] += 1
    assert set(executions) == set(submitted["tasks"].values())
    rerun = [task_id for task_id, n in executions.items() if n > 1]
    for task_id in rerun:  # ran more than once only where a run was abandoned
        statuses = [r["status"] for r in task_view(cluster, task_id)["runs"]]
        assert "dead" in statuses, (task_id, statuses)
    for task_id in random.Random(1).sample(sorted(executions), 25):
        runs = task_view(cluster, task_id)["runs"]
        assert [r["status"] for r in runs].count("succeeded") == 1


def test_orchestrator_restart_mid_run_loses_nothing(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    tasks = [
        {"name": f"t{i}", "kind": "record", "payload": {"name": f"t{i}", "sleep": 0.02}}
        for i in range(200)
    ]
    submitted = cluster.post("/v1/jobs", {"tasks": tasks})
    time.sleep(0.5)
    cluster.signal("orchestrator", signal.SIGTERM)
    assert cluster.wait_exit("orchestrator") == 0
    time.sleep(1.0)  # workers keep draining Redis and committing to the store meanwhile
    cluster.start_orchestrator()
    job = cluster.wait_job(submitted["job_id"], timeout=60)
    assert job["status"] == "completed"
    assert Counter(t["status"] for t in job["tasks"]) == {"completed": 200}


def test_api_keeps_an_idle_keep_alive_connection_longer_than_client_expiries(
    cluster: Cluster,
) -> None:
    """An idle connection is still served after 6 s (uvicorn's default closes it after 5 s, the
    same as httpx's idle expiry: a request sent as the server closed got a connection reset)."""
    import http.client

    cluster.start_orchestrator()
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        assert (first.status, first.read()[:1]) == (200, b"{")
        sock = conn.sock
        time.sleep(6)
        conn.request("GET", "/healthz")  # on the same socket: http.client does not reconnect
        assert conn.sock is sock
        second = conn.getresponse()  # RemoteDisconnected if the server had closed it
        assert (second.status, second.read()[:1]) == (200, b"{")
    finally:
        conn.close()
