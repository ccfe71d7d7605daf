"""The examples/topk pipeline on real processes: an orchestrator and two workers on PostgreSQL +
Redis with filesystem artifacts shared through one ``ARTIFACT_DIR``; one worker is SIGKILLed
while chunk tasks run, and the stitched CSV must still equal the single-process computation."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from examples.topk import compute
from examples.topk.run import job_spec

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

APP = "examples.topk.app:runtime"
CHUNKS, K, QUERIES, SLEEP = 8, 5, 12, 1.5


def test_topk_survives_a_sigkilled_worker(cluster: Cluster, tmp_path: Path) -> None:
    cluster.env["ARTIFACT_DIR"] = str(tmp_path / "artifacts")
    cluster.env["WORKER_CONCURRENCY"] = "2"
    cluster.start_orchestrator()
    for name in ("w1", "w2"):
        cluster.start(name, "--app", APP, command="dtq-worker", WORKER_ID=f"topk-{name}")
    submitted = cluster.post("/v1/jobs", job_spec(CHUNKS, K, QUERIES, SLEEP))
    chunk_ids = [submitted["tasks"][f"chunk-{i}"] for i in range(CHUNKS)]

    # kill w1 while it runs a chunk (each sleeps SLEEP s, so the kill lands mid-task)
    deadline = time.monotonic() + 30
    victim_task = None
    while victim_task is None and time.monotonic() < deadline:
        for task_id in chunk_ids:
            view = cluster.get(f"/v1/tasks/{task_id}")
            live = [r for r in view["runs"] if r["status"] == "running"]
            if view["status"] == "running" and live and live[-1]["worker_id"] == "topk-w1":
                victim_task = task_id
                break
        else:
            time.sleep(0.05)
    assert victim_task, "w1 never ran a chunk\n" + cluster.log("w1")
    cluster.signal("w1", signal.SIGKILL)
    assert cluster.wait_exit("w1") == -signal.SIGKILL

    job = cluster.wait_job(submitted["job_id"], timeout=45)
    assert job["status"] == "completed", job
    runs = cluster.get(f"/v1/tasks/{victim_task}")["runs"]
    assert [r["status"] for r in runs] == ["dead", "succeeded"]
    assert runs[1]["worker_id"] == "topk-w2"

    stitch = next(t for t in job["tasks"] if t["name"] == "stitch")
    assert stitch["result"]["chunks"] == CHUNKS
    assert stitch["result"]["rows"] == K * QUERIES
    ref = stitch["result"]["artifact"]
    response = httpx.get(f"{cluster.url}/v1/artifacts/{ref['artifact_id']}", timeout=30)
    assert response.status_code == 200
    assert response.content == compute.single_process_csv(K, QUERIES)
    assert len(response.content) == ref["size"]
