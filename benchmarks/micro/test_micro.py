"""pytest-benchmark micro-benchmarks of dtq's pure parts: no database, no Redis, no network.

Run with ``make bench-micro`` (``pytest benchmarks/micro``). They live outside ``tests/`` (the
``testpaths`` of the normal run), so ``make test`` never collects them, and they assert only
correctness, never time.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from psycopg.adapt import PyFormat, Transformer

from dtq.adapters.clock import SystemClock
from dtq.adapters.cockroach.arrays import Int8Array, TextArray, TimestamptzArray, UuidArray
from dtq.adapters.cockroach.txconn import fast_literal
from dtq.application.commands import TaskSpec
from dtq.application.fleet import Fleet, FleetService, SubmitWarning, WarningCode
from dtq.domain.dag import TaskNode, validate_dag
from dtq.domain.entities import Task
from dtq.domain.status import TaskStatus
from dtq.entrypoints.api.middleware import HttpMetricsMiddleware
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry

pytestmark = pytest.mark.benchmark

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _task() -> Task:
    return Task(
        id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        name="t",
        kind="noop",
        payload={"n": 1},
        status=TaskStatus.QUEUED,
        scheduled_at=T0,
        created_at=T0,
        updated_at=T0,
    )


def test_claim_then_succeed(benchmark: Any) -> None:
    """queued -> running -> completed, the path of every successful task."""
    run_id = uuid.uuid4()

    def cycle() -> Task:
        task = _task()
        run = task.claim(run_id=run_id, worker_id="w", at=T0)
        task.succeed(run, at=T0)
        return task

    task = benchmark(cycle)
    assert task.status is TaskStatus.COMPLETED


def test_claim_then_fail_with_retry(benchmark: Any) -> None:
    """queued -> running -> queued (retry after backoff)."""
    run_id = uuid.uuid4()
    backoff = timedelta(seconds=1)

    def cycle() -> Task:
        task = _task()
        run = task.claim(run_id=run_id, worker_id="w", at=T0)
        task.fail(run, error="boom", permanent=False, backoff=backoff, at=T0)
        return task

    task = benchmark(cycle)
    assert task.status is TaskStatus.QUEUED
    assert task.scheduled_at == T0 + backoff


def _layered(total: int, layers: int) -> list[TaskNode]:
    """The bench DAG: per layer a hub, then tasks fanning out of it; hubs fan in."""
    width = total // layers - 1
    nodes: list[TaskNode] = []
    previous: tuple[str, ...] = ()
    for layer in range(layers):
        hub = f"h{layer}"
        nodes.append(TaskNode(hub, previous))
        wide = tuple(f"w{layer}_{i}" for i in range(width))
        nodes.extend(TaskNode(name, (hub,)) for name in wide)
        previous = wide
    return nodes


def test_validate_dag_10000_layered(benchmark: Any) -> None:
    """validate_dag on a 10,000-node, 10-layer fan-out/fan-in graph (~20,000 edges)."""
    nodes = _layered(10_000, 10)
    order = benchmark(validate_dag, nodes)
    assert len(order) == 10_000
    assert order.index("h1") > order.index("w0_998")


def test_validate_dag_10000_independent(benchmark: Any) -> None:
    """validate_dag on 10,000 tasks with no edges (the flat job of the drain benchmark)."""
    nodes = [TaskNode(f"t{i}", ()) for i in range(10_000)]
    assert len(benchmark(validate_dag, nodes)) == 10_000


PAYLOAD: dict[str, Any] = {
    "account": "acme-42",
    "report": {"kind": "monthly", "month": "2026-10", "currency": "EUR"},
    "recipients": ["ops@example.com", "finance@example.com"],
    "options": {"pdf": True, "pages": 12, "threshold": 0.75, "tags": ["a", "b", "c"]},
    "items": [{"sku": f"SKU-{i}", "qty": i, "price": 9.99 + i} for i in range(20)],
}
ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder()


def test_json_encode_payload(benchmark: Any) -> None:
    """msgspec JSON encoding of a typical ~1 KB task payload."""
    data = benchmark(ENCODER.encode, PAYLOAD)
    assert 500 < len(data) < 4096


def test_json_decode_payload(benchmark: Any) -> None:
    """msgspec JSON decoding of the same payload."""
    data = ENCODER.encode(PAYLOAD)
    assert benchmark(DECODER.decode, data) == PAYLOAD


def test_json_round_trip_10000_task_job(benchmark: Any) -> None:
    """Encode and decode a 10,000-task POST /v1/jobs body, as the API receives it."""
    body = {"tasks": [{"name": f"t{i}", "kind": "noop"} for i in range(10_000)]}

    def round_trip() -> Any:
        return DECODER.decode(ENCODER.encode(body))

    assert len(benchmark(round_trip)["tasks"]) == 10_000


def test_literals_of_a_lone_claims_task_update(benchmark: Any) -> None:
    """The ``EXECUTE`` argument text of a lone claim's task write (txconn.fast_literal per
    value): the id, the version and the changed columns, three of them timestamps."""
    at = datetime(2026, 12, 2, 16, 40, 1, 123456, tzinfo=UTC)
    params = (uuid.uuid4(), 0, "running", at, at, "default", 3, 1, 0, at, None, None, uuid.uuid4())

    def render() -> str:
        return ", ".join(str(fast_literal(p)) for p in params)

    text = benchmark(render)
    assert text.count("::timestamptz") == 3
    assert "'2026-12-02 16:40:01.123456+00:00'" in text


def test_literals_of_a_group_of_nine_single_submits(benchmark: Any) -> None:
    """The ``EXECUTE`` argument text of the jobs insert of a group of nine ``POST /v1/tasks``
    (txconn.fast_literal per typed array: one array per column, nine rows)."""
    at = datetime(2026, 12, 3, 8, 0, 1, 123456, tzinfo=UTC)
    rows = 9
    params = (
        UuidArray([uuid.uuid4() for _ in range(rows)]),
        TextArray(["count"] * rows),
        TextArray(["pending"] * rows),
        TextArray(["{}"] * rows),
        TextArray([None] * rows),
        TextArray([None] * rows),
        Int8Array([0] * rows),
        TimestamptzArray([at] * rows),
        TimestamptzArray([at] * rows),
        TextArray([None] * rows),
    )

    def render() -> str:
        return ", ".join(str(fast_literal(p)) for p in params)

    text = benchmark(render)
    assert text.count("::timestamptz[]") == 2
    assert "None" not in text
    assert '\'{"{}","{}",' in text


def test_binary_uuid_array_of_a_claim_batch(benchmark: Any) -> None:
    """The binary ``uuid[]`` parameter of a 256-task claim or completion batch
    (``arrays._UuidArrayDumper``): 20-byte header, then length and 16 bytes per id."""
    ids = UuidArray([uuid.uuid4() for _ in range(256)])
    dumper = Transformer().get_dumper(ids, PyFormat.BINARY)

    data = bytes(benchmark(lambda: dumper.dump(ids)))
    assert len(data) == 20 + 256 * 20
    assert data[20 + 4 : 20 + 20] == ids[0].bytes
    assert data[-16:] == ids[-1].bytes


def test_literal_of_payloads_full_of_quotes(benchmark: Any) -> None:
    """The text-array literal of 32 JSON payloads of 12,000 quote characters each (a group of
    ``POST /v1/tasks`` whose payloads are mostly ``"``; every element escapes each quote)."""
    payloads = TextArray([msgspec.json.encode('"' * 12_000).decode()] * 32)

    text = benchmark(lambda: str(fast_literal(payloads)))
    # each quote: JSON's \", the array element's \\\", E'...' doubling the backslashes
    assert text.startswith(" E'{")
    assert text.count("\\" * 6 + '"') == 32 * 12_000


def test_submit_warnings_of_100_single_tasks(benchmark: Any) -> None:
    """``FleetService.submit_warnings`` of 100 ``POST /v1/tasks`` whose kind no live worker
    serves (what every request of ``make bench``'s submit scenario gets), the fleet cached;
    in one event loop turn, so the figure is the calls' (divide by 100)."""
    fleet = FleetService(store=None, clock=SystemClock(), alive_within=30.0)  # type: ignore[arg-type]
    fleet._cached = (SystemClock().now(), Fleet([], 30.0))
    specs = [TaskSpec(name="noop", kind="noop")]
    loop = asyncio.new_event_loop()

    async def hundred() -> list[SubmitWarning]:
        for _ in range(99):
            await fleet.submit_warnings(specs)
        return await fleet.submit_warnings(specs)

    def warn() -> list[SubmitWarning]:
        return loop.run_until_complete(hundred())

    try:
        warnings = benchmark(warn)
    finally:
        loop.close()
    assert [w.code for w in warnings] == [
        WarningCode.NO_WORKER_FOR_PRIORITY,
        WarningCode.NO_WORKER_FOR_KIND,
    ]
    assert all(w.task == "noop" for w in warnings)


def test_http_metrics_of_100_requests(benchmark: Any) -> None:
    """``HttpMetricsMiddleware`` around an app that answers at once: 100 requests' counts and
    durations (the labelled children's lookup included), in one event loop turn (divide by
    100)."""
    metrics = OrchestratorMetrics(new_registry())

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})

    async def send(message: Any) -> None:
        return None

    middleware = HttpMetricsMiddleware(app, metrics)
    scope = {"type": "http", "method": "POST", "path_template": "/v1/tasks"}
    loop = asyncio.new_event_loop()

    async def hundred() -> None:
        for _ in range(100):
            await middleware(scope, None, send)  # type: ignore[arg-type]

    def request() -> None:
        loop.run_until_complete(hundred())

    try:
        benchmark(request)
    finally:
        loop.close()
    count = metrics.http_requests.labels("POST", "/v1/tasks", "201")._value.get()
    assert count >= 100
    assert count % 100 == 0
