"""A handler's error text holding NUL or a lone UTF-16 surrogate is recorded, escaped, by both
runtimes (native on the memory adapters, HTTP through the in-process API); results and progress
holding a lone surrogate fail cleanly as ``UnstorableResult`` / ``UnstorableProgress``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from uuid import UUID

import pytest

from dtq.application.commands import JobView, SubmitJob, TaskSpec
from dtq.domain.payload import storable_text
from dtq.domain.status import RunStatus, TaskStatus
from dtq.entrypoints.config import Settings
from dtq.worker import Options, PermanentError, Runtime, Task
from tests.http_runtime import runtime_over_http
from tests.unit.api_harness import Api, running_api
from tests.unit.runtime_harness import build_harness

pytestmark = pytest.mark.timeout(20)

FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)
#: A file name that is not UTF-8, as ``os.listdir`` gives it: ``caf\udce9.txt``.
FILE_NAME = os.fsdecode(b"caf\xe9.txt")


# --- storable_text ------------------------------------------------------------------------------


def test_nul_and_lone_surrogates_are_written_as_their_escapes() -> None:
    assert storable_text("a\x00b \ud800 \udcff") == "a\\u0000b \\ud800 \\udcff"
    assert storable_text(FILE_NAME) == "caf\\udce9.txt"


def test_other_text_is_kept_as_it_is() -> None:
    text = "héllo ☃ \U0001f600 a\\u0000 \n\t"
    assert storable_text(text) is text


def test_the_cap_counts_the_escapes_and_never_cuts_one() -> None:
    assert storable_text("x" * 20, max_chars=10) == "x" * 10
    assert storable_text("ab\x00", max_chars=8) == "ab\\u0000"
    assert storable_text("ab\x00", max_chars=7) == "ab"
    assert storable_text("\ud800" * 3, max_chars=12) == "\\ud800\\ud800"
    assert storable_text("\x00" + "x" * 20, max_chars=10) == "\\u0000xxxx"


# --- the native runtime -------------------------------------------------------------------------


async def test_a_permanent_error_with_nul_and_a_surrogate_fails_the_task_once_escaped() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("weird")
    async def weird(task: Task) -> None:
        raise PermanentError("bad \x00 and \ud800")

    task_id = await h.one("weird", max_attempts=3)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    expected = "PermanentError: bad \\u0000 and \\ud800"
    assert view.task.attempt == 1
    assert view.task.last_error == expected
    assert [(r.status, r.error, r.worker_id) for r in view.runs] == [
        (RunStatus.FAILED, expected, "worker-test")
    ]


async def test_a_long_error_is_cut_to_10000_characters_as_over_http() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("long")
    async def long(task: Task) -> None:
        raise PermanentError("x" * 50_000)

    task_id = await h.one("long", max_attempts=1)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    expected = ("PermanentError: " + "x" * 50_000)[:10_000]
    assert view.task.last_error == expected
    assert [r.error for r in view.runs] == [expected]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("str fails")


async def test_an_error_whose_text_cannot_be_made_fails_the_task_once() -> None:
    """``str(exc)`` raising must not stop the failure report: the task failed after one run,
    not reclaimed until the crash budget ran out with the error lost."""
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("unprintable")
    async def unprintable(task: Task) -> None:
        raise _Unprintable()

    task_id = await h.one("unprintable", max_attempts=1)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    expected = "_Unprintable: <str() failed: ValueError: str fails>"
    assert (view.task.attempt, view.task.last_error) == (1, expected)
    assert [(r.status, r.error) for r in view.runs] == [(RunStatus.FAILED, expected)]


async def test_an_error_naming_a_non_utf8_file_is_retried_by_policy_and_recorded() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("open")
    def open_file(task: Task) -> None:
        raise FileNotFoundError(f"no such file: {FILE_NAME}")

    task_id = await h.one("open", max_attempts=2)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    expected = "FileNotFoundError: no such file: caf\\udce9.txt"
    assert (view.task.attempt, view.task.last_error) == (2, expected)
    assert [(r.status, r.error) for r in view.runs] == [(RunStatus.FAILED, expected)] * 2


async def test_the_execution_service_escapes_a_failure_and_a_hand_back_reason() -> None:
    h = build_harness()
    failed = await h.one("k", max_attempts=1)
    handed = await h.one("k")
    ids = await h.queue.pop_many(["default"], timeout=0.05, max_count=2)
    claims = {c.task.id: c for c in await h.execution.claim_many(ids, "w1")}

    await h.execution.fail(claims[failed], "RuntimeError: \x00 \udcff")
    await h.execution.hand_back(claims[handed], "stopping \ud800")

    failure = await h.task(failed)
    hand_back = await h.task(handed)
    assert failure.task.last_error == "RuntimeError: \\u0000 \\udcff"
    assert [r.error for r in failure.runs] == ["RuntimeError: \\u0000 \\udcff"]
    assert hand_back.task.status is TaskStatus.QUEUED
    assert [r.error for r in hand_back.runs] == ["stopping \\ud800"]


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        ({"name": FILE_NAME}, "lone UTF-16 surrogate (\\udce9) at result.name"),
        ({FILE_NAME: 1}, "lone UTF-16 surrogate (\\udce9) at result.caf\\udce9.txt"),
        (["\ud800"], "lone UTF-16 surrogate (\\ud800) at result[0]"),
    ],
)
async def test_a_result_holding_a_lone_surrogate_fails_as_unstorable(
    returned: object, why: str
) -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("names", lambda task: returned)
    task_id = await h.one("names", max_attempts=3)

    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    error = view.task.last_error or ""
    assert view.task.attempt == 1  # permanent: no retry
    assert error.startswith("UnstorableResult: result cannot be stored: ")
    assert why in error
    assert error.isascii()


async def test_a_progress_holding_a_lone_surrogate_fails_as_unstorable() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("scan")
    async def scan(task: Task) -> None:
        task.progress({"at": FILE_NAME})

    task_id = await h.one("scan", max_attempts=3)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert view.task.attempt == 1
    assert view.task.progress is None
    assert (view.task.last_error or "").startswith(
        "UnstorableProgress: progress cannot be stored: string contains a lone UTF-16"
        " surrogate (\\udce9) at progress.at"
    )


# --- the HTTP runtime and the API -----------------------------------------------------------------

WORKER = Settings(worker_id="http-worker", lease_duration=3.0, worker_heartbeat_interval=1.0)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


def working(api: Api, runtime: Runtime) -> contextlib.AbstractAsyncContextManager[None]:
    """Run ``runtime`` over HTTP against ``api`` for the block, then stop it gracefully."""
    return runtime_over_http(api.app, runtime, WORKER)


async def run_one(api: Api, runtime: Runtime, kind: str) -> JobView:
    """Submit one ``kind`` task (3 attempts), run ``runtime`` over HTTP until its job ends."""
    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="t", kind=kind, max_attempts=3),))
    )
    async with working(api, runtime), asyncio.timeout(5):
        while not (
            view := await api.services.api.queries.get_job(submitted.job_id)
        ).job.status.terminal:
            await asyncio.sleep(0.02)
    return view


async def test_a_permanent_error_with_a_surrogate_is_recorded_over_http(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))

    @runtime.handler("weird")
    async def weird(task: Task) -> None:
        raise PermanentError(f"bad \x00 and {FILE_NAME}")

    view = await run_one(api, runtime, "weird")

    [task] = view.tasks
    assert (view.job.status, task.attempt) == ("failed", 1)
    assert task.last_error == "PermanentError: bad \\u0000 and caf\\udce9.txt"


async def test_a_result_holding_a_lone_surrogate_fails_as_unstorable_over_http(api: Api) -> None:
    runtime = Runtime(Options(poll_timeout=0.2, shutdown_grace=1.0))
    runtime.register("names", lambda task: {"name": FILE_NAME})

    view = await run_one(api, runtime, "names")

    [task] = view.tasks
    assert (view.job.status, task.attempt) == ("failed", 1)
    assert (task.last_error or "").startswith(
        "UnstorableResult: result cannot be stored: string contains a lone UTF-16 surrogate"
        " (\\udce9) at result.name"
    )


async def test_a_failure_body_holding_a_lone_surrogate_is_a_400_naming_error(api: Api) -> None:
    submitted = await api.services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec(name="t", kind="k"),))
    )
    claimed = await api.client.post(
        "/v1/worker/claim", json={"worker_id": "w1", "kinds": ["k"], "wait": "0s"}
    )
    [item] = claimed.json()["tasks"]

    response = await api.client.post(
        f"/v1/worker/runs/{item['run_id']}/failure",
        content=b'{"error": "bad \\ud800"}',
        headers={"X-Worker-Id": "w1", "Content-Type": "application/json"},
    )

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == "error"
    view = await api.services.api.queries.get_task(UUID(item["task_id"]))
    assert (view.task.status, view.task.last_error) == (TaskStatus.RUNNING, None)
    assert submitted.task_ids["t"] == view.task.id
