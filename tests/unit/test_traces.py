"""OpenTelemetry traces (issue 16 item 5) on the memory adapters: the HTTP API and an
in-process worker share one store and queue; spans go to the SDK's in-memory exporter.

One job's trace: ``submit`` (child of the request's ``traceparent``), then per task ``claim``
(child of ``submit``, through the context stored with the job), ``handler <kind>`` (child of
``claim``) and ``complete`` (child of ``handler``), all in one trace.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dtq.adapters.clock import SystemClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.entrypoints import tracing
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, WorkerMetrics, new_registry
from dtq.worker import Options, PermanentError, Runtime, Task
from tests.unit.conftest import memory_container
from tests.unit.runtime_harness import POLICY

SETTINGS = Settings(api_auth="none", worker_id="worker-traces", worker_concurrency=2)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
DIAMOND = {  # a -> b, a -> c
    "name": "traced",
    "tasks": [
        {"name": "a", "kind": "step"},
        {"name": "b", "kind": "step", "depends_on": ["a"]},
        {"name": "c", "kind": "step", "depends_on": ["a"]},
    ],
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, into an in-memory exporter; off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


@dataclass
class Stack:
    client: AsyncTestClient[Litestar]
    services: Services

    async def wait_job(self, job_id: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            body: dict[str, Any] = (await self.client.get(f"/v1/jobs/{job_id}")).json()
            if body["status"] in ("completed", "failed"):
                return body
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"job not finished after {timeout} s: {body}")
            await asyncio.sleep(0.01)


@asynccontextmanager
async def stack(runtime: Runtime | None = None) -> AsyncIterator[Stack]:
    """The API and (given ``runtime``) a worker on one set of memory services, real clock."""
    container = memory_container(SystemClock(), POLICY, SETTINGS)
    async with open_services(SETTINGS, backend="memory", container=container) as services:
        registry = new_registry()
        app = create_app(services.api, SETTINGS, OrchestratorMetrics(registry), registry)
        stop = asyncio.Event()
        worker = None
        if runtime is not None:
            config = runtime.configure(SETTINGS)
            metrics = WorkerMetrics(new_registry())
            worker = asyncio.create_task(
                runtime.run(services.worker, config, stop=stop, metrics=metrics)
            )
        promoter = asyncio.create_task(promote(services))  # retries come back this way
        try:
            async with AsyncTestClient(app) as client:
                yield Stack(client, services)
        finally:
            stop.set()
            promoter.cancel()
            if worker is not None:
                await asyncio.wait_for(worker, timeout=10.0)


async def promote(services: Services) -> None:
    """The orchestrator's promoter: due scheduled entries (retries) to the ready lists."""
    while True:
        await services.reconciler.reconcile.promote_scheduled()
        await asyncio.sleep(0.02)


FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)


def step_runtime() -> Runtime:
    runtime = Runtime(FAST)

    @runtime.handler("step")
    async def step(task: Task) -> str:
        return str(task.id)

    return runtime


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def of_task(spans: list[ReadableSpan], task_id: str) -> ReadableSpan:
    [span] = [s for s in spans if s.attributes and s.attributes.get("dtq.task_id") == task_id]
    return span


def child_of(spans: list[ReadableSpan], parent: ReadableSpan) -> ReadableSpan:
    [span] = [s for s in spans if parent_id(s) == hex_ids(parent)[1]]
    return span


async def test_one_job_is_one_trace_from_the_request_to_every_handler_and_completion(
    spans: InMemorySpanExporter,
) -> None:
    async with stack(step_runtime()) as s:
        response = await s.client.post(
            "/v1/jobs", json=DIAMOND, headers={"traceparent": TRACEPARENT}
        )
        assert response.status_code == 201, response.text
        ids = response.json()["tasks"]
        job = await s.wait_job(response.json()["job_id"])
    assert job["status"] == "completed"

    finished = spans.get_finished_spans()
    assert {hex_ids(span)[0] for span in finished} == {TRACE_ID}
    [submit] = by_name(finished, "submit")
    assert parent_id(submit) == CALLER_SPAN
    assert submit.kind is SpanKind.SERVER
    assert submit.attributes is not None
    assert submit.attributes["dtq.job_id"] == job["id"]
    claims, handlers = by_name(finished, "claim"), by_name(finished, "handler step")
    completes = by_name(finished, "complete")
    assert (len(claims), len(handlers), len(completes)) == (3, 3, 3)

    chains = {}
    for name in ("a", "b", "c"):
        claim = of_task(claims, ids[name])
        handler = child_of(handlers, claim)
        complete = child_of(completes, handler)
        assert parent_id(claim) == hex_ids(submit)[1]
        assert complete.attributes is not None
        assert complete.attributes["dtq.outcome"] == "recorded"
        assert claim.attributes is not None
        assert (claim.attributes["dtq.job_id"], claim.attributes["dtq.attempt"]) == (job["id"], 1)
        chains[name] = (claim, handler, complete)
    # b and c were claimed only after a's completion (which promoted them) had begun
    a_complete = chains["a"][2]
    assert a_complete.start_time is not None
    for name in ("b", "c"):
        claim = chains[name][0]
        assert claim.start_time is not None and claim.start_time >= a_complete.start_time
    # every span of a chain begins after the one before it began, and none ends before it starts
    for claim, handler, complete in chains.values():
        assert claim.start_time is not None and handler.start_time is not None
        assert complete.start_time is not None and complete.end_time is not None
        assert claim.start_time <= handler.start_time <= complete.start_time <= complete.end_time


async def test_a_submit_without_traceparent_starts_a_trace_stored_with_the_job(
    spans: InMemorySpanExporter,
) -> None:
    async with stack() as s:
        response = await s.client.post("/v1/tasks", json={"kind": "step"})
        assert response.status_code == 201, response.text
        job_id = UUID(response.json()["job_id"])
        store = s.services.store
        assert isinstance(store, InMemoryStore)
        job = await store.run(lambda tx: tx.jobs.get(job_id))

    [submit] = spans.get_finished_spans()
    assert submit.name == "submit"
    assert submit.parent is None
    trace_id, span_id = hex_ids(submit)
    assert job is not None
    assert job.trace_context is not None
    version, stored_trace, stored_span, flags = job.trace_context.split("-")
    assert (version, stored_trace, stored_span) == ("00", trace_id, span_id)
    assert int(flags, 16) & 0x01  # sampled


@pytest.mark.parametrize("header", ["garbage", "00-zz-yy-01", f"00-{'0' * 32}-{CALLER_SPAN}-01"])
async def test_a_malformed_traceparent_is_not_refused_and_starts_a_new_trace(
    spans: InMemorySpanExporter, header: str
) -> None:
    async with stack() as s:
        response = await s.client.post("/v1/jobs", json=DIAMOND, headers={"traceparent": header})
    assert response.status_code == 201, response.text
    [submit] = spans.get_finished_spans()
    assert submit.parent is None
    assert hex_ids(submit)[0] != TRACE_ID


async def test_a_failing_handler_marks_its_span_and_the_retry_is_a_new_claim_in_the_trace(
    spans: InMemorySpanExporter,
) -> None:
    runtime = Runtime(FAST)
    calls = 0

    @runtime.handler("flaky")
    async def flaky(task: Task) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first try fails")

    @runtime.handler("doomed")
    async def doomed(task: Task) -> None:
        raise PermanentError("never works")

    async with stack(runtime) as s:
        body = {
            "tasks": [
                {"name": "f", "kind": "flaky", "max_attempts": 3},
                {"name": "d", "kind": "doomed"},
            ]
        }
        response = await s.client.post("/v1/jobs", json=body, headers={"traceparent": TRACEPARENT})
        assert response.status_code == 201, response.text
        await s.wait_job(response.json()["job_id"])
        # the job fails as soon as d does; wait for f's retry to finish as well
        task = response.json()["tasks"]["f"]
        for _ in range(500):
            if (await s.client.get(f"/v1/tasks/{task}")).json()["status"] == "completed":
                break
            await asyncio.sleep(0.01)

    finished = spans.get_finished_spans()
    assert {hex_ids(span)[0] for span in finished} == {TRACE_ID}
    flaky_spans = by_name(finished, "handler flaky")
    assert sorted(span.status.status_code.name for span in flaky_spans) == ["ERROR", "UNSET"]
    [failed] = [span for span in flaky_spans if span.status.status_code is StatusCode.ERROR]
    assert [event.name for event in failed.events] == ["exception"]
    f_claims = [
        span
        for span in by_name(finished, "claim")
        if span.attributes and span.attributes["dtq.task_id"] == task
    ]
    attempts = [span.attributes["dtq.attempt"] for span in f_claims if span.attributes]
    assert sorted(int(str(attempt)) for attempt in attempts) == [1, 2]
    [doomed_span] = by_name(finished, "handler doomed")
    assert doomed_span.status.status_code is StatusCode.ERROR
    # only successes have a complete span: f's second attempt
    [complete] = by_name(finished, "complete")
    assert (
        parent_id(complete)
        == hex_ids(next(s for s in flaky_spans if s.status.status_code is StatusCode.UNSET))[1]
    )


async def test_tracing_off_records_nothing_and_stores_no_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # never installed
    assert not tracing.enabled()
    async with stack(step_runtime()) as s:
        response = await s.client.post(
            "/v1/jobs", json=DIAMOND, headers={"traceparent": TRACEPARENT}
        )
        job = await s.wait_job(response.json()["job_id"])
        store = s.services.store
        assert isinstance(store, InMemoryStore)
        stored = await store.run(lambda tx: tx.jobs.get(UUID(job["id"])))
    assert job["status"] == "completed"
    assert stored is not None and stored.trace_context is None
    assert exporter.get_finished_spans() == ()
    assert tracing.clock() is None
    assert tracing.submit_span(TRACEPARENT).__enter__() is None


_PROBE = """
import json, sys
from dtq.entrypoints import tracing
import dtq.entrypoints.api.app, dtq.entrypoints.worker.session, dtq.entrypoints.cli.entry
for env in ENVS:
    on = tracing.setup(env, service_name="probe")
    loaded = [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]
    print(json.dumps({"on": on, "enabled": tracing.enabled(), "otel_modules": len(loaded)}))
    tracing.uninstall()
"""


def probe(*envs: dict[str, str]) -> list[dict[str, Any]]:
    """Import the API, the worker and the CLI in a fresh interpreter, then call setup(env) for
    each env in turn; what each call left."""
    code = _PROBE.replace("ENVS", repr(list(envs)))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(envs) :]]


def test_off_imports_no_opentelemetry_module_and_an_otlp_endpoint_turns_tracing_on() -> None:
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    # loopback, and no span is ever ended in the probe, so nothing is sent
    wanted = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}
    off, still_off, on = probe({}, disabled, wanted)
    assert off == {"on": False, "enabled": False, "otel_modules": 0}
    assert still_off == {"on": False, "enabled": False, "otel_modules": 0}
    assert (on["on"], on["enabled"]) == (True, True)
    assert on["otel_modules"] > 0


def test_wanted_reads_the_standard_variables() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "TRUE"}
    )


_EXPORT = """
from dtq.entrypoints import tracing
assert tracing.setup({"OTEL_EXPORTER_OTLP_ENDPOINT": @ENDPOINT@}, service_name="probe")
with tracing.submit_span(@TRACEPARENT@) as context:
    assert context is not None
tracing.uninstall()  # flushes the batch span processor
"""


def test_spans_are_exported_over_otlp_http_to_the_endpoint() -> None:
    received: list[tuple[str, str, bytes]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        code = _EXPORT.replace("@ENDPOINT@", repr(endpoint)).replace(
            "@TRACEPARENT@", repr(TRACEPARENT)
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True)
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
    [(path, content_type, body)] = received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    assert bytes.fromhex(TRACE_ID) in body  # the caller's trace id, in the exported span
    assert b"submit" in body


@pytest.mark.parametrize(
    "endpoint", ["garbage", "127.0.0.1:4318", "ftp://collector:4318", "http://"]
)
def test_a_malformed_endpoint_is_one_warning_at_start_and_tracing_stays_off(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not an ERROR with a traceback on every export batch ('Invalid URL garbage/v1/traces')."""
    with caplog.at_level(logging.WARNING, logger="dtq.tracing"):
        on = tracing.setup({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, service_name="probe")

    assert (on, tracing.enabled()) == (False, False)
    [record] = caplog.records
    assert record.getMessage() == (
        f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint!r} is not an http:// or https:// URL with a"
        " host: tracing stays off"
    )
