"""``dtq orchestrator`` (and ``dtq-orchestrator``): the HTTP API and the reconciler in one loop,
with the webhook deliveries beside them (``entrypoints/webhooks.py``, issue 16 item 2).

:func:`serve` is also what ``dtq dev`` runs, with a worker added on the memory backend.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import structlog
import uvicorn

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.cli.common import EXIT_OK, cli_settings, fail, run
from dtq.entrypoints.cli.http import http_protocol
from dtq.entrypoints.config import Settings, listen_address

if TYPE_CHECKING:
    from dtq.entrypoints.container import Backend
    from dtq.entrypoints.worker.runtime import Runtime

#: Seconds the API keeps an idle keep-alive connection open: longer than the idle expiry of
#: common clients, so a client normally drops an idle connection before the server does
#: (ARCHITECTURE.md, "HTTP keep-alive").
HTTP_KEEP_ALIVE = 65

#: Seconds the API waits for in-flight requests when stopping; then they are cancelled.
HTTP_SHUTDOWN_GRACE = 5


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``orchestrator`` on the ``commands`` subparsers."""
    parser = commands.add_parser(
        "orchestrator", help="HTTP API + reconciler", parents=list(parents)
    )
    parser.set_defaults(command=cmd_orchestrator)


def cmd_orchestrator(args: argparse.Namespace) -> int:
    """Serve the API and run the reconciler on the real backend until a signal."""
    settings = cli_settings(args, service="dtq-orchestrator")
    settings.require_dsn()
    warn_unauthenticated_bind(settings)
    return run(serve(settings, backend="real", runtime=None))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def warn_unauthenticated_bind(settings: Settings) -> None:
    """Say loudly on stderr, and in the log, when ``API_AUTH=none`` serves beyond loopback:
    anyone who can reach the port may then submit, read and cancel anything."""
    host, _ = listen_address(settings.orchestrator_listen)
    if settings.api_auth != "none" or is_loopback(host):
        return
    message = (
        f"WARNING: API_AUTH=none on {settings.orchestrator_listen}: the API accepts every request "
        "from anyone who can reach it; use API_AUTH=tokens (the default) with `dtq token create`"
    )
    fail(message)
    structlog.get_logger("dtq.orchestrator").warning(
        "API authentication is off on a non-loopback address",
        listen=settings.orchestrator_listen,
    )


def http_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration of the API on ``ORCHESTRATOR_LISTEN``.

    Responses go out in one write each (:func:`~dtq.entrypoints.cli.http.http_protocol`).
    uvicorn's access lines are logged only with ``LOG_LEVEL=debug``: one line per request
    cost ~0.1 ms of CPU, a third of a small submit's, and the HTTP metrics count every
    request anyway (issue 17 item 3).
    """
    host, port = listen_address(settings.orchestrator_listen)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        lifespan="on",
        timeout_keep_alive=HTTP_KEEP_ALIVE,
        timeout_graceful_shutdown=HTTP_SHUTDOWN_GRACE,
        http=http_protocol(),
        access_log=settings.log_level == "debug",
    )


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to ``stop_on_signals``, which stops the API,
    the reconciler and the dev worker together."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing (uvicorn would otherwise take SIGINT/SIGTERM for itself)."""
        yield


async def serve(settings: Settings, *, backend: Backend, runtime: Runtime | None) -> int:
    """Serve the API and run the reconciler and the webhook loop (and, given a ``runtime``, a
    worker) until a signal.

    Each loop gets its own bundle (API, reconciler, worker) from one container, so in ``dtq dev``
    all three share the memory store and queue. The worker's metrics are registered in the API's
    registry, so ``dtq dev``'s ``/metrics`` carries the ``worker_*`` series too. Once the app is
    built the process's garbage collector is tuned (:func:`dtq.entrypoints.gctuning.tune`).

    Returns:
        ``EXIT_OK`` once everything stopped.

    Raises:
        ConfigError: the database cannot be reached at start.
        BackendUnavailable: the HTTP server could not start.
    """
    from dtq.entrypoints import gctuning
    from dtq.entrypoints.api import create_app
    from dtq.entrypoints.container import open_services
    from dtq.entrypoints.metrics import OrchestratorMetrics, WorkerMetrics, new_registry
    from dtq.entrypoints.reconciler import Reconciler
    from dtq.entrypoints.webhooks import WebhookLoop
    from dtq.entrypoints.worker.runtime import stop_on_signals

    metrics = OrchestratorMetrics(new_registry())
    stop, stop_now = asyncio.Event(), asyncio.Event()

    def count_retry(reason: str) -> None:
        metrics.store_retries.labels(reason=reason).inc()

    def count_push_missed(reason: str, jobs: int) -> None:
        metrics.submit_pushes_missed.labels(reason=reason).inc(jobs)

    async with open_services(
        settings, backend=backend, on_store_retry=count_retry, on_push_missed=count_push_missed
    ) as services:
        app = create_app(services.api, settings, metrics, metrics.registry)
        server = _Server(http_config(app, settings))
        gctuning.tune()  # the app, the pools and the imports are built: freeze them
        reconciler = Reconciler(
            services.reconciler.reconcile,
            interval=settings.reconcile_interval,
            promote_interval=settings.promote_interval,
            batch=settings.reconcile_batch,
            metrics=metrics,
            retention=services.reconciler.retention,
        )

        def stop_gracefully() -> None:
            stop.set()
            server.should_exit = True

        def stop_at_once() -> None:
            # Not uvicorn's force_exit: it skips the app's lifespan shutdown, whose pending
            # receive() is then cancelled at loop teardown and logged as an error traceback.
            # In-flight requests are bounded by HTTP_SHUTDOWN_GRACE instead.
            stop_gracefully()
            stop_now.set()

        with stop_on_signals(stop_gracefully, stop_at_once, logger="dtq.orchestrator"):
            async with asyncio.TaskGroup() as group:
                group.create_task(_serve_http(server, stop), name="dtq-http")
                group.create_task(reconciler.run(stop), name="dtq-reconciler")
                group.create_task(
                    WebhookLoop(services.reconciler.webhooks).run(stop), name="dtq-webhooks"
                )
                if runtime is not None:
                    from dtq.entrypoints.cli.dev import announce

                    group.create_task(
                        runtime.run(
                            services.worker,
                            runtime.configure(settings),
                            stop=stop,
                            stop_now=stop_now,
                            metrics=WorkerMetrics(metrics.registry),
                        ),
                        name="dtq-worker",
                    )
                    group.create_task(announce(server), name="dtq-announce")
    return EXIT_OK


async def _serve_http(server: uvicorn.Server, stop: asyncio.Event) -> None:
    """Run uvicorn until it exits; then stop the other loops too.

    Raises:
        BackendUnavailable: the server could not start (port in use, app startup failed).
    """
    try:
        await server.serve()
    except SystemExit:  # uvicorn exits this way when it cannot bind or start the app
        host, port = server.config.host, server.config.port
        raise BackendUnavailable(
            f"the HTTP server could not start on {host}:{port}{_bind_error(host, port)}"
        ) from None
    finally:
        stop.set()


def _bind_error(host: str, port: int) -> str:
    """``": <reason>"`` when binding ``host:port`` fails now (the reason uvicorn logged before
    it exited, e.g. "Address already in use"), else ``""`` (the app's startup failed)."""
    try:
        with socket.create_server((host, port)):
            return ""
    except OSError as exc:
        return f": {exc.strerror or exc}"
