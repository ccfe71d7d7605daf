"""One run of the worker runtime: the fetch loop, the registry heartbeat, shutdown.

:class:`Session` is internal; :class:`dtq.entrypoints.runtime.Runtime` builds one per ``run``.
The policy it implements (spec §5 claim flow, §6 semantics) is described in that module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from structlog.typing import FilteringBoundLogger

from dtq.domain.entities import DEFAULT_PRIORITY
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.runtime_task import TaskRunner, backoff_delay
from dtq.entrypoints.runtime_types import Handler, Options, WorkerServices

_FINAL_WAIT = 15.0  # seconds: bound on hand-backs and last commits after the grace period


class Session:
    """Everything one ``Runtime.run`` owns: the fetch loop, the registry loop, the task runner
    (with its completion and lease heartbeat loops).

    Args:
        handlers: kind -> handler, fixed for the session.
        options: runtime options.
        services: execution, registry, queue and settings.
        metrics: where to count (spec §9 worker metrics).
        log: the worker's logger.
    """

    def __init__(
        self,
        *,
        handlers: Mapping[str, Handler],
        options: Options,
        services: WorkerServices,
        metrics: WorkerMetrics,
        log: FilteringBoundLogger,
    ) -> None:
        settings = services.settings
        self._kinds = sorted(handlers)
        self._options = options
        self._execution = services.execution
        self._queue = services.queue
        self._registry = services.registry
        self._metrics = metrics
        self._worker_id = settings.worker_id
        self._registry_every = settings.worker_heartbeat_interval
        self.concurrency = options.concurrency or settings.worker_concurrency
        # The service's policy sets the lease TTL, so it is the lease duration that counts here.
        lease_duration = services.execution.policy.lease_duration
        self.heartbeat_every = min(options.heartbeat_every, lease_duration / 3)
        self._log = log.bind(worker_id=self._worker_id)
        self._stopping = asyncio.Event()  # set: the fetch loop pops no more work
        self._runner = TaskRunner(
            handlers=handlers,
            options=options,
            execution=services.execution,
            metrics=metrics,
            heartbeat_every=self.heartbeat_every,
            log=self._log,
        )

    @property
    def handed_back(self) -> int:
        """How many tasks this session handed back on shutdown."""
        return self._runner.handed_back

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, stop_now: asyncio.Event) -> None:
        """Work until ``stop`` (graceful) or ``stop_now`` (skip the grace), then shut down.

        Cancelling the caller also shuts down at once (handing running tasks back) and then
        re-raises ``CancelledError``.
        """
        runner = self._runner
        fetch = asyncio.create_task(self._fetch_loop(), name="dtq-worker-fetch")
        background = [
            asyncio.create_task(runner.completion_loop(), name="dtq-worker-completions"),
            asyncio.create_task(runner.heartbeat_loop(), name="dtq-worker-lease-heartbeat"),
            asyncio.create_task(self._registry_loop(), name="dtq-worker-registry"),
        ]
        try:
            await _wait_any(stop, stop_now)
            self._stop_fetching()
            if not stop_now.is_set():
                await self._grace(fetch, stop_now)
            await self._hand_back_all(fetch)
        except asyncio.CancelledError:
            self._stop_fetching()
            await self._hand_back_all(fetch)
            raise
        finally:
            tasks = [fetch, *background, *runner.cancel_all()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            runner.close()

    def _stop_fetching(self) -> None:
        self._stopping.set()
        self._runner.capacity.set()  # wake a fetch loop waiting for a free slot

    async def _settled(self, fetch: asyncio.Task[None]) -> None:
        """Return once the fetch loop has ended and every claim has settled."""
        await asyncio.wait({fetch})
        await self._runner.wait_settled()

    async def _grace(self, fetch: asyncio.Task[None], stop_now: asyncio.Event) -> None:
        """Let running handlers finish for up to ``shutdown_grace`` seconds or ``stop_now``."""
        if self._options.shutdown_grace <= 0:
            return
        all_done = asyncio.ensure_future(self._settled(fetch))
        now = asyncio.ensure_future(stop_now.wait())
        try:
            await asyncio.wait(
                {all_done, now},
                timeout=self._options.shutdown_grace,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            all_done.cancel()
            now.cancel()

    async def _hand_back_all(self, fetch: asyncio.Task[None]) -> None:
        """Cancel every running handler; wait (bounded) for the hand-backs and the commits of
        successes already waiting."""
        self._runner.abandon()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled(fetch), timeout=_FINAL_WAIT)

    # -- the fetch loop ------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        """Pop up to the free slots, claim them in one transaction, start their handlers;
        repeat until stopping. Errors back off, never end the loop.

        It is the only place that starts claims, so the free slots it computes cannot shrink
        while it pops and claims. It also waits while ``complete_batch`` successes are still
        waiting for a commit, so a slow store holds back claiming instead of piling up leases.
        """
        runner = self._runner
        priorities = self._options.priorities
        poll_timeout = self._options.poll_timeout
        claim_batch = self._options.claim_batch
        complete_batch = self._options.complete_batch
        failures = 0
        while not self._stopping.is_set():
            free = self.concurrency - runner.active
            if free <= 0 or runner.backlog >= complete_batch:
                runner.capacity.clear()
                await runner.capacity.wait()
                continue
            try:
                task_ids = await self._queue.pop_many(
                    priorities, timeout=poll_timeout, max_count=min(free, claim_batch)
                )
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
        """Claim popped ids in one transaction; start a handler task per claim.

        A batch takes its turn with the completions (one hot-path transaction at a time: under
        load that avoids most serialization conflicts between the two). A lone id does not: it
        means nothing else was waiting, so the claim is on a task's submit-to-start latency,
        and waiting behind a completion (and its conflict retries) cost an idle system about
        2.5 ms at the median and 15 ms at p99 (``benchmarks/PROFILE.md``). Correctness never
        depends on the turn; the store fences every write.
        """
        if len(task_ids) == 1:
            claims = await self._execution.claim_many(task_ids, self._worker_id)
        else:
            async with self._runner.transaction_turn:
                claims = await self._execution.claim_many(task_ids, self._worker_id)
        refused = len(task_ids) - len(claims)
        if refused:
            self._metrics.claim_refusals.inc(refused)
            if self._log.is_enabled_for(logging.DEBUG):
                claimed = {claim.task.id for claim in claims}
                for task_id in task_ids:
                    if task_id not in claimed:
                        self._log.debug("claim refused", task_id=str(task_id))
        for claim in claims:
            self._runner.start(claim)

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
        """Sleep ``seconds``, or less if the session starts stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    # -- worker registry -------------------------------------------------------------------------

    async def _registry_loop(self) -> None:
        """Upsert the ``workers`` row every ``worker_heartbeat_interval`` s; errors are logged."""
        hostname = socket.gethostname()
        metadata: dict[str, Any] = {
            "kinds": self._kinds,
            "concurrency": self.concurrency,
            "pid": os.getpid(),
        }
        if tuple(self._options.priorities) != (DEFAULT_PRIORITY,):
            # what the reconciler's unpolled check reads; absent means the default tier only
            metadata["priorities"] = list(self._options.priorities)
        while True:
            try:
                await self._registry.heartbeat(self._worker_id, hostname, metadata)
            except Exception as exc:
                self._log.warning("worker registry heartbeat failed", error=str(exc))
            await asyncio.sleep(self._registry_every)


async def _wait_any(*events: asyncio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
