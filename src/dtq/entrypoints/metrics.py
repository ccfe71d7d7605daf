"""Prometheus metrics of the orchestrator and the worker (spec §9 "Metrics and logging").

Every process builds its own :class:`~prometheus_client.CollectorRegistry` with
:func:`new_registry` and hands it to the metric holders below; nothing registers into
prometheus_client's global default registry, so two apps (or two tests) in one process never
collide with ``Duplicated timeseries`` errors.

Metric names follow the seed README: ``orchestrator_http_*``,
``orchestrator_tasks_submitted_total``, ``orchestrator_jobs_submitted_total``,
``orchestrator_reconcile_*`` and ``worker_*``.
prometheus_client appends ``_total`` to counters itself, so counter names below omit it.
No ``*_created`` series are exposed (:func:`new_registry` turns them off, issue 16 item 6): they
double the series count and no dashboard or alert of ours reads them.

Label cardinality: ``route`` is always a route *template* (``/v1/tasks/{id}``), never a raw path;
``kind`` is a handler kind the worker has registered (bounded by the code deployed), ``reason``
a small fixed vocabulary chosen by the caller.
"""

from __future__ import annotations

from typing import get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from dtq.application.breaker import Missed

#: Buckets (seconds) for HTTP requests: sub-millisecond memory adapters up to slow backends.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Buckets (seconds) for a reconcile pass: fast when idle, seconds under a backlog.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Buckets (seconds) for handler runs: task handlers range from milliseconds to many minutes.
HANDLER_BUCKETS = (
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


def new_registry() -> CollectorRegistry:
    """Create an isolated registry with the process, platform and GC collectors.

    These are the Python counterparts of the Go process/runtime collectors the spec's
    ``/metrics`` exposes (§7): ``process_*``, ``python_info`` and ``python_gc_*``.

    Also turns off prometheus_client's ``*_created`` series (a process-wide switch of the
    library, so every registry of the process, the API's and the worker's, exposes none).

    Returns:
        A new registry; nothing is added to prometheus_client's global ``REGISTRY``.
    """
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class OrchestratorMetrics:
    """Metrics of the orchestrator process: HTTP API, submission and reconciler (spec §9).

    Args:
        registry: where the metrics are registered; use one registry per process (or test).

    Attributes:
        http_requests: ``orchestrator_http_requests_total{method,route,status}``; ``route`` is
            the route template, ``status`` the HTTP status code as a string.
        http_duration: ``orchestrator_http_request_duration_seconds{method,route}``, seconds
            from the first byte received to the last byte sent.
        tasks_submitted: ``orchestrator_tasks_submitted_total``: tasks created (idempotent
            replays create nothing and do not count).
        jobs_submitted: ``orchestrator_jobs_submitted_total``: jobs created.
        submit_pushes_missed: ``orchestrator_submit_pushes_missed_total{reason}``: committed
            jobs whose push to Redis after the commit did not happen, ``reason`` ``failed``
            (Redis raised or timed out) or ``skipped`` (the push breaker was open after a
            failure); the reconciler pushes their due tasks.
        reconcile_runs: ``orchestrator_reconcile_runs_total``: reconcile passes started.
        reconcile_enqueued: ``orchestrator_reconcile_enqueued_total``: due ``queued`` tasks
            pushed to Redis by the reconciler.
        reconcile_reclaimed: ``orchestrator_reconcile_reclaimed_total``: stale ``running``
            tasks reclaimed.
        reconcile_promoted: ``orchestrator_reconcile_promoted_total``: scheduled (delayed)
            tasks moved to their ready list.
        reconcile_errors: ``orchestrator_reconcile_errors_total``: passes that raised.
        reconcile_duration: ``orchestrator_reconcile_duration_seconds``: wall time of a pass.
        store_retries: ``orchestrator_store_retries_total{reason}``: transaction functions
            re-run by the store (``reason`` e.g. ``serialization``, ``concurrent_update``).
        queued_unpolled: ``orchestrator_tasks_queued_unpolled{priority}``: due ``queued``
            tasks of a priority that no live worker polls, as last counted by the reconciler;
            a priority's series exists only while it has some (bounded label set).
        reclaims_held: ``orchestrator_reclaims_held``: runs without a lease the last reconcile
            pass did not reclaim because their live worker is registered with another Redis key
            prefix (two deployments on one database, or a mistyped ``REDIS_KEY_PREFIX``).
        pruned: ``orchestrator_pruned_total{what}``: rows deleted by the retention pass,
            ``what`` one of ``jobs``, ``tasks``, ``runs``, ``tombstones`` (expired
            idempotency tombstones) (issue 14 item 8), ``sessions`` (expired dashboard
            sessions, issue 16 item 3).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.pruned = Counter(
            "orchestrator_pruned",
            "Rows deleted by the retention pass, by what"
            " (jobs, tasks, runs, tombstones, sessions).",
            ("what",),
            registry=registry,
        )
        self.http_requests = Counter(
            "orchestrator_http_requests",
            "HTTP requests served, by method, route template and status code.",
            ("method", "route", "status"),
            registry=registry,
        )
        self.http_duration = Histogram(
            "orchestrator_http_request_duration_seconds",
            "HTTP request latency in seconds, by method and route template.",
            ("method", "route"),
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.tasks_submitted = Counter(
            "orchestrator_tasks_submitted",
            "Tasks created through the API (idempotent replays excluded).",
            registry=registry,
        )
        self.jobs_submitted = Counter(
            "orchestrator_jobs_submitted",
            "Jobs created through the API (idempotent replays excluded).",
            registry=registry,
        )
        self.submit_pushes_missed = Counter(
            "orchestrator_submit_pushes_missed",
            "Committed jobs whose push to Redis after the commit did not happen, by reason"
            " (failed, skipped while the push breaker was open); the reconciler pushes them.",
            ("reason",),
            registry=registry,
        )
        for reason in get_args(Missed):  # both series at 0 from the start, for increase()
            self.submit_pushes_missed.labels(reason=reason)
        self.reconcile_runs = Counter(
            "orchestrator_reconcile_runs", "Reconcile passes started.", registry=registry
        )
        self.reconcile_enqueued = Counter(
            "orchestrator_reconcile_enqueued",
            "Due queued tasks pushed to the ready queue by the reconciler.",
            registry=registry,
        )
        self.reconcile_reclaimed = Counter(
            "orchestrator_reconcile_reclaimed",
            "Stale running tasks without a lease reclaimed by the reconciler.",
            registry=registry,
        )
        self.reconcile_promoted = Counter(
            "orchestrator_reconcile_promoted",
            "Scheduled tasks moved to their ready list once due.",
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "orchestrator_reconcile_errors", "Reconcile passes that failed.", registry=registry
        )
        self.reconcile_duration = Histogram(
            "orchestrator_reconcile_duration_seconds",
            "Wall time of one reconcile pass in seconds.",
            buckets=RECONCILE_BUCKETS,
            registry=registry,
        )
        self.queued_unpolled = Gauge(
            "orchestrator_tasks_queued_unpolled",
            "Due queued tasks of a priority that no live worker polls, by priority.",
            ("priority",),
            registry=registry,
        )
        self.reclaims_held = Gauge(
            "orchestrator_reclaims_held",
            "Runs without a lease the last reconcile pass held back: their live worker is"
            " registered with another Redis key prefix.",
            registry=registry,
        )
        self.store_retries = Counter(
            "orchestrator_store_retries",
            "Store transaction functions re-run after a retryable conflict, by reason.",
            ("reason",),
            registry=registry,
        )


class WorkerMetrics:
    """Metrics of a worker process (spec §9: claimed, succeeded, failed, retries, handler
    duration, lease extensions, shutdown reason).

    Args:
        registry: where the metrics are registered; use one registry per process (or test).

    Attributes:
        tasks_claimed: ``worker_tasks_claimed_total{kind}``: claims that stuck.
        tasks_succeeded: ``worker_tasks_succeeded_total{kind}``: handler returned.
        tasks_failed: ``worker_tasks_failed_total{kind}``: handler raised (retried or not).
        tasks_retried: ``worker_tasks_retried_total{kind}``: failures that scheduled a retry.
        claim_refusals: ``worker_claim_refusals_total``: popped ids the store refused to hand
            out (already claimed, not due, or gone); the kind is unknown at that point.
        lease_extensions: ``worker_lease_extensions_total{kind}``: successful heartbeats.
        lease_losses: ``worker_lease_losses_total{kind}``: heartbeats that found the lease
            taken over; the handler is cancelled.
        handler_duration: ``worker_handler_duration_seconds{kind}``: handler wall time.
        shutdowns: ``worker_shutdowns_total{reason}``: e.g. ``signal``, ``error``.
        unknown_kind: ``worker_unknown_kind_total``: tasks failed permanently because no
            handler is registered for their kind. Unlabelled on purpose: the kind comes from
            submitters, so as a label it would be unbounded; the worker logs it instead.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        kind = ("kind",)
        self.tasks_claimed = Counter(
            "worker_tasks_claimed", "Tasks claimed by this worker.", kind, registry=registry
        )
        self.tasks_succeeded = Counter(
            "worker_tasks_succeeded", "Tasks whose handler succeeded.", kind, registry=registry
        )
        self.tasks_failed = Counter(
            "worker_tasks_failed", "Tasks whose handler failed.", kind, registry=registry
        )
        self.tasks_retried = Counter(
            "worker_tasks_retried",
            "Failed tasks scheduled for another attempt.",
            kind,
            registry=registry,
        )
        self.claim_refusals = Counter(
            "worker_claim_refusals",
            "Popped task ids whose claim was refused by the store.",
            registry=registry,
        )
        self.lease_extensions = Counter(
            "worker_lease_extensions", "Lease heartbeats that succeeded.", kind, registry=registry
        )
        self.lease_losses = Counter(
            "worker_lease_losses",
            "Leases found lost or taken over while the handler ran.",
            kind,
            registry=registry,
        )
        self.handler_duration = Histogram(
            "worker_handler_duration_seconds",
            "Handler wall time in seconds, by kind.",
            kind,
            buckets=HANDLER_BUCKETS,
            registry=registry,
        )
        self.shutdowns = Counter(
            "worker_shutdowns", "Worker shutdowns, by reason.", ("reason",), registry=registry
        )
        self.unknown_kind = Counter(
            "worker_unknown_kind",
            "Tasks failed permanently because their kind has no registered handler.",
            registry=registry,
        )
