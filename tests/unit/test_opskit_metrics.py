"""The operator kit's metrics checks (issue 16 item 6): ``dtq dev``'s ``/metrics`` carries the
worker's series, no endpoint exposes prometheus-client's ``*_created`` series, and
``promtool check metrics`` accepts the orchestrator's ``/metrics`` and the worker's
``WORKER_METRICS_LISTEN`` endpoint without a message.

promtool is Debian's ``prometheus`` package; these checks skip without it, except under
``CI=true``, where ``.ci/run`` installs it and its absence is a failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import httpx
import pytest

from dtq.domain.status import TaskStatus
from dtq.entrypoints.cli.orchestrator import serve
from dtq.entrypoints.config import Settings
from dtq.entrypoints.worker.runtime import demo_runtime
from dtq.worker import Options, PermanentError, Runtime, Task
from tests.tcp_proxy import free_port
from tests.unit.api_harness import running_api
from tests.unit.promtool import check_metrics
from tests.unit.runtime_harness import SETTINGS, build_harness

pytestmark = pytest.mark.timeout(30)


def created_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "_created" in line]


@dataclass
class DevProcess:
    """``dtq dev`` served in this process: its API base URL and the worker's metrics URL."""

    api: httpx.AsyncClient
    worker_metrics_url: str


@asynccontextmanager
async def running_dev() -> AsyncIterator[DevProcess]:
    """``serve`` as ``dtq dev`` runs it (memory backend, demo runtime), with the worker's own
    metrics endpoint on; stopped by SIGTERM to this process, as ``dtq dev`` is."""
    api_port, worker_port = free_port(), free_port()
    settings = Settings(
        orchestrator_listen=f"127.0.0.1:{api_port}",
        worker_metrics_listen=f"127.0.0.1:{worker_port}",
        lease_duration=10.0,
        reconcile_interval=1.0,
        promote_interval=0.05,
        api_auth="none",  # as `dtq dev` runs it on loopback (the Settings default is "tokens")
    )
    server = asyncio.create_task(serve(settings, backend="memory", runtime=demo_runtime()))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}") as api:
            while True:
                if server.done():  # it failed to start: show why
                    await server
                try:
                    if (await api.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            yield DevProcess(api, f"http://127.0.0.1:{worker_port}/metrics")
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
        assert await server == 0


async def wait_status(api: httpx.AsyncClient, task_id: str, status: str) -> None:
    while (await api.get(f"/v1/tasks/{task_id}")).json()["status"] != status:
        await asyncio.sleep(0.02)


async def dev_after_work(dev: DevProcess) -> None:
    """Run one task to completion and submit one of a kind no worker serves (it stays queued:
    kind-aware routing), so the worker's labelled series (counters by kind, the handler
    histogram) have samples."""
    unknown = (await dev.api.post("/v1/tasks", json={"kind": "no.such.kind"})).json()
    done = (await dev.api.post("/v1/tasks", json={"kind": "echo", "payload": {}})).json()
    async with asyncio.timeout(10.0):
        await wait_status(dev.api, done["task_id"], "completed")
        await wait_status(dev.api, unknown["task_id"], "queued")


# --- dtq dev: one /metrics for the API, the reconciler and the worker ----------------------------


async def test_dev_metrics_carry_the_worker_series_beside_the_orchestrator_series() -> None:
    async with running_dev() as dev:
        await dev_after_work(dev)
        text = (await dev.api.get("/metrics")).text

    assert 'worker_tasks_succeeded_total{kind="echo"} 1.0' in text
    assert 'worker_handler_duration_seconds_count{kind="echo"} 1.0' in text
    assert "worker_unknown_kind_total 0.0" in text  # routed, not failed (issue 15 item 2)
    assert "orchestrator_tasks_submitted_total 2.0" in text
    assert created_lines(text) == []


async def test_dev_metrics_and_its_worker_endpoint_pass_promtool() -> None:
    async with running_dev() as dev:
        await dev_after_work(dev)
        api_text = (await dev.api.get("/metrics")).text
        worker_text = (await dev.api.get(dev.worker_metrics_url)).text

    assert "worker_tasks_claimed_total" in worker_text
    assert check_metrics(api_text) == ""
    assert check_metrics(worker_text) == ""


# --- dtq orchestrator's /metrics ------------------------------------------------------------------


async def test_orchestrator_metrics_have_no_created_series_and_pass_promtool() -> None:
    async with running_api() as api:
        await api.client.post("/v1/tasks", json={"kind": "echo"})
        await api.client.get("/v1/tasks/not-a-uuid")
        api.metrics.queued_unpolled.labels(priority="0").set(3)
        api.metrics.store_retries.labels(reason="serialization").inc()
        api.metrics.reconcile_duration.observe(0.01)
        text = (await api.client.get("/metrics")).text

    assert 'orchestrator_http_requests_total{method="POST",route="/v1/tasks",status="201"}' in text
    assert created_lines(text) == []
    assert check_metrics(text) == ""


# --- dtq worker's WORKER_METRICS_LISTEN endpoint -------------------------------------------------


async def test_worker_metrics_endpoint_has_no_created_series_and_passes_promtool() -> None:
    port = free_port()
    h = build_harness()
    runtime = Runtime(Options(lease_renew_every=0.1, shutdown_grace=0.2, poll_timeout=0.05))

    @runtime.handler("ok")
    async def ok(task: Task) -> None:
        return None

    @runtime.handler("bad")
    async def bad(task: Task) -> None:
        raise PermanentError("refused")

    good_id, bad_id = await h.one("ok"), await h.one("bad")
    settings = replace(SETTINGS, worker_metrics_listen=f"127.0.0.1:{port}")
    async with h.running(runtime, settings=settings):
        await h.wait_task(good_id, [TaskStatus.COMPLETED])
        await h.wait_task(bad_id, [TaskStatus.FAILED])
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text

    assert 'worker_tasks_failed_total{kind="bad"} 1.0' in text
    assert created_lines(text) == []
    assert check_metrics(text) == ""


def test_promtool_reports_a_counter_without_the_total_suffix() -> None:
    """The check is live: promtool does speak up on a bad exposition."""
    bad = "# HELP jobs Jobs.\n# TYPE jobs counter\njobs 1\n"

    assert "_total" in check_metrics(bad)
