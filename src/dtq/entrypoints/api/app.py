"""The Litestar application factory of the orchestrator API (spec §7, DESIGN §5).

Nothing is built at import time: :func:`create_app` assembles the controllers, the dependency
providers, the error table, the body-size limit, the OpenAPI document and the HTTP metrics for
the services it is given, so every test (or process) gets its own app.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from litestar import Litestar
from litestar.di import Provide
from litestar.middleware._internal.exceptions import ExceptionHandlerMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components
from prometheus_client import CollectorRegistry

from dtq.application.artifacts import ArtifactService
from dtq.application.bulk import BulkService
from dtq.application.control import ControlService
from dtq.application.events import EventService
from dtq.application.explain import ExplainService
from dtq.application.health import HealthService
from dtq.application.queries import QueryService
from dtq.application.remote import RemoteWorkerService
from dtq.application.webhooks import WebhookService
from dtq.entrypoints.api.artifacts import ArtifactController
from dtq.entrypoints.api.auth import auth_guard, document_security, security_components
from dtq.entrypoints.api.bulk import BulkController, OperationController
from dtq.entrypoints.api.errors import EXCEPTION_HANDLERS
from dtq.entrypoints.api.events import EventController
from dtq.entrypoints.api.fast_submit import SubmitFastPath
from dtq.entrypoints.api.health import HealthController, MetricsController
from dtq.entrypoints.api.jobs import JobController
from dtq.entrypoints.api.middleware import (
    BODY_TIMEOUT,
    CountingSubmit,
    Submission,
    install_middleware,
)
from dtq.entrypoints.api.openapi import StrictStructSchemaPlugin
from dtq.entrypoints.api.tasks import TaskController
from dtq.entrypoints.api.webhooks import WebhookController
from dtq.entrypoints.api.worker_protocol import WorkerProtocolController
from dtq.entrypoints.api.workers import WorkerController
from dtq.entrypoints.bundles import ApiServices
from dtq.entrypoints.config import Settings
from dtq.entrypoints.dashboard import dashboard_routes, template_config
from dtq.entrypoints.metrics import OrchestratorMetrics


def _package_version() -> str:
    try:
        return version("dtq")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


def _dependencies(  # noqa: C901  (one typed provider per service: flat, not complex)
    services: ApiServices,
    settings: Settings,
    submission: Submission,
    registry: CollectorRegistry,
) -> dict[str, Provide]:
    """Litestar providers for what the handlers take by name (STYLE: Provide, typed functions)."""

    def provide_submission() -> Submission:
        return submission

    def provide_queries() -> QueryService:
        return services.queries

    def provide_health() -> HealthService:
        return services.health

    def provide_control() -> ControlService:
        return services.control

    def provide_bulk() -> BulkService:
        return services.bulk

    def provide_artifacts() -> ArtifactService:
        return services.artifacts

    def provide_explain() -> ExplainService:
        return services.explain

    def provide_remote() -> RemoteWorkerService:
        return services.remote

    def provide_events() -> EventService:
        return services.events

    def provide_webhooks() -> WebhookService:
        return services.webhooks

    def provide_settings() -> Settings:
        return settings

    def provide_registry() -> CollectorRegistry:
        return registry

    providers = {
        "submission": provide_submission,
        "queries": provide_queries,
        "health": provide_health,
        "control": provide_control,
        "bulk": provide_bulk,
        "artifacts": provide_artifacts,
        "explain": provide_explain,
        "remote": provide_remote,
        "events": provide_events,
        "webhooks": provide_webhooks,
        "settings": provide_settings,
        "registry": provide_registry,
    }
    return {
        name: Provide(fn, use_cache=True, sync_to_thread=False) for name, fn in providers.items()
    }


def create_app(
    services: ApiServices,
    settings: Settings,
    metrics: OrchestratorMetrics,
    registry: CollectorRegistry,
    *,
    body_timeout: float = BODY_TIMEOUT,
) -> Litestar:
    """Build the orchestrator's HTTP API.

    Routes: ``GET /healthz``, ``GET /metrics``, ``POST /v1/tasks``, ``GET /v1/tasks/{id}``,
    ``POST /v1/jobs``, ``GET /v1/jobs/{id}``, ``GET /v1/workers`` (spec §7), ``POST /v1/artifacts``,
    ``GET``/``HEAD /v1/artifacts/{id}`` (issue 13), ``GET /v1/tasks/{id}/explain`` (issue 14
    item 7), the HTTP worker protocol under ``/v1/worker`` (issue 15 item 1: claim, run
    heartbeat/result/failure/release, batched results, registry), ``POST /v1/tasks/cancel|retry``
    and ``GET /v1/operations/{id}`` (issue 14 item 6), ``GET /v1/events``
    (issue 16 item 1: Server-Sent Events), ``/v1/webhooks`` (issue 16 item 2), the OpenAPI
    document under ``/schema``
    (``/schema/openapi.json``) and the dashboard under ``/ui`` (:mod:`dtq.entrypoints.dashboard`,
    issue 16 item 3; not in ``/schema``).

    Args:
        services: the API's bundle (``submit``, ``queries``, ``health``).
        settings: limits: ``api_max_body_bytes`` (413 above it), ``api_max_tasks_per_job``,
            ``api_max_payload_bytes``.
        metrics: receives HTTP request metrics and submission counters.
        registry: the registry ``GET /metrics`` exposes (the one ``metrics`` lives in).
        body_timeout: seconds a request body may take to arrive in full, from the request's
            start; then HTTP 408 (``middleware.BODY_TIMEOUT``, 30 s, by default).

    With ``settings.api_auth == "tokens"`` every ``/v1`` route (and ``/metrics`` with
    ``settings.metrics_auth``) needs a bearer token with the route's scope (``auth.py``), checked
    by ``services.tokens``; with ``"none"`` nothing is checked.

    Returns:
        The ASGI application. It does not configure logging (``logging_config=None``): the
        process entrypoint does that once for everything.
    """
    tokens_on = settings.api_auth == "tokens"
    submission = Submission(CountingSubmit(services.submit, metrics), services.fleet, settings)
    guards = [auth_guard(services.tokens, metrics_auth=settings.metrics_auth)] if tokens_on else []
    app = Litestar(
        route_handlers=[
            HealthController,
            MetricsController,
            TaskController,
            JobController,
            WorkerController,
            ArtifactController,
            WorkerProtocolController,
            BulkController,
            OperationController,
            EventController,
            WebhookController,
            *dashboard_routes(services, tokens_on=tokens_on),
        ],
        on_shutdown=[services.bulk.aclose],
        template_config=template_config(),
        dependencies=_dependencies(services, settings, submission, registry),
        exception_handlers=EXCEPTION_HANDLERS,
        guards=guards,
        request_max_body_size=settings.api_max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="dtq",
            version=_package_version(),
            description="Distributed task orchestrator: jobs of tasks with dependencies.",
            path="/schema",
            components=security_components() if tokens_on else Components(),
        ),
        plugins=[StrictStructSchemaPlugin()],
        logging_config=None,
    )
    if tokens_on:
        document_security(app, metrics_auth=settings.metrics_auth)
    _install_fast_path(app, submission, services, settings)
    install_middleware(app, metrics, body_timeout)
    return app


def _install_fast_path(
    app: Litestar, submission: Submission, services: ApiServices, settings: Settings
) -> None:
    """Put :class:`SubmitFastPath` between Litestar's exception handler and its router.

    Raises:
        RuntimeError: the installed Litestar builds its handler chain differently (a version
            this code was not written for; ``tests/unit/test_fast_submit.py`` catches it).
    """
    handler = app.asgi_handler
    if not isinstance(handler, ExceptionHandlerMiddleware) or handler.app is not app.asgi_router:
        raise RuntimeError("Litestar's ASGI handler is not its exception handler around its router")
    handler.app = SubmitFastPath(
        app.asgi_router,
        app,
        submission,
        tokens=services.tokens if settings.api_auth == "tokens" else None,
        metrics_auth=settings.metrics_auth,
        max_body=settings.api_max_body_bytes,
    )
