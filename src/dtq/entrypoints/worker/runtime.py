"""The worker runtime: register handlers by kind, then run them (spec §6 ``Runtime``).

Handler authors import :mod:`dtq.worker`; this module holds the engine. :func:`serve` is the
one way a worker process runs (``dtq worker`` and :meth:`Runtime.run_forever`): signals route
to a graceful stop (first) and an immediate one (second), see :func:`stop_on_signals`.
How a run works and its shutdown policy: ARCHITECTURE.md, "The worker runtime".
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, TypeAlias, TypeVar

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from structlog.typing import FilteringBoundLogger

from dtq.domain.errors import BackendUnavailable, DuplicateKind
from dtq.domain.names import kind_problem
from dtq.entrypoints import eventloop, gctuning, tracing
from dtq.entrypoints.bundles import WorkerServices
from dtq.entrypoints.config import Settings, listen_address, load_settings
from dtq.entrypoints.metrics import WorkerMetrics, new_registry
from dtq.entrypoints.worker.backend import WorkerBackend
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.entrypoints.worker.session import Session
from dtq.worker import Handler, Options, Task

__all__ = [
    "Runtime",
    "ServicesFactory",
    "WorkerServices",
    "demo_runtime",
    "serve",
    "stop_on_signals",
]

H = TypeVar("H", bound=Handler)

#: A zero-argument callable opening the services for the run, e.g.
#: ``lambda: open_worker_services(settings)`` (``dtq.entrypoints.container``), or the HTTP
#: backend's ``lambda: open_http_worker_services(url, ...)`` (``dtq.entrypoints.worker.http``).
ServicesFactory: TypeAlias = Callable[[], AbstractAsyncContextManager[WorkerBackend]]

_log: FilteringBoundLogger = structlog.get_logger("dtq.worker")


class Runtime:
    """The worker-side execution engine (spec §6 ``Runtime``).

    Example::

        runtime = Runtime(Options(default_timeout=60.0))

        @runtime.handler("email.send")
        async def send(task: Task) -> None:
            ...

    Args:
        options: runtime tuning; ``Options()`` when None.
    """

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()
        self._handlers: dict[str, Handler] = {}
        self._timeouts: dict[str, float] = {}
        self._running = False

    @property
    def kinds(self) -> tuple[str, ...]:
        """The registered kinds, sorted."""
        return tuple(sorted(self._handlers))

    def register(
        self, kind: str, handler: Handler, *, timeout: float | timedelta | None = None
    ) -> None:
        """Register ``handler`` for tasks of ``kind``. Call before :meth:`run`.

        Args:
            kind: the stable handler key, e.g. ``email.send`` (version by suffix:
                ``email.send.v2``).
            handler: ``async def h(task) -> None`` or ``def h(task) -> None``.
            timeout: how long one call of this kind may take (seconds or a timedelta),
                instead of ``Options.default_timeout``; a task submitted with its own
                ``timeout`` wins over it (issue 14 item 3). None: the default.

        Raises:
            DuplicateKind: ``kind`` already has a handler (spec §6 Registration).
            ValueError: ``kind`` is one the API refuses (not a string of 1 to 200 letters,
                digits, ``.``, ``_``, ``:`` or ``-``: no task could ever have it), naming it;
                ``handler`` is not callable; or ``timeout`` is not a positive finite number of
                seconds.
        """
        problem = kind_problem(kind)
        if problem is not None:
            raise ValueError(problem)
        seconds = _timeout_seconds(kind, timeout)
        if not callable(handler):
            raise ValueError(f"handler for kind {kind!r} is not callable: {handler!r}")
        if kind in self._handlers:
            raise DuplicateKind(f"kind {kind!r} is already registered")
        self._handlers[kind] = handler
        if seconds is not None:
            self._timeouts[kind] = seconds

    def handler(self, kind: str, *, timeout: float | timedelta | None = None) -> Callable[[H], H]:
        """Decorator form of :meth:`register` (same ``timeout``); returns the function unchanged.

        Raises:
            DuplicateKind: ``kind`` already has a handler.
            ValueError: as :meth:`register`.
        """

        def decorate(fn: H) -> H:
            self.register(kind, fn, timeout=timeout)
            return fn

        return decorate

    def configure(self, settings: Settings) -> WorkerConfig:
        """This runtime's options resolved against ``settings`` (see ``WorkerConfig.resolve``)."""
        return WorkerConfig.resolve(settings, self.options)

    async def run(
        self,
        services: WorkerBackend,
        config: WorkerConfig,
        *,
        stop: asyncio.Event | None = None,
        stop_now: asyncio.Event | None = None,
        metrics: WorkerMetrics | None = None,
        reason: str = "stop",
    ) -> None:
        """Work until stopped, then shut down (hand unfinished tasks back, spec §6).

        The first run in a process also tunes its garbage collector for throughput
        (:func:`dtq.entrypoints.gctuning.tune`: a frozen start-up heap, rarer passes).

        Args:
            services: the worker's bundle (execution, registry, queue).
            config: the resolved configuration (:meth:`configure`).
            stop: set it to stop gracefully (grace period, then hand back); None runs until
                the task running this coroutine is cancelled.
            stop_now: set it to skip the grace period (hand running tasks back at once).
            metrics: where to count; a fresh registry when None. When
                ``config.metrics_listen`` is set its registry is served over HTTP.
            reason: the ``worker_shutdowns_total{reason}`` label of a stop by ``stop``.

        Raises:
            RuntimeError: this runtime is already running.
            ConfigError: ``metrics_listen`` is not ``[host]:port``.
            BackendUnavailable: the metrics address cannot be bound (one line naming
                ``WORKER_METRICS_LISTEN``, the address and the reason).
        """
        if self._running:
            raise RuntimeError("this Runtime is already running")
        self._running = True
        gctuning.tune()
        stop = asyncio.Event() if stop is None else stop
        stop_now = asyncio.Event() if stop_now is None else stop_now
        metrics = WorkerMetrics(new_registry()) if metrics is None else metrics
        log = _log.bind(worker_id=config.worker_id)
        session = Session(
            handlers=self._handlers,
            timeouts=self._timeouts,
            config=config,
            services=services,
            metrics=metrics,
            log=log,
        )
        outcome = "error"
        try:
            async with _serve_metrics(config.metrics_listen, metrics.registry):
                log.info(
                    "worker started",
                    kinds=list(self.kinds),
                    concurrency=config.concurrency,
                    claim_batch=config.claim_batch or "adaptive",
                    complete_batch=config.complete_batch,
                    lease_renew_every=config.lease_renew_every,
                    priorities=list(config.priorities),
                    event_loop=eventloop.running_loop_name(),
                )
                try:
                    await session.run(stop, stop_now)
                except asyncio.CancelledError:
                    outcome = "cancelled"
                    raise
                outcome = reason
        finally:
            self._running = False
            metrics.shutdowns.labels(reason=outcome).inc()
            log.info("worker stopped", reason=outcome, handed_back=session.handed_back)

    def run_forever(
        self,
        services: WorkerBackend | ServicesFactory,
        *,
        settings: Settings | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """Run in a new event loop until SIGTERM/SIGINT (see :func:`serve`); blocks.

        Args:
            services: the services, or a factory opening them inside the new loop (needed for
                the real backend, whose pools belong to a loop).
            settings: the process configuration; read from the environment when None.
            metrics: as :meth:`run`.

        Raises:
            ConfigError: ``settings`` is None and the environment is not valid.
        """
        if settings is None:
            settings = load_settings(os.environ)
        tracing.setup(os.environ, service_name="dtq-worker")
        eventloop.run(serve(self, settings, services, metrics=metrics))


async def serve(
    runtime: Runtime,
    settings: Settings,
    services: WorkerBackend | ServicesFactory,
    *,
    metrics: WorkerMetrics | None = None,
) -> None:
    """Run ``runtime`` as a worker process until a signal: the first SIGTERM/SIGINT stops
    gracefully, a second one skips the grace period (``worker_shutdowns_total{reason="signal"}``).

    Args:
        runtime: the handlers to run.
        settings: the process configuration, resolved once with ``runtime.options``.
        services: the services, or a factory opening them for the run.
        metrics: as :meth:`Runtime.run`.
    """
    config = runtime.configure(settings)
    stop, stop_now = asyncio.Event(), asyncio.Event()
    with stop_on_signals(stop.set, stop_now.set):
        if callable(services):
            async with services() as opened:
                await runtime.run(
                    opened, config, stop=stop, stop_now=stop_now, metrics=metrics, reason="signal"
                )
        else:
            await runtime.run(
                services, config, stop=stop, stop_now=stop_now, metrics=metrics, reason="signal"
            )


@contextmanager
def stop_on_signals(
    on_first: Callable[[], None], on_second: Callable[[], None], *, logger: str = "dtq.worker"
) -> Iterator[None]:
    """While active, call ``on_first`` on the first SIGTERM/SIGINT and ``on_second`` on any
    later one (the running loop's handlers; none where they cannot be installed). The
    signals are logged under ``logger`` (the process's: the worker's or the orchestrator's)."""
    loop = asyncio.get_running_loop()
    log: FilteringBoundLogger = structlog.get_logger(logger)
    received: list[str] = []

    def handle(signum: signal.Signals) -> None:
        received.append(signum.name)
        if len(received) == 1:
            log.info("signal received: stopping gracefully", signal=signum.name)
            on_first()
        else:
            log.warning("signal received again: stopping now", signal=signum.name)
            on_second()

    installed: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, handle, signum)
        except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
            _log.warning("cannot install a signal handler", signal=signum.name)
        else:
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


@asynccontextmanager
async def _serve_metrics(listen: str | None, registry: CollectorRegistry) -> AsyncIterator[None]:
    """Serve ``registry`` at ``http://listen/`` (any path) while the block runs; off if unset.

    Raises:
        ConfigError: ``listen`` is not ``[host]:port``.
        BackendUnavailable: the address cannot be bound (in use, not this machine's, a host
            name that does not resolve), naming ``WORKER_METRICS_LISTEN``, the address and the
            reason, as the orchestrator reports its own listen address.
    """
    if not listen:
        yield
        return
    host, port = listen_address(listen, variable="WORKER_METRICS_LISTEN")
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        shown = f"[{host}]" if ":" in host else host
        raise BackendUnavailable(
            f"WORKER_METRICS_LISTEN: the metrics server could not start on {shown}:{port}: "
            f"{exc.strerror or exc}"
        ) from None
    _log.info("worker metrics listening", host=host, port=server.server_port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)


def demo_runtime(options: Options | None = None) -> Runtime:
    """A runtime with the demo ``echo`` handler (spec README: ``dtq-worker`` out of the box).

    ``echo`` logs ``echo: kind=echo attempt=1 payload=...`` (payload as compact JSON) and
    succeeds.

    Args:
        options: runtime tuning; ``Options()`` when None.

    Returns:
        A new runtime with ``echo`` registered.
    """
    runtime = Runtime(options)

    @runtime.handler("echo")
    async def echo(task: Task) -> None:
        _log.info(f"echo: kind={task.kind} attempt={task.attempt} payload={_json(task.payload)}")

    return runtime


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def _timeout_seconds(kind: str, timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise ValueError(f"timeout for kind {kind!r} must be seconds or a timedelta: {timeout!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"timeout for kind {kind!r} must be positive, got {timeout!r}")
    return seconds
