"""Workers over HTTP (issue 15 item 1) on real processes: a real ``dtq orchestrator`` (API and
reconciler) on PostgreSQL and Redis, and workers whose environment holds no database or Redis
credentials: the Node.js example, and ``dtq-worker --orchestrator URL``."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import BIN, ROOT, Cluster
from tests.e2e.test_drills import layered_dag
from tests.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.e2e

#: What an HTTP worker must not be given (issue 15: "never receive DB credentials").
CREDENTIALS = ("CRDB_DSN", "REDIS_ADDR", "REDIS_KEY_PREFIX")
NODE_WORKER = ROOT / "examples" / "worker-node" / "worker.mjs"


def http_env(cluster: Cluster, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if k not in CREDENTIALS}
    return {**env, **extra}


def start_process(cluster: Cluster, name: str, argv: list[str], env: dict[str, str]) -> None:
    with (cluster.logs / f"{name}.log").open("ab") as log:
        cluster.procs[name] = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def start_http_worker(cluster: Cluster, name: str) -> None:
    argv = [
        str(BIN / "dtq-worker"),
        "--app",
        "tests.e2e.app:runtime",
        "--orchestrator",
        cluster.url,
    ]
    start_process(cluster, name, argv, http_env(cluster, WORKER_ID=name))


def test_the_node_worker_runs_a_job(cluster: Cluster) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node.js worker example cannot run here")
    cluster.start_orchestrator()
    env = http_env(cluster, DTQ_URL=cluster.url, WORKER_ID="node-1", HEARTBEAT_MS="500")
    start_process(cluster, "node", [node, str(NODE_WORKER)], env)
    submitted = cluster.post(
        "/v1/jobs",
        {
            "tasks": [
                {"name": "a", "kind": "node.echo", "payload": "hello"},
                {
                    "name": "b",
                    "kind": "node.upper",
                    "payload": {"text": "dtq"},
                    "depends_on": ["a"],
                },
            ]
        },
    )
    refused = cluster.post("/v1/tasks", {"kind": "node.refuse", "max_attempts": 3})

    job = cluster.wait_job(submitted["job_id"], timeout=30)
    failed = cluster.wait_job(refused["job_id"], timeout=30)

    by_name = {t["name"]: t for t in job["tasks"]}
    assert job["status"] == "completed"
    assert by_name["a"]["result"] == "hello"
    assert by_name["b"]["result"] == "DTQ HELLO"  # its parent's result came with the claim
    [refusal] = failed["tasks"]
    assert (failed["status"], refusal["attempt"], refusal["last_error"]) == ("failed", 1, "refused")
    runs = cluster.get(f"/v1/tasks/{submitted['tasks']['b']}")["runs"]
    assert [(r["worker_id"], r["status"]) for r in runs] == [("node-1", "succeeded")]

    # its claims made it a live worker of its kinds; its clean stop removes it
    time.sleep(1.1)  # past the registry read the first submits cached (one per second)
    again = cluster.post("/v1/tasks", {"kind": "node.upper", "payload": {"text": "x"}})
    [live] = cluster.get("/v1/workers")["workers"]
    cluster.signal("node", signal.SIGTERM)
    assert cluster.wait_exit("node", timeout=15) == 0
    assert "warnings" not in again
    assert (live["id"], sorted(live["metadata"]["kinds"])) == (
        "node-1",
        ["node.echo", "node.refuse", "node.upper"],
    )
    assert cluster.get("/v1/workers")["workers"] == []


#: Two handlers added to a copy of the example: an error text and a result the API refuses as
#: they are (a NUL, a lone surrogate).
UNSTORABLE_HANDLERS = (
    '  "node.nul": async () => { throw new Error("bad\\u0000byte \\ud800"); },\n'
    '  "node.nulresult": async () => "x\\u0000y",\n'
)


def node_worker_with(handlers: str, tmp_path: Path) -> tuple[str, Path]:
    """``node`` and a copy of the example worker in ``tmp_path`` with ``handlers`` (JavaScript
    entries of its handler table) added before its own; skips without Node.js."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node.js worker example cannot run here")
    source = NODE_WORKER.read_text()
    anchor = '  "node.refuse": async'
    assert anchor in source
    copy = tmp_path / "worker.mjs"
    copy.write_text(source.replace(anchor, handlers + anchor))
    return node, copy


def test_the_node_worker_records_an_unstorable_error_and_result_as_failures(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The example escapes what the API refuses in an error text and fails a run whose result
    the API refuses, instead of leaving the run to be reclaimed until its crash budget ends."""
    node, copy = node_worker_with(UNSTORABLE_HANDLERS, tmp_path)
    cluster.start_orchestrator()
    env = http_env(cluster, DTQ_URL=cluster.url, WORKER_ID="node-2", HEARTBEAT_MS="500")
    start_process(cluster, "node", [node, str(copy)], env)

    error = cluster.post("/v1/tasks", {"kind": "node.nul", "max_attempts": 1})
    result = cluster.post("/v1/tasks", {"kind": "node.nulresult", "max_attempts": 2})
    failed = cluster.wait_job(error["job_id"], timeout=30)["tasks"][0]
    refused = cluster.wait_job(result["job_id"], timeout=30)["tasks"][0]

    assert (failed["status"], failed["attempt"]) == ("failed", 1)
    assert failed["last_error"] == "bad\\u0000byte \\ud800"
    assert (refused["status"], refused["attempt"]) == ("failed", 1)  # permanent: no retry
    assert refused["last_error"].startswith('UnstorableResult: {"error":{"code":"invalid_payload"')


#: A handler added to a copy of the example: a task that runs for 4 s.
SLOW_HANDLER = (
    '  "node.slow": async (payload) => {\n'
    "    await new Promise((resolve) => setTimeout(resolve, 4000));\n"
    "    return payload;\n"
    "  },\n"
)


def test_the_node_worker_survives_an_orchestrator_outage_and_delivers_its_reports(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The orchestrator is unreachable (connections reset, then refused) for 6 s while the
    Node worker runs two 4 s tasks: their results are sent again until they get through, the
    heartbeats and the claims that fail meanwhile are retried, and the process keeps running
    (it used to exit with ``TypeError: fetch failed`` from the first report)."""
    node, copy = node_worker_with(SLOW_HANDLER, tmp_path)
    # leases that outlast the outage: the runs stay the worker's, so its reports must land
    cluster.env.update(LEASE_DURATION="30s", STALE_RUNNING_AFTER="30s")
    cluster.start_orchestrator()
    host, port = cluster.url.removeprefix("http://").split(":")
    proxy = CuttableProxy(host, int(port))
    proxy.restore()
    try:
        # submitted before the worker starts, so that its first claim takes both
        submitted = cluster.post(
            "/v1/jobs",
            {
                "tasks": [
                    {"name": n, "kind": "node.slow", "payload": n, "max_attempts": 1}
                    for n in ("a", "b")
                ]
            },
        )
        env = http_env(
            cluster,
            DTQ_URL=f"http://127.0.0.1:{proxy.port}",
            WORKER_ID="node-3",
            HEARTBEAT_MS="500",
        )
        start_process(cluster, "node", [node, str(copy)], env)
        cluster.wait_job(submitted["job_id"], timeout=30, until="running")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            tasks = cluster.get(f"/v1/jobs/{submitted['job_id']}")["tasks"]
            if all(t["status"] == "running" for t in tasks):
                break
            time.sleep(0.05)
        assert [t["status"] for t in tasks] == ["running", "running"]

        proxy.cut()  # the handlers end 4 s in, while the orchestrator is out of reach
        time.sleep(6)
        assert cluster.procs["node"].poll() is None, cluster.log("node")
        proxy.restore()

        job = cluster.wait_job(submitted["job_id"], timeout=30)
        assert job["status"] == "completed", cluster.log("node")
        assert sorted(t["result"] for t in job["tasks"]) == ["a", "b"]
        for task in job["tasks"]:  # each ran once, and that run's report was recorded
            runs = cluster.get(f"/v1/tasks/{task['id']}")["runs"]
            assert [(r["worker_id"], r["status"]) for r in runs] == [("node-3", "succeeded")]
        assert cluster.procs["node"].poll() is None, cluster.log("node")

        # it still claims after the outage, and stops cleanly
        again = cluster.post("/v1/tasks", {"kind": "node.echo", "payload": "after"})
        assert cluster.wait_job(again["job_id"], timeout=30)["status"] == "completed"
        cluster.signal("node", signal.SIGTERM)
        assert cluster.wait_exit("node", timeout=15) == 0
    finally:
        proxy.close()


def test_an_http_only_python_worker_finishes_a_50_task_dag_across_a_sigkill(
    cluster: Cluster,
) -> None:
    cluster.start_orchestrator()
    start_http_worker(cluster, "h1")
    tasks = layered_dag(50)
    for task in tasks:
        task["payload"]["sleep"] = 0.3  # long enough that the kill lands mid-run
    submitted = cluster.post("/v1/jobs", {"name": "dag50-http", "tasks": tasks})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ended = [e for e in cluster.read_records() if e["event"] == "end"]
        if len(ended) >= 10:
            break
        time.sleep(0.05)
    cluster.signal("h1", signal.SIGKILL)
    cluster.wait_exit("h1")
    start_http_worker(cluster, "h2")

    job = cluster.wait_job(submitted["job_id"], timeout=90)

    assert job["status"] == "completed"
    assert {t["status"] for t in job["tasks"]} == {"completed"}
    events = cluster.read_records()
    # dependency order holds across the kill: a task starts after its dependencies' last end
    end = {e["name"]: e["t"] for e in events if e["event"] == "end"}
    last_start: dict[str, float] = {}
    for e in events:
        if e["event"] == "start":
            last_start[e["name"]] = max(last_start.get(e["name"], 0.0), e["t"])
    for task in tasks:
        for dep in task.get("depends_on", []):
            assert last_start[task["name"]] >= end[dep]
    runs = [run for task in job["tasks"] for run in cluster.get(f"/v1/tasks/{task['id']}")["runs"]]
    statuses = Counter(r["status"] for r in runs)
    assert statuses["succeeded"] == 50
    assert set(statuses) <= {"succeeded", "dead"}  # the killed worker's runs were reclaimed
    workers = {r["worker_id"] for r in runs if r["status"] == "succeeded"}
    assert "h2" in workers
    print(f"\nHTTP worker SIGKILL drill: runs {dict(statuses)}, succeeded by {sorted(workers)}")
