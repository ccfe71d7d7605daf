"""Executing claimed tasks: handler call, timeout, lease heartbeat, outcomes (spec §5, §6).

:class:`TaskRunner` is internal to the worker runtime; the policy it implements is described in
:mod:`dtq.entrypoints.runtime`. The hot path of one task is deliberately short: one asyncio
task runs the handler and, on success, appends the claim to the completion batch; one loop
commits those batches (``ExecutionService.complete_many``) and one loop extends the leases of
every claim this worker holds. Nothing is bound or logged per success above DEBUG.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from prometheus_client import Counter, Histogram
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
_REPORT_ATTEMPTS = 5  # tries to record one outcome (or batch) before leaving it to reclaim
_BEATS_AT_ONCE = 32  # lease extensions in flight together during one heartbeat pass

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


class _Phase(enum.Enum):
    """Where a held claim is; decides what an interruption or a lost lease does to it."""

    STARTING = "starting"  # claimed; its asyncio task has not begun: interrupting marks it
    RUNNING = "running"  # the handler runs: interrupting cancels it
    WAITING = "waiting"  # succeeded, queued for the next completion batch
    COMMITTING = "committing"  # in a complete_many call now: that call decides
    SETTLING = "settling"  # failure / hand-back being recorded, or nothing to do


@dataclass(eq=False, slots=True)
class _Held:
    """A claim this worker holds: its handler runs or its success awaits a commit."""

    claim: Claim
    phase: _Phase = _Phase.STARTING
    task: asyncio.Task[None] | None = None  # the asyncio task running the handler
    interrupted: str | None = None  # _LEASE_LOST or _SHUTDOWN once the runtime stopped it
    duration: float = 0.0  # handler wall time, seconds

    def interrupt(self, why: str) -> None:
        """Stop the handler (the first reason wins); no-op once it has finished.

        A task cancelled before its first step never runs its body, so a claim whose task has
        not begun is only marked: it checks the mark before calling the handler.
        """
        if self.phase not in _INTERRUPTIBLE or self.interrupted is not None:
            return
        self.interrupted = why
        if self.phase is _Phase.RUNNING and self.task is not None:
            self.task.cancel()


_INTERRUPTIBLE = frozenset({_Phase.STARTING, _Phase.RUNNING})


@dataclass(frozen=True, slots=True)
class _KindMetrics:
    """The labelled children of one kind, looked up once instead of per task."""

    claimed: Counter
    succeeded: Counter
    duration: Histogram
    extensions: Counter


def task_fields(claim: Claim) -> dict[str, Any]:
    """The log fields that identify a task's run: task_id, job_id, kind, attempt, run_id."""
    return {
        "task_id": str(claim.task.id),
        "job_id": str(claim.task.job_id),
        "kind": claim.task.kind,
        "attempt": claim.run.attempt_number,
        "run_id": str(claim.run.id),
    }


class TaskRunner:
    """Runs claimed tasks for the fetch loop of one runtime session.

    Start :meth:`completion_loop` and :meth:`heartbeat_loop` as tasks, then hand every claim to
    :meth:`start`. :attr:`active` counts claims whose handler (or failure report) is still
    going; :attr:`backlog` counts successes waiting for a commit; :attr:`capacity` is set
    whenever either goes down. :attr:`transaction_turn` serializes the hot-path transactions
    (batch ``claim_many`` in the fetch loop, ``complete_many`` here).

    Args:
        handlers: kind -> handler, fixed for the session.
        options: runtime options (timeout, thread pool size, complete_batch).
        execution: the service that records outcomes and extends leases.
        metrics: where to count (spec §9 worker metrics).
        heartbeat_every: lease heartbeat period in seconds.
        log: the worker's logger (worker_id bound).
    """

    def __init__(
        self,
        *,
        handlers: Mapping[str, Handler],
        options: Options,
        execution: ExecutionService,
        metrics: WorkerMetrics,
        heartbeat_every: float,
        log: FilteringBoundLogger,
    ) -> None:
        self._handlers = dict(handlers)
        self._async = {kind: _is_async(h) for kind, h in self._handlers.items()}
        self._options = options
        self._execution = execution
        self._metrics = metrics
        self._heartbeat_every = heartbeat_every
        self._log = log
        self._debug = log.is_enabled_for(logging.DEBUG)
        self._pool = ThreadPoolExecutor(options.sync_threads, thread_name_prefix="dtq-handler")
        self._by_kind: dict[str, _KindMetrics] = {}
        self._held: set[_Held] = set()  # the claims whose leases the heartbeat keeps alive
        self._tasks: set[asyncio.Task[None]] = set()  # one per claim, until it settles
        self._waiting: deque[_Held] = deque()  # successes not yet in a complete_many call
        self._wake = asyncio.Event()  # set: the completion loop has work
        self._idle = asyncio.Event()  # set: no success waits for or is in a commit
        self._idle.set()
        self._abandoning = False
        self.capacity = asyncio.Event()
        #: Taken around every ``complete_many`` and every ``claim_many`` of more than one id:
        #: under load the hot path keeps one store transaction in flight per worker, claims and
        #: completions taking turns (FIFO). A lone id is claimed at once (``Session._claim``).
        self.transaction_turn = asyncio.Lock()
        self.handed_back = 0

    @property
    def active(self) -> int:
        """Claims whose handler runs or whose failure / hand-back is being recorded."""
        return len(self._tasks)

    @property
    def backlog(self) -> int:
        """Successes waiting for the next completion batch."""
        return len(self._waiting)

    # -- starting and stopping -----------------------------------------------------------------

    def start(self, claim: Claim) -> None:
        """Run the claim's handler in its own asyncio task (or hand it back when shutting
        down, or fail it permanently when its kind has no handler)."""
        held = _Held(claim)
        handler = self._handlers.get(claim.task.kind)
        if handler is not None:
            self._kind(claim.task.kind).claimed.inc()
            if not self._abandoning:
                self._held.add(held)
        task = asyncio.create_task(self._run(held, handler))
        held.task = task
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def abandon(self) -> None:
        """Shutdown: cancel every running handler and hand its task back; later claims too.

        Successes already waiting for a commit are still committed.
        """
        self._abandoning = True
        for held in list(self._held):
            held.interrupt(_SHUTDOWN)

    async def wait_settled(self) -> None:
        """Return once every claim task has ended and every success is committed (or given
        up)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._idle.wait()

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Cancel the claim tasks still going; return them (to be awaited)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks

    def close(self) -> None:
        """Release the thread pool without waiting for sync handlers still running."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.capacity.set()
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self._log.error("task runner error", exc_info=exc)

    # -- one claim -----------------------------------------------------------------------------

    async def _run(self, held: _Held, handler: Handler | None) -> None:
        if handler is None:  # counted by unknown_kind only: a submitted kind is an unbounded label
            held.phase = _Phase.SETTLING
            await self._unknown_kind(held.claim)
            return
        if held.interrupted == _LEASE_LOST:  # lost before it began: record nothing
            held.phase = _Phase.SETTLING
            self._held.discard(held)
            self._log.warning("lease lost: handler not started", **task_fields(held.claim))
            return
        if self._abandoning:  # claimed while shutting down: hand it straight back
            held.phase = _Phase.SETTLING
            self._held.discard(held)
            await self._hand_back(held)
            return
        try:
            await self._execute(held, handler)
        finally:
            if held.phase is not _Phase.WAITING:
                self._held.discard(held)

    async def _execute(self, held: _Held, handler: Handler) -> None:
        """Run the handler under its timeout; route the result (spec §6 Success / Failure)."""
        claim = held.claim
        kind = claim.task.kind
        if self._debug:
            self._log.debug("task started", **task_fields(claim))
        loop = asyncio.get_running_loop()
        started = loop.time()
        current = asyncio.current_task()
        exc: BaseException | None = None
        held.phase = _Phase.RUNNING
        try:
            await self._invoke(handler, claim)
        except asyncio.CancelledError as cancelled:
            ours = 0 if held.interrupted is None else 1  # cancel requests we made ourselves
            if current is not None and current.cancelling() > ours:
                raise  # the session is cancelling this task: not a handler outcome
            exc = cancelled  # interrupted by us, or raised by the handler itself
        except Exception as error:
            exc = error
        held.phase = _Phase.SETTLING  # from here on nothing cancels this task
        if held.interrupted is not None and current is not None and current.cancelling():
            current.uncancel()  # our own interruption was delivered (or swallowed)
        duration = loop.time() - started

        if held.interrupted == _LEASE_LOST:
            self._log.warning(
                "lease lost: handler cancelled, outcome not recorded", **task_fields(claim)
            )
            return
        if held.interrupted == _SHUTDOWN and exc is not None:
            self._held.discard(held)
            await self._hand_back(held)
            return
        self._kind(kind).duration.observe(duration)
        if exc is None:
            held.phase = _Phase.WAITING
            held.duration = duration
            self._waiting.append(held)
            self._idle.clear()
            self._wake.set()
            return
        self._held.discard(held)  # no heartbeat while the failure is recorded (as a report)
        if isinstance(exc, asyncio.CancelledError):
            exc = asyncio.CancelledError("handler cancelled")
        await self._fail(claim, exc, duration)

    async def _fail(self, claim: Claim, exc: BaseException, duration: float) -> None:
        """Record a handler failure (retried by policy unless permanent)."""
        kind = claim.task.kind
        permanent = isinstance(exc, PermanentError)
        error = str(exc) if isinstance(exc, HandlerTimeout) else f"{type(exc).__name__}: {exc}"
        fields = task_fields(claim)
        outcome = await self._report(
            fields, "failure", lambda: self._execution.fail(claim, error, permanent=permanent)
        )
        retried = not permanent and claim.run.attempt_number < claim.task.max_attempts
        if outcome is ReportOutcome.RECORDED:
            self._metrics.tasks_failed.labels(kind=kind).inc()
            if retried:
                self._metrics.tasks_retried.labels(kind=kind).inc()
        details: dict[str, Any] = {}
        if not isinstance(exc, HandlerTimeout | PermanentError | asyncio.CancelledError):
            details["exc_info"] = exc  # an unexpected error: keep its traceback in the log
        self._log.warning(
            "task failed",
            **fields,
            error=error,
            permanent=permanent,
            will_retry=retried,
            duration=round(duration, 6),
            outcome=outcome,
            **details,
        )

    async def _unknown_kind(self, claim: Claim) -> None:
        """Fail a task nobody here can run, permanently (spec §6 Unknown kind)."""
        self._metrics.unknown_kind.inc()
        error = f"unknown kind {claim.task.kind!r}: no handler registered"
        fields = task_fields(claim)
        self._log.error(
            "unknown kind: task failed permanently", **fields, registered=sorted(self._handlers)
        )
        await self._report(
            fields, "failure", lambda: self._execution.fail(claim, error, permanent=True)
        )

    async def _hand_back(self, held: _Held) -> None:
        """Give the task back at once instead of waiting for reclaim (spec §6 shutdown)."""
        fields = task_fields(held.claim)
        outcome = await self._report(
            fields,
            "hand-back",
            lambda: self._execution.hand_back(held.claim, HAND_BACK_REASON),
        )
        if outcome is ReportOutcome.RECORDED:
            self.handed_back += 1
        self._log.info("task handed back", **fields, outcome=outcome)

    async def _invoke(self, handler: Handler, claim: Claim) -> None:
        """Call the handler under the task's log context and ``default_timeout``.

        The context variables are set in this claim's own asyncio task (whose context is a
        copy), so they need no reset and never leak into the fetch loop.

        Raises:
            HandlerTimeout: the deadline passed (the handler was cancelled or abandoned).
        """
        task = Task(
            id=claim.task.id,
            job_id=claim.task.job_id,
            kind=claim.task.kind,
            payload=claim.task.payload,
            attempt=claim.run.attempt_number,
        )
        structlog.contextvars.bind_contextvars(
            task_id=str(task.id), job_id=str(task.job_id), kind=task.kind, attempt=task.attempt
        )
        timeout = self._options.default_timeout
        if timeout is None:
            await self._call(handler, task)
            return
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

    # -- completions -----------------------------------------------------------------------------

    async def completion_loop(self) -> None:
        """Commit waiting successes in batches of at most ``complete_batch``, one batch as soon
        as the previous commit returned (while one is in flight, the next accumulates)."""
        limit = self._options.complete_batch
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                batch: list[_Held] = []
                while self._waiting and len(batch) < limit:
                    held = self._waiting.popleft()
                    if held.interrupted == _LEASE_LOST:
                        continue  # the heartbeat found it taken over: record nothing
                    held.phase = _Phase.COMMITTING
                    batch.append(held)
                self.capacity.set()
                if batch:
                    await self._commit(batch)
            self._idle.set()

    async def _commit(self, batch: Sequence[_Held]) -> None:
        """One ``complete_many`` for the batch, retried on backend errors; then settle each."""
        try:
            outcomes, attempts = await self._complete_many([held.claim for held in batch])
        except Exception:  # a bug: never let it end the completion loop
            self._log.exception("recording successes failed", tasks=len(batch))
            outcomes, attempts = None, 0
        finally:
            for held in batch:  # the heartbeat stops: committed, or the lease lapses
                held.phase = _Phase.SETTLING
                self._held.discard(held)
        if outcomes is None:
            for held in batch:
                self._log.error(
                    "outcome not recorded; the task will be reclaimed",
                    report="success",
                    **task_fields(held.claim),
                )
            return
        for held, outcome in zip(batch, outcomes, strict=True):
            claim = held.claim
            # A retry of a batch whose first commit did land answers DUPLICATE for our run.
            if outcome is ReportOutcome.RECORDED or (
                attempts > 1 and outcome is ReportOutcome.DUPLICATE
            ):
                self._kind(claim.task.kind).succeeded.inc()
            elif outcome is ReportOutcome.STALE:
                self._log.warning(
                    "outcome refused: the run is no longer live",
                    report="success",
                    **task_fields(claim),
                )
            if self._debug:
                self._log.debug(
                    "task succeeded",
                    **task_fields(claim),
                    duration=round(held.duration, 6),
                    outcome=outcome,
                )

    async def _complete_many(self, claims: list[Claim]) -> tuple[list[ReportOutcome] | None, int]:
        """``complete_many`` with bounded retries of backend errors.

        Returns:
            The outcomes (None when they could not be recorded) and how many calls were made.
        """
        for attempt in range(1, _REPORT_ATTEMPTS + 1):
            try:
                async with self.transaction_turn:
                    return await self._execution.complete_many(claims), attempt
            except BackendUnavailable as exc:
                if attempt == _REPORT_ATTEMPTS:
                    return None, attempt
                self._log.warning(
                    "recording outcomes failed; retrying",
                    report="success",
                    tasks=len(claims),
                    error=str(exc),
                )
                await asyncio.sleep(backoff_delay(attempt))
            except DtqError as exc:
                self._log.error(
                    "outcome refused",
                    report="success",
                    tasks=len(claims),
                    error=f"{type(exc).__name__}: {exc}",
                )
                return None, attempt
        return None, _REPORT_ATTEMPTS  # pragma: no cover - the loop always returns

    # -- lease heartbeat -------------------------------------------------------------------------

    async def heartbeat_loop(self) -> None:
        """Every ``heartbeat_every`` s, extend the lease of every held claim (spec §6 Lease).

        A claim is held from its claim until its success is committed, its failure is being
        recorded, or its lease is lost. A LOST lease cancels a running handler (and only that
        one) or drops a waiting success; nothing is recorded for it.
        """
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self._heartbeat_every
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if loop.time() - next_at > self._heartbeat_every:
                next_at = loop.time()  # a pass overran a period: do not burst to catch up
            await self._beat_all()

    async def _beat_all(self) -> None:
        held = list(self._held)
        failed = 0
        last: BaseException | None = None
        for i in range(0, len(held), _BEATS_AT_ONCE):
            chunk = held[i : i + _BEATS_AT_ONCE]
            states = await asyncio.gather(
                *(self._execution.heartbeat(h.claim) for h in chunk), return_exceptions=True
            )
            for h, state in zip(chunk, states, strict=True):
                if isinstance(state, BaseException):
                    failed += 1
                    last = state
                else:
                    self._beaten(h, state)
        if failed:
            self._log.warning(
                "lease heartbeat failed",
                failed=failed,
                held=len(held),
                error=f"{type(last).__name__}: {last}",
            )

    def _beaten(self, held: _Held, state: LeaseState) -> None:
        if held not in self._held:
            return  # settled while the heartbeat was in flight
        kind = held.claim.task.kind
        if state is LeaseState.EXTENDED:
            self._kind(kind).extensions.inc()
            return
        if state is not LeaseState.LOST:
            self._log.warning(
                "lease heartbeat found no lease", state=str(state), **task_fields(held.claim)
            )
            return
        if held.phase is _Phase.COMMITTING:
            return  # its complete_many is in flight: the fence there decides (STALE)
        self._metrics.lease_losses.labels(kind=kind).inc()
        self._held.discard(held)
        if held.phase in _INTERRUPTIBLE:
            self._log.warning("lease lost: cancelling the handler", **task_fields(held.claim))
            held.interrupt(_LEASE_LOST)
        else:  # WAITING: the success is dropped from the batch
            held.interrupted = _LEASE_LOST
            self._log.warning("lease lost: success not recorded", **task_fields(held.claim))

    # -- helpers -------------------------------------------------------------------------------

    def _kind(self, kind: str) -> _KindMetrics:
        found = self._by_kind.get(kind)
        if found is None:
            m = self._metrics
            found = _KindMetrics(
                claimed=m.tasks_claimed.labels(kind=kind),
                succeeded=m.tasks_succeeded.labels(kind=kind),
                duration=m.handler_duration.labels(kind=kind),
                extensions=m.lease_extensions.labels(kind=kind),
            )
            self._by_kind[kind] = found
        return found

    async def _report(
        self,
        fields: dict[str, Any],
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
                    self._log.error(
                        "outcome not recorded; the task will be reclaimed", report=what, **fields
                    )
                    return None
                delay = backoff_delay(attempt)
                self._log.warning(
                    "recording outcome failed; retrying", report=what, error=str(exc), **fields
                )
                await asyncio.sleep(delay)
            except DtqError as exc:
                self._log.error(
                    "outcome refused", report=what, error=f"{type(exc).__name__}: {exc}", **fields
                )
                return None
            else:
                if outcome is ReportOutcome.STALE:
                    self._log.warning(
                        "outcome refused: the run is no longer live", report=what, **fields
                    )
                return outcome
        return None  # pragma: no cover - the loop always returns


def _is_async(handler: Handler) -> bool:
    """True for ``async def`` functions (also behind ``functools.partial`` or ``__call__``)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - we look for an async __call__
    )
