"""The fetch loop: slots, the transaction turn, pop and claim (spec §5 claim flow).

It is the only place that starts claims, so the free slots it computes cannot shrink while it
pops and claims. Once a claim has committed the worker owns it: every committed claim is
delivered (run, or handed back when stopping), even when Redis fails after the commit, when
the commit's outcome must be recovered, or when the loop is cancelled meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from uuid import UUID

from dtq.application.commands import Claim
from dtq.application.execution import ClaimsUnresolved
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints import tracing
from dtq.entrypoints.worker.backend import ReadyLists
from dtq.entrypoints.worker.claims import Shared
from dtq.entrypoints.worker.completions import REPORT_ATTEMPTS, backoff_delay

T = TypeVar("T")

#: The adaptive claim batch (``Options.claim_batch`` None): where it starts and restarts, and
#: how far doubling takes it.
ADAPTIVE_CLAIM_MIN = 32
ADAPTIVE_CLAIM_MAX = 256
#: Shortest bound (seconds) of the fetch loop's wait for a commit of its own successes.
COALESCE_MIN_WAIT = 0.005
#: Shortest bound (seconds) of a batch claim's wait for the transaction turn.
TURN_WAIT_MIN = 0.05


class ClaimBatch:
    """How many ids the next pop asks for.

    Fixed at ``size`` when one is given; else adaptive: ``ADAPTIVE_CLAIM_MIN`` at first,
    doubled (up to ``ADAPTIVE_CLAIM_MAX``) after each pop that brought every id it asked for at
    the full size (so the ready lists likely hold more), back to the minimum after a pop that
    brought fewer (the backlog is drained; an idle task is popped alone anyway).
    """

    def __init__(self, size: int | None) -> None:
        self._fixed = size
        self.size = size if size is not None else ADAPTIVE_CLAIM_MIN

    def ask(self, free: int) -> int:
        """The count to pop with ``free`` slots free."""
        return min(free, self.size)

    def popped(self, asked: int, got: int) -> None:
        """Record a pop that asked for ``asked`` ids and brought ``got``."""
        if self._fixed is not None:
            return
        if got < asked:
            self.size = ADAPTIVE_CLAIM_MIN
        elif asked == self.size:
            self.size = min(self.size * 2, ADAPTIVE_CLAIM_MAX)


class Slots:
    """How many handlers may start; the fetch loop takes, finished claims give back."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        """Slots free now."""
        return self._free

    def take(self, count: int) -> None:
        """Occupy ``count`` slots (the fetch loop, for the claims it starts)."""
        self._free -= count

    def release(self) -> None:
        """Free one slot (a claim settled)."""
        self._free += 1
        self._freed.set()

    def wake(self) -> None:
        """Wake a waiter without freeing a slot (the loop is stopping)."""
        self._freed.set()

    async def wait(self) -> None:
        """Wait until a slot is released (or :meth:`wake`)."""
        self._freed.clear()
        await self._freed.wait()


class Fetcher:
    """Pops ids into free slots, claims them, hands each claim to ``deliver``.

    Args:
        shared: the configuration (priorities, batches, poll timeout, worker id), the
            execution service (claim, recover, put back), metrics and log.
        queue: the ready lists.
        turn: the hot-path transaction turn (taken around a batch claim when it comes free
            within a bound; see :meth:`_take_turn`).
        room: set while completions can take more successes (backpressure).
        committed: set by the success batcher after each commit (``Completions.committed``):
            after a full pop, the next one may wait for one such commit when fewer slots than a
            batch are free (see :meth:`loop`); None never waits.
        deliver: starts one committed claim (runs it, or hands it back when stopping), with
            the parent of its handler span (``tracing.claim_span``; None while tracing is off).
        hand_back: hands claims back at once (used when this loop is cancelled).
        kinds: the kinds this worker has handlers for: it pops their routed lists besides the
            tiers and routes the tasks of other kinds at claim (issue 15 item 2); None pops and
            claims every kind.
    """

    def __init__(
        self,
        shared: Shared,
        *,
        queue: ReadyLists,
        turn: asyncio.Lock,
        room: asyncio.Event,
        committed: asyncio.Event | None = None,
        deliver: Callable[[Claim, tracing.TraceHandle | None], None],
        hand_back: Callable[[Sequence[Claim]], Awaitable[None]],
        kinds: frozenset[str] | None = None,
    ) -> None:
        config = shared.config
        self._kinds = kinds
        self._config, self._execution, self._log = config, shared.execution, shared.log
        self._refusals = shared.meters.metrics.claim_refusals
        self._queue, self._turn, self._room = queue, turn, room
        self._deliver, self._hand_back = deliver, hand_back
        self._committed = committed
        self.slots = Slots(config.concurrency)
        self.batch = ClaimBatch(config.claim_batch)
        self._coalesce = False  # the last pop was full: the next may wait for one commit
        self._claim_took = 0.0  # seconds the last batch claim took
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Pop no more work (a pop in flight finishes; what it brings is put back)."""
        self._stopping.set()
        self.slots.wake()

    async def loop(self) -> None:
        """Pop, claim and deliver until stopped; errors back off, never end the loop.

        While the ready lists have a backlog (the last pop brought all it asked for), a pop
        that would ask for fewer ids than a batch first waits for the next commit of this
        worker's own successes, once, for at most twice the last claim transaction's time
        (``COALESCE_MIN_WAIT`` at least): short handlers free their slots within it, long
        ones cost that much idle time once per pop. Otherwise two half batches, one being
        claimed while the other completes, stay staggered for the whole backlog: twice the
        claim transactions, and on PostgreSQL twice the key ranges where two workers'
        transactions meet and abort each other (benchmarks/PROFILE.md, fifth pass).
        """
        config, slots = self._config, self.slots
        failures = 0
        while not self._stopping.is_set():
            free = slots.free
            if free <= 0:
                await slots.wait()
                continue
            if not self._room.is_set():
                await wait_any(self._room, self._stopping)
                continue
            committed = self._committed
            if self._coalesce and committed is not None and free < self.batch.size:
                # at most one wait per pop, bounded by about two claim transactions' time
                self._coalesce = False
                committed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(COALESCE_MIN_WAIT, 2 * self._claim_took)):
                        await wait_any(committed, self._stopping)
                continue
            try:
                asked = self.batch.ask(free)
                task_ids = await self._queue.pop_many(
                    config.priorities,
                    timeout=config.poll_timeout,
                    max_count=asked,
                    kinds=self._kinds,
                )
                self.batch.popped(asked, len(task_ids))
                self._coalesce = len(task_ids) == asked
                if task_ids and self._stopping.is_set():
                    # popped by a wait that began before the stop: give them to another worker
                    # unclaimed, rather than claim them only to hand them back (dead runs).
                    await self._put_back(task_ids)
                elif task_ids:
                    await self._claim(task_ids)
                failures = 0
            except BackendUnavailable as exc:
                failures += 1
                delay = backoff_delay(failures)
                self._log.warning("backend unavailable", error=str(exc), retry_in=delay)
                await self._pause(delay)
            except Exception:
                failures += 1
                delay = backoff_delay(failures)
                self._log.exception("worker loop error", retry_in=delay)
                await self._pause(delay)

    async def _claim(self, task_ids: Sequence[UUID]) -> None:
        """Claim popped ids in one transaction and deliver every committed claim.

        A batch takes its turn with the completions, waiting for it a bounded time
        (:meth:`_take_turn`); a lone id does not (nothing else was waiting, so it is on a
        task's submit-to-start latency). The claims are delivered from the claim's
        ``on_commit``, right after the commit, so the handlers start while the lease write is
        in flight. The claim, and the read-back of a claim whose commit outcome
        is unknown, run shielded: if this loop is cancelled meanwhile, they still finish (the
        read-back after a bounded number of tries), and claims not delivered by then are handed
        back (delivered ones are running and settle as usual).
        """
        started = tracing.clock()  # None while tracing is off
        delivered = False
        me = asyncio.current_task()

        def cancelled() -> bool:
            # from the moment a cancel of this loop is requested, before its except clause
            # runs (the session may be listing its tasks to cancel them in that iteration)
            return me is not None and me.cancelling() > 0

        def deliver(claims: list[Claim]) -> None:
            nonlocal delivered
            if cancelled():
                return  # handed back below instead
            delivered = True
            self._start(claims, started)

        claiming = asyncio.ensure_future(
            self._claim_or_recover(task_ids, deliver, stopping=cancelled)
        )
        try:
            claims = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            claims = await _outlive_cancels(claiming, default=[])
            if claims and not delivered:
                await _outlive_cancels(asyncio.ensure_future(self._hand_back(claims)), None)
            raise
        refused = len(task_ids) - len(claims)
        if refused:
            self._refused(task_ids, claims, refused)

    def _start(self, claims: Sequence[Claim], started: int | None) -> None:
        """Take a slot for each committed claim and deliver it (with its claim span)."""
        self.slots.take(len(claims))
        if started is None:
            for claim in claims:
                self._deliver(claim, None)
            return
        for claim in claims:
            self._deliver(claim, _claim_span(claim, started))

    async def _claim_or_recover(
        self,
        task_ids: Sequence[UUID],
        deliver: Callable[[list[Claim]], None],
        *,
        stopping: Callable[[], bool],
    ) -> list[Claim]:
        """The claim; if its commit outcome is unknown, the claims read back (outside the
        turn), handed to ``deliver`` as the claim's ``on_commit`` would have been. The read-back
        is retried until the store answers, or ``REPORT_ATTEMPTS`` times once ``stopping()``
        (then the reconciler reclaims whatever committed)."""
        try:
            return await self._claim_many(task_ids, deliver)
        except ClaimsUnresolved as unresolved:
            self._log.warning("claim outcome unknown; recovering", tasks=len(task_ids))
            claims = await self._recover(unresolved, give_up=stopping)
            deliver(claims)
            return claims

    async def _claim_many(
        self, task_ids: Sequence[UUID], deliver: Callable[[list[Claim]], None]
    ) -> list[Claim]:
        worker_id = self._config.worker_id
        kinds = self._kinds
        if len(task_ids) == 1:
            return await self._execution.claim_many(task_ids, worker_id, kinds, on_commit=deliver)
        took = await self._take_turn()
        started = time.monotonic()
        try:
            return await self._execution.claim_many(task_ids, worker_id, kinds, on_commit=deliver)
        finally:
            self._claim_took = time.monotonic() - started
            if took:
                self._turn.release()

    async def _take_turn(self) -> bool:
        """Take the transaction turn, waiting at most four times the last batch claim's
        duration (``TURN_WAIT_MIN`` at least).

        Returns:
            True when taken (release it after the claim); False when it was still held by
            then: the popped ids are claimed without it (ARCHITECTURE.md, "A batch claim waits
            for the turn a bounded time").
        """
        bound = max(TURN_WAIT_MIN, 4 * self._claim_took)
        try:
            async with asyncio.timeout(bound):
                await self._turn.acquire()
        except TimeoutError:
            return False
        return True

    async def _recover(
        self, unresolved: ClaimsUnresolved, *, give_up: Callable[[], bool]
    ) -> list[Claim]:
        """Read back an unresolved claim until the store answers (backing off meanwhile), or
        give up after ``REPORT_ATTEMPTS`` tries once ``give_up()`` says so (then the reconciler
        reclaims whatever committed)."""
        failures = 0
        while True:
            try:
                return await self._execution.recover_claims(
                    unresolved.run_ids, self._config.worker_id
                )
            except BackendUnavailable as exc:
                failures += 1
                if failures >= REPORT_ATTEMPTS and give_up():
                    self._log.error("claim outcome still unknown; left to reclaim", error=str(exc))
                    return []
                delay = backoff_delay(failures)
                self._log.warning("claim recovery failed", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)

    def _refused(self, task_ids: Sequence[UUID], claims: Sequence[Claim], refused: int) -> None:
        self._refusals.inc(refused)
        if self._log.is_enabled_for(logging.DEBUG):
            claimed = {claim.task.id for claim in claims}
            for task_id in task_ids:
                if task_id not in claimed:
                    self._log.debug("claim refused", task_id=str(task_id))

    async def _put_back(self, task_ids: Sequence[UUID]) -> None:
        """Return ids popped after the stop, unclaimed; one failure does not stop the rest."""
        for task_id in task_ids:
            try:
                await self._execution.put_back(task_id)
            except BackendUnavailable as exc:
                self._log.warning(
                    "put back failed; the reconciler re-pushes the task",
                    task_id=str(task_id),
                    error=str(exc),
                )

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the loop starts stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)


def _claim_span(claim: Claim, started: int) -> tracing.TraceHandle | None:
    """The ``claim`` span of one committed claim (issue 16 item 5)."""
    return tracing.claim_span(
        claim.trace_context,
        task_id=claim.task.id,
        job_id=claim.task.job_id,
        run_id=claim.run.id,
        kind=claim.task.kind,
        attempt=claim.run.attempt_number,
        start_ns=started,
    )


async def _outlive_cancels(job: asyncio.Future[T], default: T) -> T:
    """Wait for ``job`` however often the caller is cancelled; ``default`` if it raised."""
    while True:
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            if job.done() and job.cancelled():
                return default
        except Exception:
            return default


async def wait_any(*events: asyncio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
