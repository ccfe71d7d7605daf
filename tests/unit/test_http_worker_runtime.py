"""The Python ``Runtime`` over HTTP (issue 15 item 1): the same handlers, run through the
orchestrator's ``/v1/worker`` routes (in process, on the memory adapters) instead of the
database and Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import httpx
import pytest
from structlog.testing import capture_logs

from dtq.application.commands import JobView, SubmitJob, TaskSpec, TaskView
from dtq.entrypoints.config import Settings
from dtq.entrypoints.worker.http import open_http_worker_services
from dtq.worker import Options, PermanentError, Runtime, Task
from tests.http_runtime import runtime_over_http
from tests.unit.api_harness import SETTINGS, Api, running_api

WORKER = Settings(worker_id="http-worker", lease_duration=3.0, worker_heartbeat_interval=1.0)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api(SETTINGS) as running:
        yield running


def working(
    api: Api, runtime: Runtime, token: str | None = None
) -> contextlib.AbstractAsyncContextManager[None]:
    """Run ``runtime`` over HTTP against ``api`` for the block, then stop it gracefully."""
    return runtime_over_http(api.app, runtime, WORKER, token=token)


async def wait_job(api: Api, job_id: UUID, timeout: float = 10.0) -> JobView:
    async with asyncio.timeout(timeout):
        while True:
            view = await api.services.api.queries.get_job(job_id)
            if view.job.status.terminal:
                return view
            await asyncio.sleep(0.02)


async def promote_forever(api: Api) -> None:
    """What the orchestrator's promoter does: move due scheduled entries to the ready lists."""
    while True:
        await api.queue.promote_due(10)
        await asyncio.sleep(0.02)


def runtime_with_handlers() -> Runtime:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))

    @runtime.handler("count")
    async def count(task: Task) -> Any:
        task.progress({"seen": len(task.payload)})
        return {"words": len(task.payload)}

    @runtime.handler("sum")
    def total(task: Task) -> Any:  # a plain function: runs in a thread, as natively
        return sum(parent["words"] for parent in task.parents.values())

    @runtime.handler("refuse")
    async def refuse(task: Task) -> None:
        raise PermanentError("bad payload")

    return runtime


async def test_a_dag_runs_to_completion_with_results_and_parents(api: Api) -> None:
    submitted = await api.services.api.submit.submit_job(
        SubmitJob(
            tasks=(
                TaskSpec(name="a", kind="count", payload=["x", "y"]),
                TaskSpec(name="b", kind="count", payload=["x", "y", "z"]),
                TaskSpec(name="s", kind="sum", depends_on=("a", "b")),
            )
        )
    )

    async with working(api, runtime_with_handlers()):
        view = await wait_job(api, submitted.job_id)

    by_name = {task.name: task for task in view.tasks}
    assert view.job.status == "completed"
    assert by_name["a"].result == {"words": 2}
    assert by_name["s"].result == 5
    assert by_name["b"].progress == {"seen": 3}  # the final progress, sent with the result
    runs = await api.services.api.queries.get_task(by_name["s"].id)
    assert [run.worker_id for run in runs.runs] == ["http-worker"]


async def test_a_permanent_error_fails_the_task_without_retrying(api: Api) -> None:
    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="r", kind="refuse", max_attempts=3),))
    )

    async with working(api, runtime_with_handlers()):
        view = await wait_job(api, submitted.job_id)

    [task] = view.tasks
    assert (view.job.status, task.attempt) == ("failed", 1)
    assert task.last_error == "PermanentError: bad payload"


async def through_one_retry(api: Api, task_id: UUID, job_id: UUID) -> tuple[TaskView, JobView]:
    """Wait for the task's first failure, make its retry due and promote it, then wait for the
    job to finish: the task as it stood after the failure, and the finished job."""
    queries = api.services.api.queries
    async with asyncio.timeout(10):
        while (await queries.get_task(task_id)).task.last_error is None:
            await asyncio.sleep(0.02)
    failed = await queries.get_task(task_id)
    api.clock.advance(60)  # past RETRY_BACKOFF: the retry is due
    promoter = asyncio.create_task(promote_forever(api))
    try:
        return failed, await wait_job(api, job_id)
    finally:
        promoter.cancel()


async def test_a_handler_timeout_is_a_failure_retried_by_policy(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))
    calls: list[int] = []

    @runtime.handler("slow", timeout=0.1)
    async def slow(task: Task) -> str:
        calls.append(task.attempt)
        if task.attempt == 1:
            await asyncio.sleep(5)
        return "done"

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="s", kind="slow", max_attempts=2),))
    )
    [task_id] = submitted.task_ids.values()
    async with working(api, runtime):
        view, job = await through_one_retry(api, task_id, submitted.job_id)

    assert view.runs[0].error == "timed out after 0.1 s"
    assert (job.job.status, calls) == ("completed", [1, 2])


async def test_progress_none_before_a_failure_gives_the_retry_a_clean_start(api: Api) -> None:
    """The README's "report None before it raises", over HTTP as natively (the retry got the
    earlier 7 as its checkpoint: a null progress was taken for none)."""
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0, lease_renew_every=0.05))
    checkpoints: list[Any] = []
    renewed = asyncio.Event()

    @runtime.handler("reset")
    async def reset(task: Task) -> Any:
        checkpoints.append(task.checkpoint)
        if task.attempt == 1:
            task.progress(7)
            async with asyncio.timeout(5):  # until a lease renewal stored the 7
                while (await api.services.api.queries.get_task(task.id)).task.progress != 7:
                    await asyncio.sleep(0.02)
            renewed.set()
            task.progress(None)
            raise ValueError("start over")
        return task.checkpoint

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="r", kind="reset", max_attempts=2),))
    )
    [task_id] = submitted.task_ids.values()
    async with working(api, runtime):
        _, job = await through_one_retry(api, task_id, submitted.job_id)

    [task] = job.tasks
    assert renewed.is_set()
    assert (job.job.status, checkpoints) == ("completed", [None, None])
    assert (task.progress, task.result) == (None, None)


async def test_the_worker_registers_its_kinds_over_http(api: Api) -> None:
    async with working(api, runtime_with_handlers()):
        async with asyncio.timeout(5):
            while not (workers := await api.services.api.queries.list_workers(60.0)):
                await asyncio.sleep(0.02)

    assert workers[0].id == "http-worker"
    assert workers[0].metadata["kinds"] == ["count", "refuse", "sum"]


async def test_a_clean_stop_removes_the_workers_row_over_http(api: Api) -> None:
    async with working(api, runtime_with_handlers()):
        async with asyncio.timeout(5):
            while not await api.services.api.queries.list_workers(60.0):
                await asyncio.sleep(0.02)

    assert await api.services.api.queries.list_workers(60.0) == []


async def test_the_token_is_sent_as_a_bearer_header(api: Api) -> None:
    seen: list[str | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(b"authorization", b"").decode() or None)
        await api.app(scope, receive, send)

    async with open_http_worker_services(
        "http://dtq",
        worker_id="w",
        kinds=["count"],
        lease_duration=3.0,
        max_result_bytes=1024,
        token="s3cret",
        transport=httpx.ASGITransport(app=app),
    ) as services:
        await services.queue.pop_many(["default"], 0.0, 1)

    assert seen == ["Bearer s3cret"]


async def test_artifacts_go_through_the_orchestrator(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))

    @runtime.handler("store")
    async def store(task: Task) -> Any:
        return await task.artifacts.put(b"x" * 1000)

    @runtime.handler("load")
    async def load(task: Task) -> int:
        chunks = [chunk async for chunk in await task.artifacts.open(task.parents["s"])]
        return len(b"".join(chunks))

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(
            tasks=(TaskSpec(name="s", kind="store"), TaskSpec("l", "load", depends_on=("s",)))
        )
    )

    async with working(api, runtime):
        view = await wait_job(api, submitted.job_id)

    by_name = {task.name: task for task in view.tasks}
    assert view.job.status == "completed", [t.last_error for t in view.tasks]
    assert by_name["s"].result["size"] == 1000
    assert by_name["l"].result == 1000


async def test_an_artifact_call_the_token_may_not_make_fails_at_once_naming_the_scope() -> None:
    """A worker token of the ``worker`` scope alone: the orchestrator answers 403 to
    ``/v1/artifacts``. That is permanent (another attempt is refused too), so the task fails
    on its first attempt with the scope named; it was a ``BackendUnavailable`` ('artifact
    upload answered 403') retried until ``max_attempts``."""
    from dataclasses import replace

    from dtq.domain.tokens import Scope

    async with running_api(replace(SETTINGS, api_auth="tokens")) as api:
        secret = (await api.services.api.tokens.create("workers", {Scope.WORKER})).secret
        runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))

        @runtime.handler("store")
        async def store(task: Task) -> Any:
            return await task.artifacts.put(b"x" * 10)

        @runtime.handler("load")
        async def load(task: Task) -> Any:
            return [c async for c in await task.artifacts.open(str(UUID(int=1)))]

        submitted = [
            await api.services.api.submit.submit_job(
                SubmitJob(tasks=(TaskSpec(name="t", kind=kind, max_attempts=3),))
            )
            for kind in ("store", "load")
        ]
        promoter = asyncio.create_task(promote_forever(api))  # would move retries back
        try:
            async with working(api, runtime, token=secret):
                views = [await wait_job(api, job.job_id) for job in submitted]
        finally:
            promoter.cancel()

    [stored], [loaded] = (view.tasks for view in views)
    assert (stored.status, stored.attempt) == ("failed", 1)
    assert stored.last_error == (
        "ArtifactForbidden: the token lacks the 'submit' scope (artifact upload): the"
        " orchestrator answered 403 forbidden: this route needs a token with the 'submit' scope"
    )
    assert (loaded.status, loaded.attempt) == ("failed", 1)
    assert loaded.last_error is not None
    assert loaded.last_error.startswith(
        "ArtifactForbidden: the token lacks the 'read' scope (artifact download)"
    )


async def test_an_error_text_with_nul_is_still_recorded(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))

    @runtime.handler("nul")
    async def nul(task: Task) -> None:
        raise ValueError("bad\x00byte")

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="n", kind="nul", max_attempts=1),))
    )

    async with working(api, runtime):
        view = await wait_job(api, submitted.job_id)

    assert view.job.status == "failed"
    assert view.tasks[0].last_error == "ValueError: bad\\u0000byte"


async def test_a_graceful_stop_hands_a_running_task_back_over_http(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=0.1))
    started = asyncio.Event()

    @runtime.handler("long")
    async def long(task: Task) -> None:
        task.progress({"at": 1})
        started.set()
        await asyncio.sleep(30)

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="l", kind="long"),))
    )
    [task_id] = submitted.task_ids.values()

    async with working(api, runtime):
        await asyncio.wait_for(started.wait(), timeout=10)

    view = await api.services.api.queries.get_task(task_id)
    assert (view.task.status, view.task.attempt, view.task.progress) == ("queued", 0, {"at": 1})
    assert [(run.status, run.error) for run in view.runs] == [("dead", "worker shutting down")]
    assert api.queue.ready_ids("default") == [task_id]  # pushed again at once


async def test_a_cancel_stops_the_handler_over_http_and_nothing_is_reported(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0, lease_renew_every=0.1))
    started, stopped = asyncio.Event(), asyncio.Event()

    @runtime.handler("long")
    async def long(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="l", kind="long"),))
    )
    [task_id] = submitted.task_ids.values()

    async with working(api, runtime):
        await asyncio.wait_for(started.wait(), timeout=10)
        await api.services.api.control.cancel_task(task_id)
        await asyncio.wait_for(stopped.wait(), timeout=10)

    view = await api.services.api.queries.get_task(task_id)
    assert view.task.status == "cancelled"
    assert [run.status for run in view.runs] == ["cancelled"]


async def test_a_success_held_through_a_database_outage_longer_than_the_lease_is_recorded(
    api: Api,
) -> None:
    # Given a handler that finishes once the database is down (lease 3 s, renewed every 0.2 s)
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0, lease_renew_every=0.2))
    started, finish = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    @runtime.handler("work")
    async def work(task: Task) -> str:
        calls.append(task.attempt)
        started.set()
        await finish.wait()
        return "done"

    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="w", kind="work"),))
    )
    [task_id] = submitted.task_ids.values()

    with capture_logs() as logs:
        async with working(api, runtime):
            await asyncio.wait_for(started.wait(), timeout=10)
            api.store.available = False
            finish.set()
            # When the outage outlasts LEASE_DURATION and the report's five tries (~5.5 s)
            await asyncio.sleep(WORKER.lease_duration + 3.5)
            api.store.available = True
            view = await wait_job(api, submitted.job_id)

    # Then the heartbeats kept the lease, and the success is recorded after the outage
    assert not [e["event"] for e in logs if e["event"].startswith("lease lost")]
    assert view.job.status == "completed"
    task = await api.services.api.queries.get_task(task_id)
    assert (task.task.result, task.task.attempt, calls) == ("done", 1, [1])
    assert [run.status for run in task.runs] == ["succeeded"]


async def test_an_artifact_over_the_apis_limit_fails_at_once_saying_so() -> None:
    """413 is the same answer on every attempt: the task fails on its first (it was a
    BackendUnavailable, 'artifact upload answered 413', retried until max_attempts)."""
    from dataclasses import replace

    async with running_api(replace(SETTINGS, api_max_artifact_bytes=16)) as api:
        runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))

        @runtime.handler("store")
        async def store(task: Task) -> Any:
            return await task.artifacts.put(b"x" * 100)

        submitted = await api.services.api.submit.submit_job(
            SubmitJob(tasks=(TaskSpec(name="t", kind="store", max_attempts=3),))
        )
        promoter = asyncio.create_task(promote_forever(api))  # would move retries back
        try:
            async with working(api, runtime):
                view = await wait_job(api, submitted.job_id)
        finally:
            promoter.cancel()

    [task] = view.tasks
    assert (task.status, task.attempt) == ("failed", 1)
    assert task.last_error is not None
    assert task.last_error.startswith(
        "PermanentError: artifact upload refused: the orchestrator answered 413"
    ), task.last_error
