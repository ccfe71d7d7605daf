"""Recording outcomes: the success batcher and the one retrying report helper (spec §6).

Successes are committed in batches of at most ``complete_batch`` by one loop, the next batch
as soon as the previous commit returns, so batches form only while a commit is in flight.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID

from structlog.typing import FilteringBoundLogger

from dtq.application.commands import Claim, ReportOutcome
from dtq.domain.errors import BackendUnavailable, DtqError
from dtq.entrypoints import tracing
from dtq.entrypoints.worker.claims import (
    LEASE_LOST,
    TASK_CANCELLED,
    Held,
    Phase,
    Shared,
    task_fields,
)

T = TypeVar("T")

REPORT_ATTEMPTS = 5  # tries to record one outcome (or batch) before leaving it to reclaim
_BACKOFF_START = 0.5  # seconds: first pause after a backend error
RESUME_CAP = 2.0  # seconds: longest pause between attempts (resume within 5 s of a restore)


def backoff_delay(failures: int) -> float:
    """Seconds to pause after ``failures`` consecutive backend errors (>= 1).

    Exponential from 0.5 s, capped at ``RESUME_CAP`` (2 s) whatever the outage's length, so a
    worker tries again at most 2 s after the backend returns; up to 20 % jitter below the base
    so that many workers do not hammer a recovering backend in lockstep.
    """
    base: float = min(RESUME_CAP, _BACKOFF_START * 2.0 ** max(failures - 1, 0))
    return base * random.uniform(0.8, 1.0)


async def report(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    claims: Sequence[Claim],
    log: FilteringBoundLogger,
    turn: asyncio.Lock | None = None,
    keep_trying: Callable[[], bool] | None = None,
) -> tuple[T | None, int]:
    """Record an outcome with ``call``, retrying ``BackendUnavailable`` (a replay is a no-op).

    Args:
        call: makes one attempt (``complete_many``, ``fail``, ``hand_back``).
        what: the report's name in log lines (``success``, ``failure``, ``hand-back``).
        claims: the claims concerned (one for a single report), named in log lines.
        log: where retries and give-ups are logged.
        turn: a lock held around each attempt (the hot-path transaction turn), or None.
        keep_trying: asked after each failed attempt from the ``REPORT_ATTEMPTS``-th on; while
            it answers True the retries go on (pauses capped at ``RESUME_CAP``). None: stop
            after ``REPORT_ATTEMPTS`` tries.

    Returns:
        The call's result (None when it was refused or still failed when the tries ran out:
        the lease then lapses and the reconciler reclaims the task, so the work is redone) and
        how many attempts were made.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            if turn is None:
                return await call(), attempt
            async with turn:
                return await call(), attempt
        except BackendUnavailable as exc:
            if attempt >= REPORT_ATTEMPTS and (keep_trying is None or not keep_trying()):
                break
            about = _about(claims)
            log.warning("recording outcome failed; retrying", report=what, error=str(exc), **about)
            await asyncio.sleep(backoff_delay(attempt))
        except DtqError as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.error("outcome refused", report=what, error=error, **_about(claims))
            return None, attempt
    for claim in claims:
        log.error(
            "outcome not recorded; the task will be reclaimed", report=what, **task_fields(claim)
        )
    return None, attempt


def _about(claims: Sequence[Claim]) -> Mapping[str, Any]:
    """Log fields naming the claims of a report: the task's, or how many tasks."""
    return task_fields(claims[0]) if len(claims) == 1 else {"tasks": len(claims)}


class Completions:
    """The success batcher. Feed it with :meth:`add`; run :meth:`loop` as a task.

    Args:
        shared: ``execution.complete_many`` records the batches, of at most
            ``config.complete_batch`` successes.
        turn: the hot-path transaction turn, taken around every ``complete_many``.
        settled: called with each claim once its batch returned (committed or given up).
    """

    def __init__(
        self, shared: Shared, *, turn: asyncio.Lock, settled: Callable[[Held], None]
    ) -> None:
        self._shared = shared
        self._turn = turn
        self._limit = shared.config.complete_batch
        self._settled = settled
        self._log = shared.log
        self._debug = shared.log.is_enabled_for(logging.DEBUG)
        self._waiting: deque[Held] = deque()
        self._wake = asyncio.Event()  # set: the loop has work
        self._idle = asyncio.Event()  # set: no success waits for or is in a commit
        self._idle.set()
        #: Set while fewer than ``limit`` successes wait: the fetch loop claims only then.
        self.room = asyncio.Event()
        self.room.set()
        #: Set after each commit returned (its slots released); cleared by a waiter first.
        self.committed = asyncio.Event()
        self._stopping = False  # shutdown: a failing commit gets the bounded tries only

    def stop_retrying(self) -> None:
        """Shutdown: from now on a failing commit is given up after ``REPORT_ATTEMPTS`` tries
        (before, it is retried for as long as some claim of its batch keeps its lease)."""
        self._stopping = True

    def add(self, held: Held) -> None:
        """Queue a handler success for the next batch."""
        held.phase = Phase.WAITING
        self._waiting.append(held)
        self._idle.clear()
        self._wake.set()
        if len(self._waiting) >= self._limit:
            self.room.clear()

    async def wait_idle(self) -> None:
        """Return once no success waits for or is in a commit."""
        await self._idle.wait()

    async def loop(self) -> None:
        """Commit waiting successes, one batch as soon as the previous commit returned."""
        limit = self._limit
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                batch: list[Held] = []
                while self._waiting and len(batch) < limit:
                    held = self._waiting.popleft()
                    if held.interrupted in (LEASE_LOST, TASK_CANCELLED):
                        continue  # taken over, or cancelled, meanwhile: record nothing
                    held.phase = Phase.COMMITTING
                    batch.append(held)
                self.room.set()
                if batch:
                    await self._commit(batch)
            self._idle.set()

    async def _commit(self, batch: Sequence[Held]) -> None:
        """One ``complete_many`` for the batch (retried by :func:`report`); settle each."""
        claims = [held.claim for held in batch]
        results = [held.result for held in batch]
        progress: dict[UUID, Any] = {}
        for held in batch:
            progress.update(held.final_progress() or {})
        started = tracing.clock()  # None while tracing is off
        try:
            outcomes, attempts = await report(
                lambda: self._shared.execution.complete_many(
                    claims, results, progress=progress or None
                ),
                what="success",
                claims=claims,
                log=self._log,
                turn=self._turn,
                # A finished success is not dropped while the worker runs and the lease renewal
                # has not found a lease of the batch lost (it marks a committing claim).
                keep_trying=lambda: (
                    not self._stopping and any(held.interrupted is None for held in batch)
                ),
            )
        except Exception:  # a bug: never let it end the completion loop
            self._log.exception("recording successes failed", tasks=len(batch))
            outcomes, attempts = None, 0
        finally:
            for held in batch:  # the lease renewal stops: committed, or the lease lapses
                held.phase = Phase.SETTLING
                self._settled(held)
            self.committed.set()
        if started is not None:
            _complete_spans(batch, outcomes, started)
        if outcomes is None:
            return
        replayed = attempts > 1
        meters, debug = self._shared.meters, self._debug
        for held, outcome in zip(batch, outcomes, strict=True):
            # A retry of a batch whose first commit did land answers DUPLICATE for our run.
            if outcome is ReportOutcome.RECORDED or (
                replayed and outcome is ReportOutcome.DUPLICATE
            ):
                meters.kind(held.claim.task.kind).succeeded.inc()
            elif outcome is ReportOutcome.STALE:
                self._log.warning(
                    "outcome refused: the run is no longer live", report="success", **held.fields
                )
            if debug:
                self._log.debug(
                    "task succeeded",
                    **held.fields,
                    duration=round(held.duration, 6),
                    outcome=outcome,
                )


def _complete_spans(
    batch: Sequence[Held], outcomes: Sequence[ReportOutcome] | None, started: int
) -> None:
    """One ``complete`` span per success of a committed (or given-up) batch (issue 16)."""
    for i, held in enumerate(batch):
        outcome = None if outcomes is None else str(outcomes[i])
        tracing.complete_span(held.trace, start_ns=started, outcome=outcome)
