"""Outage drill (issue 12): the database disappears behind a TCP proxy and comes back.

The orchestrator and a worker reach PostgreSQL only through
:class:`~tests.tcp_proxy.CuttableProxy`, a small asyncio TCP proxy run in a thread of the test.
``cut()`` closes its listener and resets every proxied connection (the database host is down:
connection refused); ``restore()`` listens again on the same port. The drill measures what a user
sees, prints the figures (``pytest -s``) and asserts the issue's bounds with generous margins:

* ``/healthz`` answers within 2 s in every state and names the store as down;
* API calls fail fast, 503 JSON with ``Retry-After``;
* after the restore, the API and the workers resume within 5 s.

A start with the database down is one line naming host and port, exit status 2.

The Redis leg puts the proxy between the processes and Redis instead, stalls it (connections
open, nothing comes back: the client's read timeout decides) and then cuts it: ``/healthz``
names the queue as down within 2 s, submits still succeed (the job is in the database; the
reconciler pushes it once Redis is back), and after the restore tasks run again within seconds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.conftest import BIN, Cluster
from tests.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.e2e

SRC = Path(__file__).resolve().parents[2] / "src"

#: The issue's targets and the margins the assertions allow on a loaded 2-core machine.
HEALTHZ_BOUND = 2.0
RESUME_BOUND = 5.0
MARGIN = 1.5
ACQUIRE_TIMEOUT = 1.0  # not the 3 s default: the drill checks the setting reaches the pool
OUTAGE_SECONDS = 6.0
BACKLOG = 24
REDIS_STALL_SECONDS = 5.0
REDIS_CUT_SECONDS = 8.0
REDIS_CALL_BOUND = 3.0  # the Redis client's read timeout: the longest a stalled call waits


@pytest.fixture
def proxied(cluster: Cluster) -> Iterator[tuple[Cluster, CuttableProxy]]:
    """The cluster's processes talk to the database through a proxy; Redis stays direct."""
    info = psycopg.conninfo.conninfo_to_dict(cluster.env["CRDB_DSN"])
    proxy = CuttableProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    proxy.restore()
    info.update(host="127.0.0.1", port=str(proxy.port))
    cluster.env["CRDB_DSN"] = psycopg.conninfo.make_conninfo("", **info)
    cluster.env["DB_ACQUIRE_TIMEOUT"] = f"{ACQUIRE_TIMEOUT:g}s"
    # The processes run this checkout's dtq even where the venv was installed from another one.
    cluster.env["PYTHONPATH"] = f"{SRC}{os.pathsep}{cluster.env['PYTHONPATH']}"
    try:
        yield cluster, proxy
    finally:
        cluster.stop_all()
        proxy.close()


@pytest.fixture
def redis_proxied(cluster: Cluster) -> Iterator[tuple[Cluster, CuttableProxy]]:
    """The cluster's processes talk to Redis through a proxy; the database stays direct."""
    host, _, port = cluster.env["REDIS_ADDR"].rpartition(":")
    proxy = CuttableProxy(host or "127.0.0.1", int(port))
    proxy.restore()
    cluster.env["REDIS_ADDR"] = f"127.0.0.1:{proxy.port}"
    cluster.env["PYTHONPATH"] = f"{SRC}{os.pathsep}{cluster.env['PYTHONPATH']}"
    try:
        yield cluster, proxy
    finally:
        cluster.stop_all()
        proxy.close()


def timed(method: str, url: str, **kwargs: Any) -> tuple[float, httpx.Response | None]:
    """Seconds the request took, and the response (None when none came within 10 s)."""
    started = time.monotonic()
    try:
        response: httpx.Response | None = httpx.request(method, url, timeout=10, **kwargs)
    except httpx.HTTPError:
        response = None
    return time.monotonic() - started, response


def wait_for(predicate: Any, timeout: float) -> float:
    """Poll ``predicate`` every 50 ms; return the seconds it took to become true."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"not true within {timeout}s")


def completed(cluster: Cluster, job_id: str) -> bool:
    response = httpx.get(f"{cluster.url}/v1/jobs/{job_id}", timeout=10)
    return response.status_code == 200 and response.json()["status"] == "completed"


def submitted(cluster: Cluster, name: str) -> str | None:
    body = {"kind": "record", "payload": {"name": name}}
    response = httpx.post(f"{cluster.url}/v1/tasks", json=body, timeout=10)
    return str(response.json()["job_id"]) if response.status_code == 201 else None


def test_database_outage_is_seen_fast_and_recovered_from_fast(
    proxied: tuple[Cluster, CuttableProxy],
) -> None:
    cluster, proxy = proxied
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    warm = cluster.post("/v1/tasks", {"kind": "record", "payload": {"name": "warm"}})
    assert cluster.wait_job(warm["job_id"], timeout=30)["status"] == "completed"
    # In flight across the cut: its completion report must land once the database is back.
    long = cluster.post("/v1/tasks", {"kind": "record", "payload": {"name": "long", "sleep": 2}})
    wait_for(lambda: any(e["name"] == "long" for e in cluster.read_records()), 15)
    # A backlog the worker keeps popping and failing to claim during the cut.
    backlog = [
        {"name": f"b{i}", "kind": "record", "payload": {"name": f"b{i}", "sleep": 0.5}}
        for i in range(BACKLOG)
    ]
    backlog_job = cluster.post("/v1/jobs", {"name": "backlog", "tasks": backlog})

    proxy.cut()
    cut_at = time.monotonic()
    health_times: list[float] = []
    api_times: list[float] = []
    while time.monotonic() - cut_at < OUTAGE_SECONDS:
        took, health = timed("GET", f"{cluster.url}/healthz")
        health_times.append(took)
        assert health is not None and health.status_code == 503, health
        assert health.headers["retry-after"]
        checks = health.json()["checks"]
        assert checks["store"] != "ok" and checks["queue"] == "ok", checks
        head_took, head = timed("HEAD", f"{cluster.url}/healthz")
        health_times.append(head_took)
        assert head is not None and head.status_code == 503
        took, call = timed("GET", f"{cluster.url}/v1/jobs/{warm['job_id']}")
        api_times.append(took)
        assert call is not None and call.status_code == 503, call
        assert call.headers["retry-after"]
        assert call.json()["error"]["code"] == "backend_unavailable"

    proxy.restore()
    restored_at, restored = time.time(), time.monotonic()

    def since_restore(predicate: Any, timeout: float = 30) -> float:
        wait_for(predicate, timeout)
        return time.monotonic() - restored

    api_resume = since_restore(
        lambda: httpx.get(f"{cluster.url}/healthz", timeout=10).status_code == 200
    )
    job_ids: list[str | None] = []
    submit_resume = since_restore(
        lambda: bool(job_ids.append(submitted(cluster, "after")) or job_ids[-1])  # type: ignore[func-returns-value]
    )
    fresh = job_ids[-1]
    assert fresh is not None
    worker_resume = since_restore(lambda: completed(cluster, fresh))
    in_flight_done = since_restore(lambda: completed(cluster, long["job_id"]))
    backlog_done = since_restore(lambda: completed(cluster, backlog_job["job_id"]), 60)
    first_start = min(
        e["t"]
        for e in cluster.read_records()
        if e["event"] == "start" and str(e["name"]).startswith("b") and e["t"] > restored_at
    )
    backlog_resume = first_start - restored_at

    print(
        f"\noutage drill ({OUTAGE_SECONDS:g}s cut, DB_ACQUIRE_TIMEOUT={ACQUIRE_TIMEOUT:g}s): "
        f"/healthz during outage max {max(health_times):.3f}s "
        f"median {statistics.median(health_times):.3f}s over {len(health_times)} probes; "
        f"API 503 max {max(api_times):.3f}s median {statistics.median(api_times):.3f}s; "
        f"after restore: /healthz ok in {api_resume:.2f}s, submit ok in {submit_resume:.2f}s, "
        f"new task completed in {worker_resume:.2f}s, in-flight task completed in "
        f"{in_flight_done:.2f}s, first backlog task started in {backlog_resume:.2f}s, "
        f"backlog of {BACKLOG} done in {backlog_done:.2f}s"
    )
    assert max(health_times) < HEALTHZ_BOUND * MARGIN
    assert max(api_times) < ACQUIRE_TIMEOUT + 1.0
    assert api_resume < RESUME_BOUND * MARGIN
    assert submit_resume < RESUME_BOUND * MARGIN
    assert worker_resume < RESUME_BOUND * MARGIN
    assert backlog_resume < RESUME_BOUND * MARGIN
    assert in_flight_done < 3 * RESUME_BOUND  # its report waits out the worker's retry backoff
    assert backlog_done < 6 * RESUME_BOUND


def test_a_start_with_the_database_down_is_one_line_naming_host_and_port(
    proxied: tuple[Cluster, CuttableProxy],
) -> None:
    cluster, proxy = proxied
    proxy.cut()

    started = time.monotonic()
    done = subprocess.run(
        [str(BIN / "dtq"), "orchestrator"],
        env=cluster.env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started

    err = done.stderr.decode()
    print(f"\nstart with the database down: exit {done.returncode} after {took:.2f}s: {err}")
    assert done.returncode == 2, err
    assert err.strip().splitlines() == [
        f"dtq: CRDB_DSN: cannot connect: connection refused at 127.0.0.1:{proxy.port}"
    ]
    assert took < 10


@dataclass
class RedisDown:
    """What the probes saw while Redis was unreachable: seconds per probe, and the jobs
    submitted meanwhile."""

    health: list[float] = field(default_factory=list)
    submit: list[float] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)


def _probe_redis_down(cluster: Cluster, seconds: float, tag: str) -> RedisDown:
    """For ``seconds``: probe ``/healthz`` (503 naming the queue, the store fine) and submit
    (201 all the same)."""
    started = time.monotonic()
    seen = RedisDown()
    while time.monotonic() - started < seconds:
        took, health = timed("GET", f"{cluster.url}/healthz")
        seen.health.append(took)
        assert health is not None and health.status_code == 503, health
        checks = health.json()["checks"]
        assert checks["queue"] != "ok" and checks["store"] == "ok", checks
        body = {"kind": "record", "payload": {"name": f"{tag}{len(seen.jobs)}"}}
        took, submit = timed("POST", f"{cluster.url}/v1/tasks", json=body)
        seen.submit.append(took)
        assert submit is not None and submit.status_code == 201, submit
        seen.jobs.append(str(submit.json()["job_id"]))
    return seen


def test_redis_outage_is_seen_fast_submits_still_succeed_and_tasks_run_after(
    redis_proxied: tuple[Cluster, CuttableProxy],
) -> None:
    cluster, proxy = redis_proxied
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    warm = cluster.post("/v1/tasks", {"kind": "record", "payload": {"name": "warm"}})
    assert cluster.wait_job(warm["job_id"], timeout=30)["status"] == "completed"

    proxy.stall()
    stalled = _probe_redis_down(cluster, REDIS_STALL_SECONDS, "s")
    proxy.cut()
    cut = _probe_redis_down(cluster, REDIS_CUT_SECONDS, "c")
    proxy.restore()
    restored = time.monotonic()
    outage_jobs = [*stalled.jobs, *cut.jobs]

    def since_restore(predicate: Any, timeout: float = 30) -> float:
        wait_for(predicate, timeout)
        return time.monotonic() - restored

    health_ok = since_restore(
        lambda: httpx.get(f"{cluster.url}/healthz", timeout=10).status_code == 200
    )
    fresh = submitted(cluster, "after")
    assert fresh is not None
    fresh_done = since_restore(lambda: completed(cluster, fresh))
    outage_done = since_restore(lambda: all(completed(cluster, job) for job in outage_jobs))

    health_times = stalled.health + cut.health
    print(
        f"\nredis outage drill ({REDIS_STALL_SECONDS:g}s stalled, then {REDIS_CUT_SECONDS:g}s "
        f"refused): /healthz max {max(health_times):.3f}s over {len(health_times)} probes; "
        f"submit 201 while stalled max {max(stalled.submit):.2f}s, while refused max "
        f"{max(cut.submit):.3f}s; after restore: /healthz ok in {health_ok:.2f}s, new task "
        f"completed in {fresh_done:.2f}s, the {len(outage_jobs)} tasks submitted during the "
        f"outage completed in {outage_done:.2f}s"
    )
    assert max(health_times) < HEALTHZ_BOUND * MARGIN
    assert max(stalled.submit) < REDIS_CALL_BOUND * MARGIN
    assert max(cut.submit) < 1.5  # refused at once; three quick re-sends
    assert health_ok < RESUME_BOUND * MARGIN
    assert fresh_done < RESUME_BOUND * MARGIN
    assert outage_done < RESUME_BOUND * MARGIN
