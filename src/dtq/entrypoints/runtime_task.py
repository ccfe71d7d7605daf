"""Executing one claimed task: handler call, timeout, lease heartbeat, outcome (spec §5, §6).

:class:`TaskRunner` is internal to the worker runtime; the policy it implements is described in
:mod:`dtq.entrypoints.runtime`.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import random
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from dtq.application.commands import Claim, ReportOutcome
from dtq.application.execution import ExecutionService
from dtq.application.ports import LeaseState
from dtq.domain.errors import BackendUnavailable, DtqError
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.runtime_types import Handler, Options, PermanentError, Task

#: Reason written to a run handed back on shutdown (spec §6 Graceful shutdown).
HAND_BACK_REASON = "worker shutting down"

_BACKOFF_START = 0.5  # seconds: first pause after a backend error
_BACKOFF_CAP = 10.0  # seconds: longest pause between attempts
_REPORT_ATTEMPTS = 5  # tries to record one outcome before leaving the task to reclaim

_LEASE_LOST = "lease lost"
_SHUTDOWN = "shutdown"


def backoff_delay(failures: int) -> float:
    """Seconds to pause after ``failures`` consecutive backend errors (>= 1).

    Exponential from 0.5 s, capped at 10 s, with up to 20 % jitter so that many workers do not
    hammer a recovering backend in lockstep.
    """
    base: float = min(_BACKOFF_CAP, _BACKOFF_START * 2.0 ** max(failures - 1, 0))
    return base * random.uniform(0.8, 1.0)


class HandlerTimeout(Exception):
    """The handler outlived ``Options.default_timeout`` (a failure, retried by policy)."""


@dataclass(eq=False, slots=True)
class _InFlight:
    """A claimed task whose handler is running."""

    claim: Claim
    log: FilteringBoundLogger
    handler: asyncio.Task[None] | None = None
    interrupted: str | None = None  # _LEASE_LOST or _SHUTDOWN once the runtime cancelled it

    def interrupt(self, why: str) -> None:
        """Cancel the handler; the first reason given wins."""
        if self.interrupted is None:
            self.interrupted = why
        if self.handler is not None:
            self.handler.cancel()


class TaskRunner:
    """Runs claimed tasks for the poll loops of one runtime session.

    Args:
        handlers: kind -> handler, fixed for the session.
        options: runtime options (timeout, thread pool size).
        execution: the service that records outcomes and extends leases.
        metrics: where to count (spec §9 worker metrics).
        heartbeat_every: lease heartbeat period in seconds.
    """

    def __init__(
        self,
        *,
        handlers: Mapping[str, Handler],
        options: Options,
        execution: ExecutionService,
        metrics: WorkerMetrics,
        heartbeat_every: float,
    ) -> None:
        self._handlers = dict(handlers)
        self._async = {kind: _is_async(h) for kind, h in self._handlers.items()}
        self._options = options
        self._execution = execution
        self._metrics = metrics
        self._heartbeat_every = heartbeat_every
        self._pool = ThreadPoolExecutor(options.sync_threads, thread_name_prefix="dtq-handler")
        self._inflight: set[_InFlight] = set()
        self._abandoning = False
        self.handed_back = 0

    def abandon(self) -> None:
        """Shutdown: cancel every running handler and hand its task back; later claims too."""
        self._abandoning = True
        for flight in list(self._inflight):
            flight.interrupt(_SHUTDOWN)

    def close(self) -> None:
        """Release the thread pool without waiting for sync handlers still running."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def execute(self, claim: Claim, log: FilteringBoundLogger) -> None:
        """Run the claimed task's handler under heartbeat and timeout; record the outcome.

        Args:
            claim: the claim ``ExecutionService.claim`` returned.
            log: the worker's logger; the task fields are bound onto it.

        Raises:
            Exception: only what a bug outside the handler raises; handler errors and backend
                errors while recording are handled here.
        """
        kind = claim.task.kind
        log = log.bind(
            task_id=str(claim.task.id),
            job_id=str(claim.task.job_id),
            kind=kind,
            attempt=claim.run.attempt_number,
            run_id=str(claim.run.id),
        )
        handler = self._handlers.get(kind)
        if handler is None:  # counted by unknown_kind only: a submitted kind is an unbounded label
            await self._unknown_kind(claim, log)
            return
        self._metrics.tasks_claimed.labels(kind=kind).inc()
        flight = _InFlight(claim, log=log)
        if self._abandoning:  # popped while shutting down: hand it straight back
            await self._hand_back(flight)
            return
        task = Task(
            id=claim.task.id,
            job_id=claim.task.job_id,
            kind=kind,
            payload=claim.task.payload,
            attempt=claim.run.attempt_number,
        )
        log.debug("task started")
        loop = asyncio.get_running_loop()
        started = loop.time()
        flight.handler = asyncio.create_task(
            self._invoke(handler, task), name=f"dtq-task-{task.id}"
        )
        beat = asyncio.create_task(self._heartbeat(flight), name=f"dtq-lease-{task.id}")
        self._inflight.add(flight)
        try:
            await asyncio.wait({flight.handler})
        finally:
            self._inflight.discard(flight)
            beat.cancel()
            flight.handler.cancel()
        await self._settle(flight, loop.time() - started)

    async def _settle(self, flight: _InFlight, duration: float) -> None:
        """Record what the finished handler task means (spec §6 Success / Failure / Lease)."""
        claim, log, handler = flight.claim, flight.log, flight.handler
        assert handler is not None
        kind = claim.task.kind
        if flight.interrupted == _LEASE_LOST:
            log.warning("lease lost: handler cancelled, outcome not recorded")
            return
        exc = None if handler.cancelled() else handler.exception()
        if flight.interrupted == _SHUTDOWN and (handler.cancelled() or exc is not None):
            await self._hand_back(flight)
            return
        self._metrics.handler_duration.labels(kind=kind).observe(duration)
        if handler.cancelled():
            exc = asyncio.CancelledError("handler cancelled")
        if exc is None:
            outcome = await self._report(log, "success", lambda: self._execution.complete(claim))
            if outcome is ReportOutcome.RECORDED:
                self._metrics.tasks_succeeded.labels(kind=kind).inc()
            log.info("task succeeded", duration=round(duration, 6), outcome=outcome)
            return
        permanent = isinstance(exc, PermanentError)
        error = str(exc) if isinstance(exc, HandlerTimeout) else f"{type(exc).__name__}: {exc}"
        outcome = await self._report(
            log, "failure", lambda: self._execution.fail(claim, error, permanent=permanent)
        )
        retried = not permanent and claim.run.attempt_number < claim.task.max_attempts
        if outcome is ReportOutcome.RECORDED:
            self._metrics.tasks_failed.labels(kind=kind).inc()
            if retried:
                self._metrics.tasks_retried.labels(kind=kind).inc()
        details: dict[str, Any] = {}
        if not isinstance(exc, HandlerTimeout | PermanentError):
            details["exc_info"] = exc  # an unexpected error: keep its traceback in the log
        log.warning(
            "task failed",
            error=error,
            permanent=permanent,
            will_retry=retried,
            duration=round(duration, 6),
            outcome=outcome,
            **details,
        )

    async def _unknown_kind(self, claim: Claim, log: FilteringBoundLogger) -> None:
        """Fail a task nobody here can run, permanently (spec §6 Unknown kind)."""
        self._metrics.unknown_kind.inc()
        error = f"unknown kind {claim.task.kind!r}: no handler registered"
        log.error("unknown kind: task failed permanently", registered=sorted(self._handlers))
        await self._report(
            log, "failure", lambda: self._execution.fail(claim, error, permanent=True)
        )

    async def _hand_back(self, flight: _InFlight) -> None:
        """Give the task back at once instead of waiting for reclaim (spec §6 shutdown)."""
        outcome = await self._report(
            flight.log,
            "hand-back",
            lambda: self._execution.hand_back(flight.claim, HAND_BACK_REASON),
        )
        if outcome is ReportOutcome.RECORDED:
            self.handed_back += 1
        flight.log.info("task handed back", outcome=outcome)

    async def _invoke(self, handler: Handler, task: Task) -> None:
        """Call the handler under the task's log context and ``default_timeout``.

        Raises:
            HandlerTimeout: the deadline passed (the handler was cancelled or abandoned).
        """
        timeout = self._options.default_timeout
        with structlog.contextvars.bound_contextvars(
            task_id=str(task.id), job_id=str(task.job_id), kind=task.kind, attempt=task.attempt
        ):
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    await self._call(handler, task)
            except TimeoutError:
                if deadline.expired():
                    raise HandlerTimeout(f"timed out after {timeout:g} s") from None
                raise

    async def _call(self, handler: Handler, task: Task) -> None:
        """Await an async handler; run a sync one in the bounded thread pool."""
        if self._async[task.kind]:
            result: object = handler(task)
        else:
            ctx = contextvars.copy_context()
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._pool, partial(ctx.run, handler, task))
        if inspect.isawaitable(result):
            await result

    async def _heartbeat(self, flight: _InFlight) -> None:
        """Extend the lease every ``heartbeat_every`` s; cancel the handler if it is lost."""
        kind = flight.claim.task.kind
        while True:
            await asyncio.sleep(self._heartbeat_every)
            try:
                state = await self._execution.heartbeat(flight.claim)
            except Exception as exc:
                flight.log.warning("lease heartbeat failed", error=f"{type(exc).__name__}: {exc}")
                continue
            if state is LeaseState.LOST:
                self._metrics.lease_losses.labels(kind=kind).inc()
                flight.log.warning("lease lost: cancelling the handler")
                flight.interrupt(_LEASE_LOST)
                return
            if state is LeaseState.EXTENDED:
                self._metrics.lease_extensions.labels(kind=kind).inc()
            else:
                flight.log.warning("lease heartbeat found no lease", state=str(state))

    async def _report(
        self,
        log: FilteringBoundLogger,
        what: str,
        call: Callable[[], Awaitable[ReportOutcome]],
    ) -> ReportOutcome | None:
        """Record an outcome, retrying backend errors (a replay is a no-op: ``DUPLICATE``).

        Returns:
            The outcome, or None when it could not be recorded; the lease then lapses and the
            reconciler reclaims the task, so the work is redone (at-least-once).
        """
        for attempt in range(1, _REPORT_ATTEMPTS + 1):
            try:
                outcome = await call()
            except BackendUnavailable as exc:
                if attempt == _REPORT_ATTEMPTS:
                    log.error("outcome not recorded; the task will be reclaimed", report=what)
                    return None
                delay = backoff_delay(attempt)
                log.warning("recording outcome failed; retrying", report=what, error=str(exc))
                await asyncio.sleep(delay)
            except DtqError as exc:
                log.error("outcome refused", report=what, error=f"{type(exc).__name__}: {exc}")
                return None
            else:
                if outcome is ReportOutcome.STALE:
                    log.warning("outcome refused: the run is no longer live", report=what)
                return outcome
        return None  # pragma: no cover - the loop always returns


def _is_async(handler: Handler) -> bool:
    """True for ``async def`` functions (also behind ``functools.partial`` or ``__call__``)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - we look for an async __call__
    )
