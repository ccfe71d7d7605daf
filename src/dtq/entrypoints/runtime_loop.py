"""One run of the worker runtime: the poll loops, the registry heartbeat, shutdown.

:class:`Session` is internal; :class:`dtq.entrypoints.runtime.Runtime` builds one per ``run``.
The policy it implements (spec §5 claim flow, §6 semantics) is described in that module.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Mapping
from typing import Any

from structlog.typing import FilteringBoundLogger

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.runtime_task import TaskRunner, backoff_delay
from dtq.entrypoints.runtime_types import Handler, Options, WorkerServices

_FINAL_WAIT = 15.0  # seconds: bound on hand-backs after the grace period


class Session:
    """Everything one ``Runtime.run`` owns: the poll loops, the registry loop, the task runner.

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
        self._stopping = asyncio.Event()  # set: loops pop no more work
        self._runner = TaskRunner(
            handlers=handlers,
            options=options,
            execution=services.execution,
            metrics=metrics,
            heartbeat_every=self.heartbeat_every,
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
        slots = [
            asyncio.create_task(self._slot(), name=f"dtq-worker-loop-{i}")
            for i in range(self.concurrency)
        ]
        beat = asyncio.create_task(self._registry_loop(), name="dtq-worker-registry")
        try:
            await _wait_any(stop, stop_now)
            self._stopping.set()
            if not stop_now.is_set():
                await self._grace(slots, stop_now)
            await self._hand_back_all(slots)
        except asyncio.CancelledError:
            self._stopping.set()
            await self._hand_back_all(slots)
            raise
        finally:
            beat.cancel()
            for slot in slots:
                slot.cancel()
            await asyncio.gather(beat, *slots, return_exceptions=True)
            self._runner.close()

    async def _grace(self, slots: list[asyncio.Task[None]], stop_now: asyncio.Event) -> None:
        """Let running handlers finish for up to ``shutdown_grace`` seconds or ``stop_now``."""
        if self._options.shutdown_grace <= 0:
            return
        all_done = asyncio.ensure_future(asyncio.wait(slots))
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

    async def _hand_back_all(self, slots: list[asyncio.Task[None]]) -> None:
        """Cancel every running handler, wait (bounded) for the loops to hand tasks back."""
        self._runner.abandon()
        pending = [s for s in slots if not s.done()]
        if pending:
            await asyncio.wait(pending, timeout=_FINAL_WAIT)

    # -- the poll loop -------------------------------------------------------------------------

    async def _slot(self) -> None:
        """Pop, claim, execute; repeat until stopping. Errors back off, never end the loop."""
        failures = 0
        while not self._stopping.is_set():
            try:
                task_id = await self._queue.pop(
                    self._options.priorities, timeout=self._options.poll_timeout
                )
                if task_id is not None and self._stopping.is_set():
                    # popped by a wait that began before the stop: give it to another worker
                    # unclaimed, rather than claim it only to hand it back (a dead run).
                    await self._execution.put_back(task_id)
                elif task_id is not None:
                    claim = await self._execution.claim(task_id, self._worker_id)
                    if claim is None:
                        self._metrics.claim_refusals.inc()
                        self._log.debug("claim refused", task_id=str(task_id))
                    else:
                        await self._runner.execute(claim, self._log)
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

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the session starts stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    # -- one task --------------------------------------------------------------------------------

    # -- worker registry -------------------------------------------------------------------------

    async def _registry_loop(self) -> None:
        """Upsert the ``workers`` row every ``worker_heartbeat_interval`` s; errors are logged."""
        hostname = socket.gethostname()
        metadata: dict[str, Any] = {
            "kinds": self._kinds,
            "concurrency": self.concurrency,
            "pid": os.getpid(),
        }
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
