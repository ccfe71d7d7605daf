"""Worker runtime lifecycle: graceful shutdown, hand-back, signals, outages, registry, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
from structlog.testing import capture_logs

from dtq.application.commands import Claim, ReportOutcome
from dtq.application.execution import ExecutionService
from dtq.application.registry import WorkerRegistryService
from dtq.domain.errors import BackendUnavailable
from dtq.domain.status import RunStatus, TaskStatus
from dtq.entrypoints.bundles import WorkerServices
from dtq.worker import Options, Runtime, Task
from tests.tcp_proxy import free_port
from tests.unit.runtime_harness import POLICY, SETTINGS, Harness, build_harness

pytestmark = pytest.mark.timeout(20)

FAST = Options(lease_renew_every=0.1, shutdown_grace=0.2, poll_timeout=0.05)


def sleeper(runtime: Runtime, kind: str, seconds: float) -> tuple[asyncio.Event, asyncio.Event]:
    """Register an async handler that sleeps; return (started, cancelled) events."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    @runtime.handler(kind)
    async def sleep(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return started, cancelled


# -- graceful shutdown --------------------------------------------------------------------------


async def test_stop_lets_a_handler_finish_within_the_grace_period() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, shutdown_grace=5.0))
    started, cancelled = sleeper(runtime, "short", 0.2)
    task_id = await h.one("short")

    async with h.running(runtime, reconcile=False) as stop:
        await asyncio.wait_for(started.wait(), 5)
        stop.set()

    view = await h.task(task_id)
    assert not cancelled.is_set()
    assert view.task.status is TaskStatus.COMPLETED
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert h.counter("worker_shutdowns_total", reason="stop") == 1


async def test_stop_hands_back_a_handler_that_outlives_the_grace_period() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    started, cancelled = sleeper(runtime, "long", 30)
    task_id = await h.one("long")

    async with h.running(runtime, reconcile=False) as stop:
        await asyncio.wait_for(started.wait(), 5)
        stopped_at = time.monotonic()
        stop.set()
    elapsed = time.monotonic() - stopped_at

    assert cancelled.is_set()
    assert elapsed < 1.5  # grace 0.2 s, then the hand-back: no waiting for reclaim
    view = await h.task(task_id)
    assert view.task.status is TaskStatus.QUEUED
    assert view.task.attempt == 0  # rolled back: the shutdown cost no retry
    assert [(r.status, r.error) for r in view.runs] == [(RunStatus.DEAD, "worker shutting down")]
    # The marker was released and the id pushed again (a push needs a free marker).
    assert h.queue.ready_ids("default") == [task_id]
    assert h.queue.get_lease(task_id) is None
    assert h.counter("worker_shutdowns_total", reason="stop") == 1

    # Another worker picks it up straight away and the history shows both deliveries.
    again = Runtime(FAST)
    again.register("long", lambda task: None)
    async with h.running(again, reconcile=False):
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])
    assert [(r.attempt_number, r.status) for r in view.runs] == [
        (1, RunStatus.DEAD),
        (1, RunStatus.SUCCEEDED),
    ]


async def test_stop_now_skips_the_grace_period() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, shutdown_grace=30.0))
    started, cancelled = sleeper(runtime, "long", 30)
    task_id = await h.one("long")
    stop, stop_now = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(
        runtime.run(h.services, h.config(runtime), stop=stop, stop_now=stop_now, metrics=h.metrics)
    )

    await asyncio.wait_for(started.wait(), 5)
    stop.set()
    await asyncio.sleep(0.1)
    assert not worker.done()  # within the grace period
    stop_now.set()
    await asyncio.wait_for(worker, 2)

    assert cancelled.is_set()
    view = await h.task(task_id)
    assert [r.status for r in view.runs] == [RunStatus.DEAD]
    assert view.task.status is TaskStatus.QUEUED


async def test_cancelling_run_hands_tasks_back_and_propagates() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    started, _ = sleeper(runtime, "long", 30)
    task_id = await h.one("long")
    worker = asyncio.create_task(runtime.run(h.services, h.config(runtime), metrics=h.metrics))

    await asyncio.wait_for(started.wait(), 5)
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(worker, 2)

    view = await h.task(task_id)
    assert [r.status for r in view.runs] == [RunStatus.DEAD]
    assert h.counter("worker_shutdowns_total", reason="cancelled") == 1


async def test_a_runtime_cannot_run_twice_at_once() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    async with h.running(runtime, reconcile=False):
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="already running"):
            await runtime.run(h.services, h.config(runtime))


# -- signals ------------------------------------------------------------------------------------


def _signal_when(flag: threading.Event, *signums: signal.Signals) -> threading.Thread:
    def send() -> None:
        assert flag.wait(5)
        for signum in signums:
            time.sleep(0.1)
            os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _run_forever_with(handler_seconds: float, *signums: signal.Signals) -> tuple[Harness, Task]:
    h = build_harness()
    runtime = Runtime(replace(FAST, shutdown_grace=5.0))
    started = threading.Event()
    seen: list[Task] = []

    @runtime.handler("work")
    async def work(task: Task) -> None:
        seen.append(task)
        started.set()
        await asyncio.sleep(handler_seconds)

    @contextlib.asynccontextmanager
    async def open_services() -> AsyncIterator[WorkerServices]:
        await h.one("work")
        yield h.services

    sender = _signal_when(started, *signums)
    runtime.run_forever(open_services, settings=h.settings, metrics=h.metrics)
    sender.join(5)
    return h, seen[0]


def test_run_forever_stops_gracefully_on_sigterm() -> None:
    h, task = _run_forever_with(0.4, signal.SIGTERM)

    view = asyncio.run(h.task(task.id))
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert h.counter("worker_shutdowns_total", reason="signal") == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers removed again


def test_run_forever_second_signal_hands_back_at_once() -> None:
    started = time.monotonic()
    h, task = _run_forever_with(30, signal.SIGTERM, signal.SIGINT)

    assert time.monotonic() - started < 4  # did not wait out the 5 s grace
    view = asyncio.run(h.task(task.id))
    assert [r.status for r in view.runs] == [RunStatus.DEAD]


# -- resilience ---------------------------------------------------------------------------------


async def test_store_outage_is_logged_and_the_loop_carries_on() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("echo", lambda task: None)
    task_id = await h.one("echo")
    h.store.available = False

    with capture_logs() as logs:
        async with h.running(runtime):
            await asyncio.sleep(0.3)
            h.store.available = True
            view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert any(e["event"] == "backend unavailable" for e in logs)


class _FlakyReports(ExecutionService):
    """Fails the first completion batch as if the database dropped the connection."""

    failures = 1

    async def complete_many(
        self,
        claims: Sequence[Claim],
        results: Sequence[Any] | None = None,
        *,
        progress: Mapping[UUID, Any] | None = None,
    ) -> list[ReportOutcome]:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("connection reset")
        return await super().complete_many(claims, results, progress=progress)


async def test_recording_an_outcome_is_retried_after_a_backend_error() -> None:
    h = build_harness()
    h.execution = _FlakyReports(store=h.store, queue=h.queue, policy=POLICY)
    runtime = Runtime(FAST)
    calls: list[int] = []
    runtime.register("echo", lambda task: calls.append(task.attempt))
    task_id = await h.one("echo")

    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert calls == [1]  # recorded by a retry of the report, not by running the handler again
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]


async def test_only_the_configured_priority_tiers_are_popped() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, priorities=("high", "default")))
    runtime.register("echo", lambda task: None)
    high = await h.one("echo", priority="high")
    low = await h.one("echo", priority="low")

    async with h.running(runtime, reconcile=False):
        await h.wait_task(high, [TaskStatus.COMPLETED])
        await asyncio.sleep(0.1)

    assert (await h.task(low)).task.status is TaskStatus.QUEUED
    assert h.queue.ready_ids("low") == [low]


# -- registry and metrics -----------------------------------------------------------------------


async def test_worker_registers_itself_with_its_kinds_priorities_and_concurrency() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, concurrency=3))
    runtime.register("b", lambda task: None)
    runtime.register("a", lambda task: None)

    async with h.running(runtime, reconcile=False):
        await asyncio.sleep(0.05)
        workers = await h.queries.list_workers(60)

    assert [w.id for w in workers] == [SETTINGS.worker_id]
    assert workers[0].hostname == socket.gethostname()
    assert workers[0].metadata == {
        "kinds": ["a", "b"],
        "priorities": ["default"],
        "concurrency": 3,
        "pid": os.getpid(),
    }


async def test_metrics_are_served_when_an_address_is_configured() -> None:
    port = free_port()
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("echo", lambda task: None)
    task_id = await h.one("echo")
    settings = replace(SETTINGS, worker_metrics_listen=f"127.0.0.1:{port}")

    async with h.running(runtime, settings=settings):
        await h.wait_task(task_id, [TaskStatus.COMPLETED])
        url = f"http://127.0.0.1:{port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())

    assert b'worker_tasks_succeeded_total{kind="echo"} 1.0' in body
    with pytest.raises(urllib.error.URLError):  # the server is gone once the runtime stopped
        await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=1).read())


async def test_a_clean_stop_removes_the_workers_registry_row() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("a", lambda task: None)

    async with h.running(runtime, reconcile=False):
        async with asyncio.timeout(5):
            while not await h.queries.list_workers(60):
                await asyncio.sleep(0.01)

    assert await h.queries.list_workers(60) == []


async def test_a_cancelled_run_removes_the_workers_registry_row_too() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("a", lambda task: None)
    worker = asyncio.create_task(runtime.run(h.services, h.config(runtime), metrics=h.metrics))
    async with asyncio.timeout(5):
        while not await h.queries.list_workers(60):
            await asyncio.sleep(0.01)

    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(worker, 2)

    assert await h.queries.list_workers(60) == []


class _UnremovableRegistry(WorkerRegistryService):
    """Heartbeats work; removing the row fails as if the database were down."""

    async def remove(self, worker_id: str) -> bool:
        raise BackendUnavailable("connection refused")


async def test_a_registry_row_that_cannot_be_removed_at_stop_is_a_warning_not_a_crash() -> None:
    h = build_harness()
    h.registry = _UnremovableRegistry(store=h.store)
    runtime = Runtime(FAST)
    runtime.register("a", lambda task: None)

    with capture_logs() as logs:
        async with h.running(runtime, reconcile=False):
            await asyncio.sleep(0.05)

    [warning] = [e for e in logs if e["event"] == "worker registry row not removed"]
    assert warning["log_level"] == "warning"
    assert "connection refused" in warning["error"]
    assert [w.id for w in await h.queries.list_workers(60)] == [SETTINGS.worker_id]
