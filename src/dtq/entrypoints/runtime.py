"""The worker runtime: register handlers by kind, then poll, claim, run and report (spec §5, §6).

Handler authors import from :mod:`dtq.worker`; this module holds the implementation.

How tasks are processed (spec §5 claim flow), in batches so that one store transaction serves
many tasks while every state change is still committed before it is acknowledged:

1. One fetch loop pops up to ``min(free slots, Options.claim_batch)`` task ids from the ready
   lists (``Options.priorities``, highest first; it blocks ``Options.poll_timeout`` seconds for
   the first id, then takes what is already waiting). There are ``concurrency`` slots; the loop
   waits for one to free up, and also while ``Options.complete_batch`` successes are still
   waiting for their commit.
2. ``ExecutionService.claim_many`` claims them all in one transaction (it releases every
   pending marker on every path and sets every lease). A refused id (another worker won, not
   yet due, a duplicate) is counted (``worker_claim_refusals_total``) and skipped.
3. Each claim's handler runs in its own asyncio task. A kind with no handler fails at once with
   ``permanent=True`` (spec §6 Unknown kind).
4. The handler runs under ``Options.default_timeout``. One heartbeat loop extends the lease of
   every held claim every ``min(heartbeat_every, lease_duration / 3)`` seconds, from the claim
   until its success is committed. If a lease is LOST (another run owns the task) that claim's
   handler alone is cancelled (or its waiting success dropped) and *nothing* is recorded.
5. Return: the claim joins the completion batch; one loop records batches with
   ``ExecutionService.complete_many`` (at most ``Options.complete_batch`` claims each), the next
   one as soon as the previous commit returns, so successes that finish while a commit is in
   flight share the next transaction and an idle worker adds no delay. Exception: ``fail``
   with ``"<ExceptionType>: <message>"`` (one call per failure), retried by policy;
   :class:`PermanentError` fails at once; a timeout fails with ``"timed out after N s"``.

The worker keeps **one hot-path store transaction in flight**: ``claim_many`` and
``complete_many`` take turns (a FIFO lock), so each waits at most one transaction and batches
grow while it waits. Run side by side, a claim and a completion of the same job abort each other
under SERIALIZABLE (PostgreSQL SSI, 40001: both touch the job's ``(job_id, status)`` index range
and the tasks' pages); taking turns measured no re-runs instead of ~0.6 per transaction and
~20-30 % more tasks/s on the drain benchmark (``benchmarks/drain_inprocess.py``, one or two
workers). The price is that one worker does not overlap its own claim and completion round
trips, which matters only when the database is far away; ``complete_batch`` then grows the
batches. Failures and hand-backs (rare) are not part of the turn.

Handler errors never stop a loop. A store or queue error (``BackendUnavailable``) is logged and
the fetch loop backs off (0.5 s doubling to 10 s, jittered), then carries on. Recording an
outcome (a failure, a hand-back, or a whole completion batch) is retried a few times (a replay
is a no-op); if it still fails, the claims are no longer heartbeated, their leases lapse and the
reconciler reclaims the tasks, so the work is redone (delivery is at-least-once).

Logging: failures, lost leases and hand-backs are logged at WARNING/INFO with ``task_id``,
``job_id``, ``kind``, ``attempt`` and ``run_id``; ``task started`` and ``task succeeded`` are
DEBUG lines, so a busy worker at INFO spends nothing per success on logging. Handlers log with
the same task fields bound as context variables.

Sync handlers (plain ``def``) run in a ``ThreadPoolExecutor`` of ``Options.sync_threads``
threads, so they never block the event loop. A thread cannot be killed: on timeout, lease loss or
shutdown the runtime stops waiting for it and acts as for an async handler, but the function
keeps running until it returns, holding its pool thread (and delaying process exit).

**Graceful shutdown policy** (spec §6, "document chosen policy"):

* On stop (``stop`` event, or the first SIGTERM/SIGINT in :meth:`Runtime.run_forever`) the fetch
  loop pops no more work. A pop already blocking finishes (at most ``poll_timeout``, so no
  popped id is lost); ids it delivers after the stop are put back unclaimed
  (``ExecutionService.put_back``: marker released, id pushed again), so no run is opened only
  to be handed back. Ids claimed by a batch already in flight run normally.
* Running handlers get ``Options.shutdown_grace`` seconds to finish; their outcomes are recorded
  normally.
* Then every handler still running is cancelled and its task *handed back at once*
  (``ExecutionService.hand_back``: run ``dead``, task ``queued`` and due now, attempt rolled back,
  id re-pushed) so another worker picks it up without waiting for the stale-run reclaim.
  Successes already waiting for a completion batch are committed, not handed back.
* A second signal (or the ``stop_now`` event) skips the remaining grace and hands back at once.
* Every shutdown counts ``worker_shutdowns_total{reason}``: ``signal``, ``stop`` (the caller's
  event), ``cancelled`` (the ``run`` task was cancelled; it hands back first, too) or ``error``.

Registering a kind twice raises :class:`~dtq.domain.errors.DuplicateKind` at once (spec §6
Registration: "return error at startup").
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import Any, TypeAlias, TypeVar

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from structlog.typing import FilteringBoundLogger

from dtq.domain.errors import DuplicateKind
from dtq.entrypoints import eventloop
from dtq.entrypoints.config import listen_address
from dtq.entrypoints.metrics import WorkerMetrics, new_registry
from dtq.entrypoints.runtime_loop import Session
from dtq.entrypoints.runtime_task import HAND_BACK_REASON
from dtq.entrypoints.runtime_types import (
    Handler,
    Options,
    PermanentError,
    Task,
    WorkerServices,
    WorkerSettings,
)

__all__ = [
    "HAND_BACK_REASON",
    "Handler",
    "Options",
    "PermanentError",
    "Runtime",
    "ServicesFactory",
    "Task",
    "WorkerServices",
    "WorkerSettings",
    "demo_runtime",
]

H = TypeVar("H", bound=Handler)

#: A zero-argument callable opening the services for the run, e.g.
#: ``lambda: open_services(settings, backend="real")``.
ServicesFactory: TypeAlias = Callable[[], AbstractAsyncContextManager[WorkerServices]]

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
        self._running = False

    @property
    def kinds(self) -> tuple[str, ...]:
        """The registered kinds, sorted."""
        return tuple(sorted(self._handlers))

    def register(self, kind: str, handler: Handler) -> None:
        """Register ``handler`` for tasks of ``kind``. Call before :meth:`run`.

        Args:
            kind: the stable handler key, e.g. ``email.send`` (version by suffix:
                ``email.send.v2``).
            handler: ``async def h(task) -> None`` or ``def h(task) -> None``.

        Raises:
            DuplicateKind: ``kind`` already has a handler (spec §6 Registration).
            ValueError: ``kind`` is empty or not a string, or ``handler`` is not callable.
        """
        if not isinstance(kind, str) or not kind.strip():
            raise ValueError(f"kind must be a non-empty string, got {kind!r}")
        if not callable(handler):
            raise ValueError(f"handler for kind {kind!r} is not callable: {handler!r}")
        if kind in self._handlers:
            raise DuplicateKind(f"kind {kind!r} is already registered")
        self._handlers[kind] = handler

    def handler(self, kind: str) -> Callable[[H], H]:
        """Decorator form of :meth:`register`; returns the function unchanged.

        Raises:
            DuplicateKind: ``kind`` already has a handler.
            ValueError: as :meth:`register`.
        """

        def decorate(fn: H) -> H:
            self.register(kind, fn)
            return fn

        return decorate

    async def run(
        self,
        services: WorkerServices,
        *,
        stop: asyncio.Event | None = None,
        stop_now: asyncio.Event | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """Work until stopped, then shut down as the module docstring describes.

        Args:
            services: execution, registry, queue and settings (``container.Services``).
            stop: set it to stop gracefully (grace period, then hand back); None runs until
                the task running this coroutine is cancelled.
            stop_now: set it to skip the grace period (hand running tasks back at once).
            metrics: where to count; a fresh registry is used when None. When
                ``settings.worker_metrics_listen`` is set its registry is served over HTTP.

        Raises:
            RuntimeError: this runtime is already running.
            ConfigError: ``worker_metrics_listen`` is not ``[host]:port``.
            OSError: the metrics port cannot be bound.
        """
        await self._run(services, stop=stop, stop_now=stop_now, metrics=metrics, reason="stop")

    async def _run(
        self,
        services: WorkerServices,
        *,
        stop: asyncio.Event | None,
        stop_now: asyncio.Event | None,
        metrics: WorkerMetrics | None,
        reason: str,
    ) -> None:
        if self._running:
            raise RuntimeError("this Runtime is already running")
        self._running = True
        stop = asyncio.Event() if stop is None else stop
        stop_now = asyncio.Event() if stop_now is None else stop_now
        metrics = WorkerMetrics(new_registry()) if metrics is None else metrics
        session = Session(
            handlers=self._handlers,
            options=self.options,
            services=services,
            metrics=metrics,
            log=_log,
        )
        log = _log.bind(worker_id=services.settings.worker_id)
        outcome = "error"
        try:
            async with _serve_metrics(services.settings.worker_metrics_listen, metrics.registry):
                log.info(
                    "worker started",
                    kinds=list(self.kinds),
                    concurrency=session.concurrency,
                    claim_batch=self.options.claim_batch,
                    complete_batch=self.options.complete_batch,
                    lease_heartbeat_every=session.heartbeat_every,
                    priorities=list(self.options.priorities),
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
        services: WorkerServices | ServicesFactory,
        *,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """Run in a new event loop until SIGTERM/SIGINT; blocks, returns once stopped.

        The first signal stops gracefully, a second one skips the grace period.

        Args:
            services: the services, or a factory opening them inside the new loop (needed for
                the real backend, whose pools belong to a loop), e.g.
                ``lambda: open_services(settings, backend="real")``.
            metrics: as :meth:`run`.
        """
        eventloop.run(self._run_signalled(services, metrics))

    async def _run_signalled(
        self, services: WorkerServices | ServicesFactory, metrics: WorkerMetrics | None
    ) -> None:
        stop, stop_now = asyncio.Event(), asyncio.Event()
        with _signals_set(stop, stop_now):
            if callable(services):
                async with services() as opened:
                    await self._run(
                        opened, stop=stop, stop_now=stop_now, metrics=metrics, reason="signal"
                    )
            else:
                await self._run(
                    services, stop=stop, stop_now=stop_now, metrics=metrics, reason="signal"
                )


@contextmanager
def _signals_set(stop: asyncio.Event, stop_now: asyncio.Event) -> Iterator[None]:
    """Route SIGTERM/SIGINT to ``stop`` (first signal) and ``stop_now`` (second) while active."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        if stop.is_set():
            _log.warning("second signal: handing running tasks back now", signal=signum.name)
            stop_now.set()
        else:
            _log.info("signal received: stopping gracefully", signal=signum.name)
            stop.set()

    installed: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
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
    """Serve ``registry`` at ``http://listen/`` (any path) while the block runs; off if unset."""
    if not listen:
        yield
        return
    host, port = listen_address(listen, variable="WORKER_METRICS_LISTEN")
    server, thread = start_http_server(port, addr=host, registry=registry)
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
