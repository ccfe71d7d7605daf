"""A handler's error text holding NUL or a lone UTF-16 surrogate, recorded on PostgreSQL (which
refuses NUL in text and cannot take a surrogate over UTF-8) by the native runtime and by the
HTTP runtime; a result holding a lone surrogate fails as ``UnstorableResult``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from uuid import UUID

import pytest

from dtq.application.commands import JobView, SubmitJob, TaskSpec
from dtq.domain.status import RunStatus
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from dtq.worker import Options, PermanentError, Runtime, Task
from tests.http_runtime import runtime_over_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

OPTIONS = Options(poll_timeout=0.1, shutdown_grace=1.0, lease_renew_every=0.3)
SETTINGS = Settings(worker_id="w-err", lease_duration=2.0)
#: A file name that is not UTF-8, as ``os.listdir`` gives it: ``caf\udce9.txt``.
FILE_NAME = os.fsdecode(b"caf\xe9.txt")


@contextlib.asynccontextmanager
async def native(services: Services, runtime: Runtime) -> AsyncIterator[None]:
    stop = asyncio.Event()
    worker = asyncio.create_task(
        runtime.run(services.worker, runtime.configure(SETTINGS), stop=stop)
    )
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=10)


def over_http(services: Services, runtime: Runtime) -> contextlib.AbstractAsyncContextManager[None]:
    registry = new_registry()
    app = create_app(services.api, services.settings, OrchestratorMetrics(registry), registry)
    return runtime_over_http(app, runtime, SETTINGS)


async def wait_job(services: Services, job_id: UUID) -> JobView:
    async with asyncio.timeout(15):
        while not (view := await services.api.queries.get_job(job_id)).job.status.terminal:
            await asyncio.sleep(0.05)
    return view


async def test_a_permanent_error_with_nul_and_a_surrogate_fails_once_with_its_text(
    services: Services,
) -> None:
    runtime = Runtime(OPTIONS)

    @runtime.handler("weird")
    async def weird(task: Task) -> None:
        raise PermanentError("bad \x00 and \ud800")

    @runtime.handler("listing")
    def listing(task: Task) -> None:
        raise RuntimeError(f"cannot read {FILE_NAME}")

    submitted = await services.api.submit.submit_job(
        SubmitJob(
            tasks=(
                TaskSpec("w", "weird", max_attempts=2),
                TaskSpec("l", "listing", max_attempts=1),
            )
        )
    )
    async with native(services, runtime):
        await wait_job(services, submitted.job_id)

    weird_view = await services.api.queries.get_task(submitted.task_ids["w"])
    listing_view = await services.api.queries.get_task(submitted.task_ids["l"])
    assert (weird_view.task.status, weird_view.task.attempt) == ("failed", 1)
    assert weird_view.task.last_error == "PermanentError: bad \\u0000 and \\ud800"
    assert [(r.status, r.error, r.worker_id) for r in weird_view.runs] == [
        (RunStatus.FAILED, "PermanentError: bad \\u0000 and \\ud800", "w-err")
    ]
    assert listing_view.task.last_error == "RuntimeError: cannot read caf\\udce9.txt"
    assert [r.status for r in listing_view.runs] == [RunStatus.FAILED]


async def test_a_result_holding_a_lone_surrogate_fails_as_unstorable(services: Services) -> None:
    runtime = Runtime(OPTIONS)
    runtime.register("names", lambda task: {"name": FILE_NAME})
    submitted = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("n", "names", max_attempts=3),))
    )

    async with native(services, runtime):
        view = await wait_job(services, submitted.job_id)

    [task] = view.tasks
    assert (task.status, task.attempt) == ("failed", 1)
    assert (task.last_error or "").startswith(
        "UnstorableResult: result cannot be stored: string contains a lone UTF-16 surrogate"
        " (\\udce9) at result.name"
    )


async def test_the_http_runtime_records_a_surrogate_error_on_postgres(
    services: Services,
) -> None:
    runtime = Runtime(OPTIONS)

    @runtime.handler("weird")
    async def weird(task: Task) -> None:
        raise PermanentError(f"bad \x00 and {FILE_NAME}")

    submitted = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("w", "weird", max_attempts=2),))
    )
    async with over_http(services, runtime):
        view = await wait_job(services, submitted.job_id)

    [task] = view.tasks
    assert (task.status, task.attempt) == ("failed", 1)
    assert task.last_error == "PermanentError: bad \\u0000 and caf\\udce9.txt"
    runs = (await services.api.queries.get_task(task.id)).runs
    assert [r.error for r in runs] == ["PermanentError: bad \\u0000 and caf\\udce9.txt"]
