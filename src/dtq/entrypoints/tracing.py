"""OpenTelemetry traces (issue 16 item 5): the one module of dtq that imports OpenTelemetry.

Spans: ``submit`` (the HTTP request of ``POST /v1/jobs`` and ``POST /v1/tasks``), then for each
task ``claim`` (worker), ``handler <kind>`` (around the handler call) and ``complete`` (the
success's commit), each a child of the one before; a task's ``claim`` is a child of its job's
``submit``. The link between them is the opaque string ``Job.trace_context``: the W3C
``traceparent`` of the ``submit`` span, stored with the job and handed to the worker with each
``Claim``. The domain and application layers never see more than that string.

Tracing is on in a process exactly when :func:`setup` found ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, ``OTEL_SDK_DISABLED`` not true and the ``otel``
extra installed; the OpenTelemetry SDK reads its other standard variables itself
(``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, headers, timeouts). Tests call
:func:`install` with their own provider (the in-memory exporter) and :func:`uninstall`.

Off is the default and costs nothing that grows with the work: OpenTelemetry is not imported,
every hook returns at its first line (``_state.tracer is None``), no trace context is stored, and
the worker's hot path creates no object for it (measured in ARCHITECTURE.md, "Traces").

Hooks for a worker that is not the native runtime (the HTTP worker protocol's ``/v1/worker``
routes): a claim response carries ``Claim.trace_context`` as ``traceparent``; a remote worker
continues the trace from it, or the route calls :func:`claim_span` and :func:`complete_span`
itself around the claim and the completion it serves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from uuid import UUID

from dtq.domain.urls import http_url_problem

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

#: Variables that turn tracing on (either one; the SDK reads both).
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
#: The header (and the stored format) of the W3C trace context.
TRACEPARENT = "traceparent"
INSTRUMENTATION = "dtq"

_log = logging.getLogger("dtq.tracing")


class _State:
    """This process's tracing state; ``tracer`` None means off (the one check of every hook)."""

    __slots__ = ("provider", "tracer")

    def __init__(self) -> None:
        self.tracer: Tracer | None = None
        self.provider: TracerProvider | None = None  # the one setup() made (shut down at exit)


_state = _State()
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


class TraceHandle:
    """The parent of a task's next span in this process (an OpenTelemetry ``Context``),
    opaque to callers: what :func:`claim_span` and :func:`handler_span` give back."""

    __slots__ = ("context",)

    def __init__(self, context: Any) -> None:
        self.context = context


def enabled() -> bool:
    """True while spans are being recorded by this process."""
    return _state.tracer is not None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for traces: an OTLP endpoint is set and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARS)


def setup(environ: Mapping[str, str], *, service_name: str) -> bool:
    """Turn tracing on for this process when ``environ`` asks for it (:func:`wanted`): an
    OTLP/HTTP exporter behind a batch span processor, also made the global tracer provider
    (so a handler's own OpenTelemetry spans nest under its ``handler`` span) when none is set.

    Args:
        environ: the process environment (with ``.env`` under it); its ``OTEL_*`` variables
            that ``os.environ`` lacks are copied there, where the SDK reads them.
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise.

    Returns:
        True when tracing is on. Asked for but the ``otel`` extra is missing, or an endpoint
        that is not an http(s) URL with a host: a warning and False (a process never fails to
        start over tracing).
    """
    if not wanted(environ):
        return False
    for name in ENDPOINT_VARS:
        endpoint = environ.get(name, "").strip()
        if endpoint and http_url_problem(endpoint) is not None:
            _log.warning(
                "%s=%r is not an http:// or https:// URL with a host: tracing stays off",
                name,
                endpoint[:200],
            )
            return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        _log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed "
            "(pip install 'dtq[otel]'): tracing stays off (%s)",
            exc,
        )
        return False
    # The SDK reads its variables from os.environ; ``environ`` may hold more (a .env file).
    for name, value in environ.items():
        if name.startswith("OTEL_"):
            os.environ.setdefault(name, value)
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    with contextlib.suppress(Exception):  # already set by the application: keep theirs
        if not _global_provider_set(trace):
            trace.set_tracer_provider(provider)
    _state.provider = provider
    install(provider)
    return True


def _global_provider_set(trace: Any) -> bool:
    from opentelemetry.trace import ProxyTracerProvider

    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)


def install(provider: TracerProvider) -> None:
    """Record spans through ``provider`` from now on (tests: an in-memory exporter)."""
    _state.tracer = provider.get_tracer(INSTRUMENTATION)


def uninstall() -> None:
    """Tracing off again (tests); the provider of :func:`setup` is flushed and shut down."""
    _state.tracer = None
    provider, _state.provider = _state.provider, None
    if provider is not None:
        provider.shutdown()


def clock() -> int | None:
    """The start time of a span whose parent is known only later (ns since the epoch), or
    None when tracing is off: callers pass it on to :func:`claim_span`/:func:`complete_span`
    and skip those calls when it is None."""
    if _state.tracer is None:
        return None
    return time.time_ns()


# --- submit (HTTP) ----------------------------------------------------------------------------


def submit_span(traceparent: str | None) -> AbstractContextManager[str | None]:
    """Around a submit request: a ``submit`` span continuing the request's W3C trace context
    (``traceparent`` header; absent or malformed: a new trace), as a context manager yielding
    the ``traceparent`` to store with the job (``SubmitJob.trace_context``).

    Off: a shared no-op context manager yielding None (nothing is stored).
    """
    tracer = _state.tracer
    if tracer is None:
        return _NO_SPAN
    return _submit(tracer, traceparent)


@contextlib.contextmanager
def _submit(tracer: Tracer, traceparent: str | None) -> Iterator[str | None]:
    from opentelemetry import trace

    parent = _extract(traceparent) if traceparent else None
    with tracer.start_as_current_span("submit", context=parent, kind=trace.SpanKind.SERVER) as span:
        yield _inject(trace.set_span_in_context(span))


def submitted(job_id: UUID, tasks: int, *, created: bool) -> None:
    """Name the job on the current ``submit`` span (no-op when off)."""
    if _state.tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    span.set_attribute("dtq.job_id", str(job_id))
    span.set_attribute("dtq.tasks", tasks)
    span.set_attribute("dtq.created", created)


# --- worker -----------------------------------------------------------------------------------


def claim_span(
    trace_context: str | None,
    *,
    task_id: UUID,
    job_id: UUID,
    run_id: UUID,
    kind: str,
    attempt: int,
    start_ns: int,
) -> TraceHandle | None:
    """Record the ``claim`` span of one claimed task, from ``start_ns`` (the claim call began,
    :func:`clock`) to now, as a child of the job's stored ``trace_context`` (None: a new
    trace, e.g. a job submitted while the API's tracing was off).

    Returns:
        The parent of the task's ``handler`` span, or None when off.
    """
    tracer = _state.tracer
    if tracer is None:
        return None
    from opentelemetry import trace

    parent = _extract(trace_context) if trace_context else None
    span = tracer.start_span(
        "claim",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        start_time=start_ns,
        attributes={
            "dtq.task_id": str(task_id),
            "dtq.job_id": str(job_id),
            "dtq.run_id": str(run_id),
            "dtq.kind": kind,
            "dtq.attempt": attempt,
        },
    )
    span.end()
    return TraceHandle(trace.set_span_in_context(span))


def handler_span(parent: TraceHandle | None, kind: str) -> AbstractContextManager[Any]:
    """Around one handler call: a ``handler <kind>`` span, child of the ``claim`` span, made
    the current span (a handler's own spans nest under it); an exception marks it ERROR.
    Yields the parent of the ``complete`` span (a :class:`TraceHandle`).

    ``parent`` None (tracing off): a shared no-op context manager yielding None.
    """
    tracer = _state.tracer
    if tracer is None or parent is None:
        return _NO_SPAN
    return _handler(tracer, parent, kind)


@contextlib.contextmanager
def _handler(tracer: Tracer, parent: TraceHandle, kind: str) -> Iterator[TraceHandle]:
    from opentelemetry import trace

    with tracer.start_as_current_span(f"handler {kind}", context=parent.context) as span:
        yield TraceHandle(trace.set_span_in_context(span))


def complete_span(parent: TraceHandle | None, *, start_ns: int, outcome: str | None) -> None:
    """Record the ``complete`` span of one success, from ``start_ns`` (its batch's commit
    began) to now, child of its ``handler`` span; ``outcome`` is the report's outcome
    (``recorded``, ``duplicate``, ``stale``; None: not recorded, the span is ERROR)."""
    tracer = _state.tracer
    if tracer is None or parent is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span = tracer.start_span("complete", context=parent.context, start_time=start_ns)
    if outcome is None:
        span.set_status(Status(StatusCode.ERROR, "outcome not recorded"))
    else:
        span.set_attribute("dtq.outcome", outcome)
    span.end()


# --- the W3C trace context as a string ---------------------------------------------------------


def _extract(traceparent: str) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})


def _inject(context: Any) -> str | None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return carrier.get(TRACEPARENT)
