"""What each process is given: one frozen bundle per process kind, built by the container.

A process takes only its bundle, so its signature says what it may call:

* :class:`ApiServices` — the HTTP API (``create_app``): submission, reads, health;
* :class:`WorkerServices` — a worker runtime (``Runtime.run``): claim flow, registry, ready lists;
* :class:`ReconcilerServices` — the reconciler loop: the reconcile passes.

:class:`Services` is what :func:`dtq.entrypoints.container.open_services` yields: the three
bundles built on one store and one queue (``dtq dev`` runs all three processes on them), plus that
store and queue for inspection by tests and tools. The bundles name application types only, never
an adapter, so any entrypoint may import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtq.application.artifacts import ArtifactService
from dtq.application.bulk import BulkService
from dtq.application.control import ControlService
from dtq.application.events import EventService
from dtq.application.execution import ExecutionService
from dtq.application.explain import ExplainService
from dtq.application.fleet import FleetService
from dtq.application.health import HealthService
from dtq.application.ports import Queue, QueueInspector, Store
from dtq.application.queries import QueryService
from dtq.application.reconcile import ReconcileService
from dtq.application.registry import WorkerRegistryService
from dtq.application.remote import RemoteWorkerService
from dtq.application.retention import RetentionService
from dtq.application.sessions import SessionService
from dtq.application.submit import SubmitService
from dtq.application.tokens import TokenService
from dtq.application.webhooks import WebhookService
from dtq.entrypoints.config import Settings


@dataclass(frozen=True, slots=True)
class ApiServices:
    """What the orchestrator API calls (spec §7).

    Attributes:
        submit: job and task submission.
        queries: the read side (tasks, jobs, workers).
        health: backend pings for ``/healthz``.
        artifacts: artifact upload and download (``/v1/artifacts``).
        explain: ``GET /v1/tasks/{id}/explain`` (issue 14 item 7).
        fleet: the live workers' advertisements, cached for the submit warnings.
        tokens: API tokens; the auth guard authenticates requests with it (``API_AUTH``).
        control: cancel and manual retry (``/v1/tasks/{id}/cancel|retry``,
            ``/v1/jobs/{id}/cancel``; issue 14 items 1 and 4).
        remote: the HTTP worker protocol (``/v1/worker``, issue 15 item 1).
        bulk: bulk cancel and retry by filter and their background operations
            (``/v1/tasks/cancel|retry``, ``/v1/operations/{id}``; issue 14 item 6).
        events: the transition outbox's stream (``GET /v1/events``, issue 16 item 1).
        inspector: the read-only queue view; the dashboard reads the ready lists' depths with it
            (issue 16 item 3).
        webhooks: webhook subscriptions and their delivery state (``/v1/webhooks``, issue 16
            item 2).
        sessions: the dashboard's login sessions and shared keys, in the store so every
            orchestrator honours them (issue 16 item 3).
    """

    submit: SubmitService
    queries: QueryService
    health: HealthService
    artifacts: ArtifactService
    explain: ExplainService
    fleet: FleetService
    tokens: TokenService
    control: ControlService
    remote: RemoteWorkerService
    bulk: BulkService
    events: EventService
    inspector: QueueInspector
    webhooks: WebhookService
    sessions: SessionService


@dataclass(frozen=True, slots=True)
class WorkerServices:
    """What a worker runtime calls (spec §5 claim flow, §6 worker).

    Attributes:
        execution: claim, report, lease renewal and hand-back.
        registry: the ``workers`` registry heartbeat (spec §4).
        queue: the ready lists the fetch loop pops from.
        artifacts: what handlers reach as ``task.artifacts``.
    """

    execution: ExecutionService
    registry: WorkerRegistryService
    queue: Queue
    artifacts: ArtifactService


@dataclass(frozen=True, slots=True)
class ReconcilerServices:
    """What the reconciler loop calls (spec §2, §5 reconciler).

    Attributes:
        reconcile: the passes (enqueue due, reclaim stale, promote scheduled); it keeps
            keyset cursors, so one instance serves the whole process.
        retention: the retention pass (issue 14 item 8), run after each reconcile pass;
            keyset cursors too.
        webhooks: the webhook deliveries, run by the orchestrator's webhook loop beside the
            reconciler's (issue 16 item 2); the same instance as the API's.
    """

    reconcile: ReconcileService
    retention: RetentionService
    webhooks: WebhookService


@dataclass(frozen=True, slots=True)
class Services:
    """The bundles of one container, sharing one store and one queue.

    Attributes:
        settings: the process configuration.
        store: the system of record (``Store`` port); for tests and tools, not for processes.
        queue: the fast path (``Queue`` port); likewise.
        api: the API's bundle.
        worker: the worker's bundle.
        reconciler: the reconciler's bundle.
    """

    settings: Settings
    store: Store
    queue: Queue
    api: ApiServices
    worker: WorkerServices
    reconciler: ReconcilerServices
