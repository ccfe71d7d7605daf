"""The Python client ``dtq.client`` (issue 15 item 4): the blocking and asyncio clients against
the real app under uvicorn on the memory backend, and their retry rules on a mock transport."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from dtq.client import (
    AsyncClient,
    BadRequest,
    Client,
    Forbidden,
    IdempotencyConflict,
    JobBuilder,
    NotCancellable,
    NotFound,
    NotRetryable,
    TransportError,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from dtq.client.config import ClientConfig
from dtq.client.errors import ApiError, InvalidRequest, error_for
from dtq.client.jobs import go_duration
from dtq.domain.tokens import Scope
from tests.unit.api_harness import SETTINGS
from tests.unit.http_server import Server, serving


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with serving() as running:
        yield running


# -- the blocking client against a real server (its calls run in a thread) -------------------


async def test_submit_task_and_read_it_back_typed(server: Server) -> None:
    def run() -> tuple[Any, Any]:
        with Client(server.url) as client:
            created = client.submit_task("echo", {"n": 1}, priority="high", max_attempts=5)
            return created, client.get_task(created.task_id)

    created, task = await asyncio.to_thread(run)

    assert task.id == created.task_id
    assert task.job_id == created.job_id
    assert (task.kind, task.payload, task.priority, task.max_attempts) == (
        "echo",
        {"n": 1},
        "high",
        5,
    )
    assert task.status == "queued"
    assert task.runs == []


async def test_a_dag_built_by_name_runs_to_results_and_wait_returns_the_finished_job(
    server: Server,
) -> None:
    job = JobBuilder("etl", metadata={"team": "data"})
    a = job.task("a", "echo", payload=1)
    b = job.task("b", "echo", payload=2)
    job.task("sum", "add", depends_on=[a, b])

    with Client(server.url) as client:
        created = await asyncio.to_thread(client.submit_job, job)
        assert set(created.tasks) == {"a", "b", "sum"}
        for name, value in (("a", 1), ("b", 2)):
            await server.complete(created.tasks[name], value)
        await server.complete(created.tasks["sum"], 3)

        finished = await asyncio.to_thread(client.wait, created.job_id, 5.0)
        results = await asyncio.to_thread(client.results, created.job_id)

    assert finished.status == "completed"
    assert finished.name == "etl"
    assert finished.metadata == {"team": "data"}
    assert results == {"a": 1, "b": 2, "sum": 3}


async def test_results_iterate_every_page(server: Server) -> None:
    job = JobBuilder()
    for i in range(7):
        job.task(f"t{i}", "echo")
    with Client(server.url) as client:
        created = await asyncio.to_thread(client.submit_job, job)
        for i in range(7):
            await server.complete(created.tasks[f"t{i}"], i * 10)
        listed = await asyncio.to_thread(
            lambda: [r.result for r in client.iter_results(created.job_id, page_size=3)]
        )

    assert listed == [0, 10, 20, 30, 40, 50, 60]


async def test_wait_gives_up_with_the_last_status_seen(server: Server) -> None:
    with Client(server.url) as client:
        created = await asyncio.to_thread(client.submit_task, "echo")
        with pytest.raises(WaitTimeout) as raised:
            await asyncio.to_thread(client.wait, created.job_id, 0.3, poll=0.05)

    assert raised.value.status == "pending"
    assert raised.value.job_id == str(created.job_id)


async def test_api_errors_become_exceptions_carrying_code_message_and_field(
    server: Server,
) -> None:
    with Client(server.url) as client:
        with pytest.raises(BadRequest) as bad:
            await asyncio.to_thread(client.submit_task, "no spaces allowed")
        with pytest.raises(NotFound) as missing:
            await asyncio.to_thread(client.get_task, "00000000-0000-4000-8000-000000000000")
        await asyncio.to_thread(client.submit_task, "echo", idempotency_key="k-1")
        with pytest.raises(IdempotencyConflict) as conflict:
            await asyncio.to_thread(client.submit_task, "other", idempotency_key="k-1")

    assert (bad.value.status, bad.value.field) == (400, "kind")
    assert bad.value.code == "validation_error"
    assert (missing.value.status, missing.value.code) == (404, "task_not_found")
    assert (conflict.value.status, conflict.value.code) == (409, "idempotency_conflict")


async def test_a_replayed_submit_with_its_key_returns_the_original_ids(server: Server) -> None:
    with Client(server.url) as client:
        first = await asyncio.to_thread(client.submit_task, "echo", idempotency_key="same")
        again = await asyncio.to_thread(client.submit_task, "echo", idempotency_key="same")

    assert again.task_id == first.task_id


async def test_with_token_auth_the_client_sends_its_token_and_maps_401_and_403() -> None:
    async with serving(dataclasses.replace(SETTINGS, api_auth="tokens")) as server:
        tokens = server.services.api.tokens
        reader = await tokens.create("reader", frozenset({Scope.READ}))
        submitter = await tokens.create("submitter", frozenset({Scope.SUBMIT, Scope.READ}))

        def run() -> tuple[Any, ...]:
            with Client(server.url) as anonymous, pytest.raises(Unauthenticated) as no_token:
                anonymous.submit_task("echo")
            with Client(server.url, token=reader.secret) as c, pytest.raises(Forbidden) as scope:
                c.submit_task("echo")
            with Client(server.url, token=submitter.secret) as client:
                created = client.submit_task("echo")
                return no_token.value, scope.value, client.get_task(created.task_id)

        no_token, scope, task = await asyncio.to_thread(run)

    assert (no_token.status, no_token.code) == (401, "unauthenticated")
    assert (scope.status, scope.code) == (403, "forbidden")
    assert task.kind == "echo"


# -- the asyncio client ------------------------------------------------------------------------


async def test_async_client_submits_waits_and_reads_results(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        job = JobBuilder()
        job.task("only", "echo", payload={"x": 1}, delay="0s", timeout="5s")
        created = await client.submit_job(job)
        await server.complete(created.tasks["only"], {"y": 2})

        finished = await client.wait(created.job_id, 5.0)
        results = await client.results(created.job_id)
        task = await client.get_task(created.tasks["only"])

    assert finished.status == "completed"
    assert results == {"only": {"y": 2}}
    assert task.timeout == "5s"


async def test_async_client_maps_errors_too(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        with pytest.raises(NotFound):
            await client.get_job("00000000-0000-4000-8000-000000000000")


# -- retries, on a mock transport --------------------------------------------------------------


def _created() -> httpx.Response:
    return httpx.Response(
        201,
        json={
            "task_id": "00000000-0000-4000-8000-000000000001",
            "job_id": "00000000-0000-4000-8000-000000000002",
        },
    )


def _unavailable(retry_after: str | None = "2") -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after else {}
    body = {"error": {"code": "backend_unavailable", "message": "down", "field": None}}
    return httpx.Response(503, json=body, headers=headers)


def test_a_503_is_retried_after_retry_after_with_the_same_idempotency_key() -> None:
    answers = [_unavailable("2"), httpx.Response(429, headers={"Retry-After": "1"}), _created()]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[len(seen) - 1]

    slept: list[float] = []
    with Client("http://dtq.test", transport=httpx.MockTransport(handler), sleep=slept.append) as c:
        created = c.submit_task("echo", {"a": 1})

    assert str(created.task_id) == "00000000-0000-4000-8000-000000000001"
    assert slept == [2.0, 1.0]
    keys = {r.headers["Idempotency-Key"] for r in seen}
    assert len(keys) == 1 and next(iter(keys)).startswith("dtq-client-")
    assert json.loads(seen[0].content) == {"kind": "echo", "payload": {"a": 1}}


def test_each_submit_gets_its_own_generated_idempotency_key() -> None:
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        return _created()

    with Client("http://dtq.test", transport=httpx.MockTransport(handler)) as client:
        client.submit_task("echo")
        client.submit_task("echo")

    assert len(set(keys)) == 2


def test_retries_give_up_with_the_last_error() -> None:
    slept: list[float] = []
    transport = httpx.MockTransport(lambda request: _unavailable(None))
    client = Client("http://dtq.test", transport=transport, retries=2, sleep=slept.append)
    with client, pytest.raises(Unavailable) as raised:
        client.get_task("00000000-0000-4000-8000-000000000001")

    assert raised.value.code == "backend_unavailable"
    assert len(slept) == 2
    assert all(0 < s <= 0.5 for s in slept)


def test_an_unreachable_server_is_retried_then_a_transport_error() -> None:
    tries = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal tries
        tries += 1
        raise httpx.ConnectError("refused", request=request)

    with (
        Client(
            "http://dtq.test",
            transport=httpx.MockTransport(handler),
            retries=3,
            sleep=lambda s: None,
        ) as client,
        pytest.raises(TransportError, match="refused"),
    ):
        client.get_job("00000000-0000-4000-8000-000000000001")

    assert tries == 4


async def test_async_retries_follow_the_same_rules() -> None:
    answers = [_unavailable("3"), _created()]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    async with AsyncClient(
        "http://dtq.test", transport=httpx.MockTransport(handler), sleep=sleep
    ) as client:
        created = await client.submit_task("echo")

    assert str(created.job_id) == "00000000-0000-4000-8000-000000000002"
    assert slept == [3.0]


# -- configuration, builder, error mapping ---------------------------------------------------


def test_token_and_url_come_from_the_environment_unless_given() -> None:
    env = {"DTQ_URL": "https://dtq.example:8443/", "DTQ_TOKEN": "secret-1"}
    from_env = ClientConfig.resolve(None, None, 4, env)
    given = ClientConfig.resolve("http://other:80", "secret-2", 0, env)

    assert (from_env.url, from_env.token) == ("https://dtq.example:8443", "secret-1")
    assert from_env.headers()["Authorization"] == "Bearer secret-1"
    assert (given.url, given.token) == ("http://other:80", "secret-2")
    assert "Authorization" not in ClientConfig.resolve(None, None, 1, {}).headers()
    with pytest.raises(ValueError, match="DTQ_URL"):
        ClientConfig.resolve("ftp://x", None, 1, {})


def test_the_token_is_sent_as_a_bearer_header() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization", ""))
        return httpx.Response(200, json={"workers": []})

    with Client(
        "http://dtq.test", token="tok-123", transport=httpx.MockTransport(handler)
    ) as client:
        assert client.workers("2m").workers == []

    assert seen == ["Bearer tok-123"]


def test_the_builder_refuses_what_cannot_be_a_job() -> None:
    job = JobBuilder()
    job.task("a", "echo")
    with pytest.raises(ValueError, match="already used"):
        job.task("a", "echo")
    with pytest.raises(ValueError, match="not in the job"):
        job.task("b", "echo", depends_on=["missing"])
    with pytest.raises(ValueError, match="at least one task"):
        JobBuilder().body()


def test_error_for_falls_back_on_the_status_when_the_body_is_not_ours() -> None:
    proxied = error_for(502, None)
    unknown = error_for(418, {"error": {"code": "teapot", "message": "short and stout"}})

    assert isinstance(proxied, Unavailable) and proxied.code == "http_502"
    assert type(unknown) is ApiError
    assert (unknown.code, unknown.message, unknown.field) == ("teapot", "short and stout", None)


def test_importing_the_client_loads_no_server_or_driver_library() -> None:
    code = (
        "import sys, dtq.client\n"
        "bad = [m for m in ('psycopg', 'psycopg_pool', 'redis', 'litestar', 'uvicorn',"
        " 'structlog', 'prometheus_client', 'dependency_injector') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == ""


# -- control, listing and explain (issue 14 routes) ------------------------------------------


async def test_cancel_retry_list_and_explain(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        job = JobBuilder("ops")
        first = job.task("first", "flaky")
        job.task("second", "echo", depends_on=[first])
        created = await client.submit_job(job)
        await server.fail(created.tasks["first"], "boom")

        failed = [t async for t in client.list_tasks(job_id=created.job_id, status="failed")]
        why = await client.explain(created.tasks["first"])
        retried = await client.retry_task(created.tasks["first"])
        with pytest.raises(NotRetryable):
            await client.retry_task(created.tasks["first"])
        cancelled = await client.cancel_job(created.job_id)
        again = await client.cancel_task(created.tasks["first"])
        jobs = [j.id async for j in client.list_jobs(name="ops")]

    assert {t.name for t in failed} == {"first", "second"}
    assert (why.reason, why.status) == ("terminal", "failed")
    assert (retried.status, retried.reopened) == ("queued", 1)
    assert (cancelled.status, cancelled.cancelled) == ("cancelled", 2)
    assert (again.status, again.cascaded) == ("cancelled", 0)
    assert jobs == [created.job_id]


async def test_a_completed_task_cannot_be_cancelled(server: Server) -> None:
    with Client(server.url) as client:
        created = await asyncio.to_thread(client.submit_task, "echo")
        await server.complete(created.task_id, 1)
        with pytest.raises(NotCancellable) as raised:
            await asyncio.to_thread(client.cancel_task, created.task_id)

    assert (raised.value.status, raised.value.code) == (409, "not_cancellable")


def test_listing_pages_are_followed_with_the_same_filters() -> None:
    seen: list[httpx.URL] = []
    ids = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(3)]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        cursor = request.url.params.get("cursor")
        page = ids[:2] if cursor is None else ids[2:]
        return httpx.Response(
            200,
            json={
                "jobs": [
                    {
                        "id": i,
                        "name": "n",
                        "status": "pending",
                        "metadata": None,
                        "created_at": "2026-12-01T00:00:00Z",
                        "updated_at": "2026-12-01T00:00:00Z",
                    }
                    for i in page
                ],
                "next_cursor": "c1" if cursor is None else None,
            },
        )

    with Client("http://dtq.test", transport=httpx.MockTransport(handler)) as client:
        listed = [str(j.id) for j in client.list_jobs(status=["failed", "cancelled"], page_size=2)]

    assert listed == ids
    assert [u.params.get("status") for u in seen] == ["failed,cancelled", "failed,cancelled"]
    assert [u.params.get("cursor") for u in seen] == [None, "c1"]
    assert seen[0].params.get("limit") == "2"


def test_a_retry_is_not_re_sent_after_a_lost_answer() -> None:
    tries = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal tries
        tries += 1
        raise httpx.ReadTimeout("no answer", request=request)

    client = Client("http://dtq.test", transport=httpx.MockTransport(handler), sleep=lambda s: None)
    with client, pytest.raises(TransportError):
        client.retry_task("00000000-0000-4000-8000-000000000001")

    assert tries == 1


@pytest.mark.parametrize(
    ("payload", "key"),
    [
        ({"s": "\ud800"}, None),
        (None, "caf\u00e9"),
        (None, "a\nb"),
        (None, ""),
        (None, "k" * 256),
        (None, "abc "),
        (None, " abc"),
    ],
)
def test_a_request_that_cannot_be_sent_as_given_is_refused_before_sending(
    payload: object, key: str | None
) -> None:
    # port 9 refuses: an attempt to send would be a TransportError after the retries
    with Client("http://127.0.0.1:9") as client, pytest.raises(InvalidRequest):
        client.submit_task("echo", payload, idempotency_key=key)


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"x": float("nan")}, "payload.x"),
        ({"x": [1, float("inf")]}, "payload.x[1]"),
        ({"x": -float("inf")}, "payload.x"),
        ({"s": {1, 2}}, "payload.s"),
        ({"t": [(1, 2)]}, "payload.t[0]"),
        ({"b": b"ab"}, "payload.b"),
        ({"o": {1: "a"}}, "payload.o"),
        ({"at": datetime(2026, 1, 1, tzinfo=UTC)}, "payload.at"),
        ({"u": uuid.UUID(int=1)}, "payload.u"),
    ],
)
def test_a_payload_msgspec_would_convert_is_refused_naming_its_path(
    payload: object, path: str
) -> None:
    """NaN would arrive as null, a set as an array, bytes as base64, an integer key as a
    string: none of them comes back as given, so none is sent."""
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json={})

    client = Client("http://dtq.test", transport=httpx.MockTransport(handler))
    with client, pytest.raises(InvalidRequest, match=rf"^{re.escape(path)}: "):
        client.submit_task("echo", payload)
    assert sent == []


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"a": {"b": "\ud800"}}, "payload.a.b"),
        ({"a": ["ok", "x\udcff"]}, "payload.a[1]"),
        ({"a": {"k\ud800": 1}}, "payload.a"),
        ("\udfff", "payload"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_its_path(payload: object, path: str) -> None:
    """As NaN is (``payload.x: nan is not a JSON number``); it said only 'a lone UTF-16
    surrogate escape (a surrogate must be half of a pair)'."""
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json={})

    client = Client("http://dtq.test", transport=httpx.MockTransport(handler))
    with client, pytest.raises(InvalidRequest) as caught:
        client.submit_task("echo", payload)

    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    assert "lone UTF-16 surrogate" in message
    assert sent == []


def test_a_duration_that_is_not_a_timedelta_or_a_string_is_refused_by_name() -> None:
    with (
        Client("http://127.0.0.1:9") as client,
        pytest.raises(InvalidRequest, match=r"^delay: a timedelta or a Go duration string"),
    ):
        client.submit_task("echo", delay=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(seconds=1.5), "1500ms"),
        (timedelta(microseconds=1500), "1500us"),
        (timedelta(microseconds=1), "1us"),
        (timedelta(0), "0ms"),
        (timedelta(hours=8784), "31622400000ms"),
    ],
)
def test_a_timedelta_is_sent_exactly(value: timedelta, text: str) -> None:
    assert go_duration(value) == text


@pytest.mark.parametrize(
    ("url", "token", "words"),
    [
        ("http://127.0.0.1:abc", None, "DTQ_URL the port must be a number in 1..65535"),
        ("http://", None, "DTQ_URL names no host"),
        ("http://127.0.0.1:8080", "dtq_secret\nx", "DTQ_TOKEN holds a character not allowed"),
    ],
)
def test_a_url_or_token_the_client_cannot_use_is_refused_when_it_is_made(
    url: str, token: str | None, words: str
) -> None:
    """The same rules as the CLI's (which names its options): checked once, in the client's
    config, never showing the token."""
    with pytest.raises(ValueError, match=re.escape(words)) as refused:
        Client(url, token=token)
    assert "secret" not in str(refused.value)
