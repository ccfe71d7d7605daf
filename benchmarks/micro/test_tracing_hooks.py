"""What the tracing hooks (issue 16 item 5) cost one task with tracing off, and on.

Off is the default: per claim batch the fetch loop calls ``tracing.clock()``, per task the
session enters ``tracing.handler_span(None, kind)``, per completion batch the completion loop
calls ``tracing.clock()``; a submit enters ``tracing.submit_span``. On: the spans of one task
(claim, handler, complete) on an SDK provider with no exporter (recording, not exporting).
Run with ``pytest benchmarks/micro/test_tracing_hooks.py``; nothing here asserts a time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from dtq.entrypoints import tracing

pytestmark = pytest.mark.benchmark

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def one_task_off() -> None:
    """The hooks one task passes through on the worker while tracing is off."""
    started = tracing.clock()  # fetch: once per claim batch
    trace = None
    with tracing.handler_span(trace, "noop") as trace:
        pass
    if tracing.clock() is not None or started is not None:  # completions: once per batch
        raise AssertionError("tracing is on")


def test_worker_hooks_per_task_off(benchmark: Any) -> None:
    assert not tracing.enabled()
    benchmark(one_task_off)


def test_submit_hook_off(benchmark: Any) -> None:
    def submit() -> None:
        with tracing.submit_span(TRACEPARENT) as context:
            assert context is None

    benchmark(submit)


@pytest.fixture
def tracing_on() -> Iterator[None]:
    provider = TracerProvider()  # no span processor: spans are recorded, never exported
    tracing.install(provider)
    try:
        yield
    finally:
        tracing.uninstall()
        provider.shutdown()


def test_worker_spans_per_task_on(benchmark: Any, tracing_on: None) -> None:
    ids = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def one_task() -> None:
        started = tracing.clock()
        assert started is not None
        parent = tracing.claim_span(
            TRACEPARENT,
            task_id=ids[0],
            job_id=ids[1],
            run_id=ids[2],
            kind="noop",
            attempt=1,
            start_ns=started,
        )
        with tracing.handler_span(parent, "noop") as handle:
            pass
        tracing.complete_span(handle, start_ns=started, outcome="recorded")

    benchmark(one_task)
