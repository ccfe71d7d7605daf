"""One run of a worker: its loops, the life of each claim, and shutdown (spec §5, §6).

:class:`Session` is internal; :meth:`dtq.entrypoints.worker.runtime.Runtime.run` builds one per
run. The fetch loop delivers each committed claim here; its handler runs in its own asyncio
task; a success goes to the completion batcher, a failure or a hand-back is reported at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from structlog.typing import FilteringBoundLogger

from dtq.application.artifacts import ArtifactService
from dtq.application.commands import Claim, ReportOutcome
from dtq.application.execution import FailOutcome
from dtq.domain.payload import MAX_ERROR_CHARS, storable_text
from dtq.entrypoints import tracing
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.worker.artifacts import TaskArtifacts
from dtq.entrypoints.worker.backend import WorkerBackend, WorkerExecution
from dtq.entrypoints.worker.claims import (
    HAND_BACK_REASON,
    LEASE_LOST,
    RECORD_NOTHING,
    SHUTDOWN,
    TASK_CANCELLED,
    Held,
    Meters,
    Phase,
    Shared,
)
from dtq.entrypoints.worker.completions import Completions, report
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.entrypoints.worker.fetch import Fetcher, wait_any
from dtq.entrypoints.worker.leases import Leases
from dtq.entrypoints.worker.runner import HandlerRunner, HandlerTimeout
from dtq.worker import Handler, PermanentError

_FINAL_WAIT = 15.0  # seconds: bound on hand-backs and last commits after the grace period
_UNREGISTER_WAIT = 5.0  # seconds: bound on removing the registry row at the end of a shutdown


class Session:
    """Everything one ``Runtime.run`` owns: the fetch, completion, lease and registry loops
    and the asyncio task of each claim.

    Args:
        handlers: kind -> handler, fixed for the session.
        timeouts: kind -> handler timeout in seconds, for the kinds registered with one.
        config: the worker's configuration.
        services: execution, registry, ready lists and artifacts (native or HTTP backend).
        metrics: where to count (spec §9 worker metrics).
        log: the worker's logger (worker_id bound).
    """

    def __init__(
        self,
        *,
        handlers: Mapping[str, Handler],
        config: WorkerConfig,
        timeouts: Mapping[str, float] | None = None,
        services: WorkerBackend,
        metrics: WorkerMetrics,
        log: FilteringBoundLogger,
    ) -> None:
        self._handlers = dict(handlers)
        self._config = config
        self._execution: WorkerExecution = services.execution
        self._registry = services.registry
        self._metrics = metrics
        self._meters = Meters(metrics)
        self._meters.start_at_zero(self._handlers)
        self._log = log
        self._debug = log.is_enabled_for(logging.DEBUG)
        self._tasks: set[asyncio.Task[None]] = set()  # one per claim, until it settles
        self._abandoning = False
        self.handed_back = 0
        turn = asyncio.Lock()  # one hot-path transaction in flight: batch claims, completions
        self._runner = HandlerRunner(
            handlers,
            default_timeout=config.default_timeout,
            kind_timeouts=timeouts,
            sync_threads=config.sync_threads,
            max_result_bytes=self._execution.policy.max_result_bytes,
            artifacts=(
                TaskArtifacts(services.artifacts)
                if isinstance(services.artifacts, ArtifactService)
                else services.artifacts
            ),
        )
        shared = Shared(config=config, execution=self._execution, meters=self._meters, log=log)
        self._leases = Leases(shared, on_lost=self._lease_lost)
        self._completions = Completions(shared, turn=turn, settled=self._leases.release)
        self._fetch = Fetcher(
            shared,
            queue=services.queue,
            turn=turn,
            room=self._completions.room,
            committed=self._completions.committed,
            deliver=self.start,
            hand_back=self._hand_back_claims,
            kinds=frozenset(self._handlers),
        )
        self._release_slot = self._fetch.slots.release

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, stop_now: asyncio.Event) -> None:
        """Work until ``stop`` (graceful) or ``stop_now`` (skip the grace), then shut down.

        Cancelling the caller also shuts down at once (handing running tasks back) and then
        re-raises ``CancelledError``. Either way the worker's registry row is removed last,
        once its loops have ended (best effort: a failure is logged).
        """
        fetch = asyncio.create_task(self._fetch.loop(), name="dtq-worker-fetch")
        background = [
            asyncio.create_task(self._completions.loop(), name="dtq-worker-completions"),
            asyncio.create_task(self._leases.loop(), name="dtq-worker-lease-renewal"),
            asyncio.create_task(self._registry_loop(), name="dtq-worker-registry"),
        ]
        stopped = False  # a stop or a cancel asked for, not an error: the row goes
        try:
            await wait_any(stop, stop_now)
            stopped = True
            self._fetch.stop()
            if not stop_now.is_set():
                await self._grace(fetch, stop_now)
            await self._hand_back_all(fetch)
        except asyncio.CancelledError:
            stopped = True
            self._fetch.stop()
            await self._hand_back_all(fetch)
            raise
        finally:
            # A fetch loop cancelled between a claim's commit and its start hands that claim
            # back itself (shielded), so everything can be cancelled together.
            tasks = [fetch, *background, *self._tasks]
            for task in tasks:
                task.cancel()
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
                if stopped:
                    await self._unregister()
            finally:
                self.close()

    async def _settled(self, fetch: asyncio.Task[None]) -> None:
        """Return once the fetch loop has ended and every claim has settled."""
        await asyncio.wait({fetch})
        await self.wait_settled()

    async def wait_settled(self) -> None:
        """Return once every claim task has ended and no success waits for a commit."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._completions.wait_idle()

    def close(self) -> None:
        """Release the handler thread pool (without waiting for plain handlers still running)."""
        self._runner.close()

    async def _grace(self, fetch: asyncio.Task[None], stop_now: asyncio.Event) -> None:
        """Let running handlers finish for up to ``shutdown_grace`` seconds or ``stop_now``."""
        if self._config.shutdown_grace <= 0:
            return
        all_done = asyncio.ensure_future(self._settled(fetch))
        now = asyncio.ensure_future(stop_now.wait())
        try:
            await asyncio.wait(
                {all_done, now},
                timeout=self._config.shutdown_grace,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            all_done.cancel()
            now.cancel()

    async def _hand_back_all(self, fetch: asyncio.Task[None]) -> None:
        """Cancel every running handler; wait (bounded) for the hand-backs and the commits of
        successes already waiting."""
        self.abandon()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled(fetch), timeout=_FINAL_WAIT)

    def abandon(self) -> None:
        """Shutdown: interrupt every running handler (it is handed back); later claims too.

        Successes already waiting for a commit are still committed.
        """
        self._abandoning = True
        self._completions.stop_retrying()
        for held in self._leases.held:
            held.interrupt(SHUTDOWN)

    # -- one claim -----------------------------------------------------------------------------

    def start(self, claim: Claim, trace: tracing.TraceHandle | None = None) -> None:
        """Run the claim's handler in its own asyncio task (or hand it back when shutting
        down, or fail it permanently when its kind has no handler); ``trace`` is the parent
        of its handler span (None while tracing is off)."""
        held = Held(claim, trace=trace)
        handler = self._handlers.get(claim.task.kind)
        if handler is not None:
            self._meters.kind(claim.task.kind).claimed.inc()
            if not self._abandoning:
                self._leases.hold(held)
        task = asyncio.create_task(self._run(held, handler))
        held.task = task
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._release_slot()
        if not task.cancelled() and task.exception() is not None:
            self._log.error("task runner error", exc_info=task.exception())

    async def _run(self, held: Held, handler: Handler | None) -> None:
        if handler is None:  # counted by unknown_kind only: a submitted kind is an unbounded label
            held.phase = Phase.SETTLING
            await self._unknown_kind(held)
            return
        if held.interrupted in RECORD_NOTHING:  # lost or cancelled before it began
            held.phase = Phase.SETTLING
            self._leases.release(held)
            if held.interrupted == TASK_CANCELLED:
                self._log.info("task cancelled: handler not started", **held.fields)
            else:
                self._log.warning("lease lost: handler not started", **held.fields)
            return
        if self._abandoning:  # claimed while shutting down: hand it straight back
            held.phase = Phase.SETTLING
            self._leases.release(held)
            await self._hand_back(held)
            return
        try:
            await self._execute(held, handler)
        finally:
            if held.phase is not Phase.WAITING:
                self._leases.release(held)

    async def _execute(self, held: Held, handler: Handler) -> None:
        """Run the handler; route the result (spec §6 Success / Failure)."""
        if self._debug:
            self._log.debug("task started", **held.fields)
        loop = asyncio.get_running_loop()
        started = loop.time()
        current = asyncio.current_task()
        exc: BaseException | None = None
        held.phase = Phase.RUNNING
        try:
            # the handler span (a no-op while tracing is off) yields the complete span's parent
            with tracing.handler_span(held.trace, held.claim.task.kind) as held.trace:
                held.result = await self._runner.invoke(handler, held.claim, held.report_progress)
        except asyncio.CancelledError as cancelled:
            ours = 0 if held.interrupted is None else 1  # cancel requests we made ourselves
            if current is not None and current.cancelling() > ours:
                raise  # the session is cancelling this task: not a handler outcome
            exc = cancelled  # interrupted by us, or raised by the handler itself
        except Exception as error:
            exc = error
        held.phase = Phase.SETTLING  # from here on nothing cancels this task
        if held.interrupted is not None and current is not None and current.cancelling():
            current.uncancel()  # our own interruption was delivered (or swallowed)
        duration = loop.time() - started

        if held.interrupted == TASK_CANCELLED:
            self._log.info("task cancelled: handler cancelled, nothing reported", **held.fields)
            return
        if held.interrupted in RECORD_NOTHING:
            self._log.warning(
                "lease lost: handler cancelled, outcome not recorded",
                reason=held.interrupted,
                **held.fields,
            )
            return
        if held.interrupted == SHUTDOWN and exc is not None:
            self._leases.release(held)
            await self._hand_back(held)
            return
        self._meters.kind(held.claim.task.kind).duration.observe(duration)
        if exc is None:
            held.duration = duration
            self._completions.add(held)
            return
        self._leases.release(held)  # no renewal while the failure is recorded (as a report)
        if isinstance(exc, asyncio.CancelledError):
            exc = asyncio.CancelledError("handler cancelled")
        await self._fail(held, exc, duration)

    def _lease_lost(self, held: Held, reason: str) -> None:
        """The lease renewal says ``held``'s lease is not ours (any more), or its task was
        cancelled (``TASK_CANCELLED``): stop the handler, record nothing."""
        cancelled = reason == TASK_CANCELLED
        if held.phase is Phase.WAITING:
            # the success is dropped from the batch (it would be refused: STALE)
            held.interrupted = TASK_CANCELLED if cancelled else LEASE_LOST
            if cancelled:
                self._log.info("task cancelled: success not recorded", **held.fields)
            else:
                self._log.warning("lease lost: success not recorded", **held.fields)
            return
        if cancelled:
            self._log.info("task cancelled: cancelling the handler", **held.fields)
        else:
            self._log.warning("lease lost: cancelling the handler", reason=reason, **held.fields)
        held.interrupt(reason)

    # -- reports -------------------------------------------------------------------------------

    async def _fail(self, held: Held, exc: BaseException, duration: float) -> None:
        """Record a handler failure (retried by policy unless permanent) and log it, its text
        (:func:`_error_text`) made storable (``domain.payload.storable_text``, at most
        ``MAX_ERROR_CHARS``) for both."""
        kind = held.claim.task.kind
        permanent = isinstance(exc, PermanentError)
        error = storable_text(_error_text(exc), max_chars=MAX_ERROR_CHARS)
        result = await self._report_failure(held, error, permanent=permanent)
        if result is not None and result.outcome is ReportOutcome.RECORDED:
            self._metrics.tasks_failed.labels(kind=kind).inc()
            if result.retried:
                self._metrics.tasks_retried.labels(kind=kind).inc()
        details: dict[str, Any] = {}
        if not isinstance(exc, HandlerTimeout | PermanentError | asyncio.CancelledError):
            details["exc_info"] = exc  # an unexpected error: keep its traceback in the log
        self._log.warning(
            "task failed",
            **held.fields,
            error=error,
            permanent=permanent,
            will_retry=result is not None and result.retried,
            duration=round(duration, 6),
            outcome=None if result is None else result.outcome,
            **details,
        )

    async def _unknown_kind(self, held: Held) -> None:
        """Fail a task nobody here can run, permanently (spec §6 Unknown kind)."""
        self._metrics.unknown_kind.inc()
        error = f"unknown kind {held.claim.task.kind!r}: no handler registered"
        self._log.error(
            "unknown kind: task failed permanently",
            **held.fields,
            registered=sorted(self._handlers),
        )
        await self._report_failure(held, error, permanent=True)

    async def _report_failure(
        self, held: Held, error: str, *, permanent: bool
    ) -> FailOutcome | None:
        result, _ = await report(
            lambda: self._execution.fail(
                held.claim, error, permanent=permanent, progress=held.final_progress()
            ),
            what="failure",
            claims=[held.claim],
            log=self._log,
        )
        if result is not None and result.outcome is ReportOutcome.STALE:
            self._stale("failure", held)
        return result

    async def _hand_back(self, held: Held) -> None:
        """Give the task back at once instead of waiting for reclaim (spec §6 shutdown)."""
        outcome, _ = await report(
            lambda: self._execution.hand_back(
                held.claim, HAND_BACK_REASON, progress=held.final_progress()
            ),
            what="hand-back",
            claims=[held.claim],
            log=self._log,
        )
        if outcome is ReportOutcome.RECORDED:
            self.handed_back += 1
        elif outcome is ReportOutcome.STALE:
            self._stale("hand-back", held)
        self._log.info("task handed back", **held.fields, outcome=outcome)

    async def _hand_back_claims(self, claims: Sequence[Claim]) -> None:
        """Hand back claims that never got a task (the fetch loop was cancelled)."""
        for claim in claims:
            await self._hand_back(Held(claim, phase=Phase.SETTLING))

    def _stale(self, what: str, held: Held) -> None:
        self._log.warning("outcome refused: the run is no longer live", report=what, **held.fields)

    # -- worker registry -------------------------------------------------------------------------

    async def _registry_loop(self) -> None:
        """Upsert the ``workers`` row every ``registry_every`` s; errors are logged."""
        hostname = socket.gethostname()
        # what the worker serves (explain, submit warnings, the reconciler's unpolled check):
        # the kinds it registered and the tiers it polls, always written
        metadata: dict[str, Any] = {
            "kinds": sorted(self._handlers),
            "priorities": list(self._config.priorities),
            "concurrency": self._config.concurrency,
            "pid": os.getpid(),
        }
        while True:
            try:
                await self._registry.heartbeat(self._config.worker_id, hostname, metadata)
            except Exception as exc:
                self._log.warning("worker registry heartbeat failed", error=str(exc))
            await asyncio.sleep(self._config.registry_every)

    async def _unregister(self) -> None:
        """Remove the ``workers`` row at the end of a shutdown, so the worker stops counting as
        live at once (``GET /v1/workers``, explain, submit warnings); bounded by
        ``_UNREGISTER_WAIT``, and a failure is a warning only (the row then ages out)."""
        try:
            async with asyncio.timeout(_UNREGISTER_WAIT):
                await self._registry.remove(self._config.worker_id)
        except Exception as exc:
            self._log.warning("worker registry row not removed", error=str(exc) or repr(exc))


def _error_text(exc: BaseException) -> str:
    """A handler failure's text: ``Type: message`` (a timeout's message alone); a message its
    ``__str__`` cannot make reads ``<str() failed: Error: ...>`` instead of failing the report."""
    try:
        message = str(exc)
    except Exception as failed:
        message = f"<str() failed: {type(failed).__name__}: {_plain(failed)}>"
    return message if isinstance(exc, HandlerTimeout) else f"{type(exc).__name__}: {message}"


def _plain(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "?"
