"""The orchestrator's background loops: reconcile passes, the scheduled-set promoter, retention.

Independent loops share one stop event (spec §2 invariant, §5, DESIGN §5):

* the **reconcile loop** runs ``ReconcileService.reconcile_once`` at once, then every
  ``interval`` seconds measured start to start. A pass never overlaps the next: when a pass takes
  longer than the interval, the next one starts as soon as it ends. A failing pass is logged and
  counted, and the loop carries on: the reconciler is the safety net and must not die. A pass
  failed by an outage (``BackendUnavailable``) is one warning without a traceback, so the next
  pass, at most one interval after the backend returns, resumes the work; any other error keeps
  its traceback. Each
  pass's report also drives a warning when the queue lost its data and, per priority,
  the ``orchestrator_tasks_queued_unpolled`` gauge and a warning for due tasks no live
  worker polls, and the ``orchestrator_reclaims_held`` gauge and a warning for runs of live
  workers registered with another Redis key prefix;
* the **retention loop** (when a retention service is given; issue 14 item 8) runs
  ``RetentionService.prune_once`` at once, then every ``interval`` seconds; a pass that stopped
  at its page bound with work left is followed at once by the next, so a backlog drains at the
  database's pace while every transaction stays small, and the repairs of the reconcile loop
  never wait for it. It counts ``orchestrator_pruned_total``, logs one line per pass that
  deleted something, and fails and logs like the reconcile loop;
* the **promoter loop** moves due entries of the scheduled set (retry backoff, delays) to their
  ready lists every ``promote_interval`` seconds, so a retry becomes runnable within about that
  long rather than a whole reconcile interval later. While it keeps failing (Redis down) it backs
  off exponentially up to ``interval`` and logs the first failure of a streak only (a warning
  for an outage, with the traceback for anything else).

The loops know only the application service and an optional metrics holder; which adapters are
behind the service is the composition root's business.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints import eventloop

if TYPE_CHECKING:
    from dtq.application.commands import ReconcileReport
    from dtq.application.reconcile import ReconcileService
    from dtq.application.retention import PruneReport, RetentionService
    from dtq.entrypoints.metrics import OrchestratorMetrics


class Reconciler:
    """Runs the reconcile and promote loops until told to stop.

    Args:
        reconcile: the application service doing the work.
        interval: seconds between the starts of two reconcile passes (``RECONCILE_INTERVAL``);
            also the promoter's longest back-off.
        promote_interval: seconds between two promotions (``PROMOTE_INTERVAL``).
        batch: most candidates handled per step of a pass (``RECONCILE_BATCH``).
        metrics: counters and histogram to update (``orchestrator_reconcile_*``), or None.
        logger: a structlog logger; ``dtq.reconciler`` when None.
        retention: the retention pass of the retention loop, or None for no such loop.

    Raises:
        ValueError: an interval is not positive or ``batch`` is below 1.
    """

    def __init__(
        self,
        reconcile: ReconcileService,
        *,
        interval: float,
        promote_interval: float,
        batch: int,
        metrics: OrchestratorMetrics | None = None,
        logger: Any = None,
        retention: RetentionService | None = None,
    ) -> None:
        if interval <= 0 or promote_interval <= 0:
            raise ValueError("reconcile and promote intervals must be positive")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self._reconcile = reconcile
        self._retention = retention
        self._interval = interval
        self._promote_interval = promote_interval
        self._batch = batch
        self._metrics = metrics
        self._unpolled_labels: set[str] = set()  # priorities with a queued_unpolled series
        self._log = logger if logger is not None else structlog.get_logger("dtq.reconciler")

    async def run(self, stop: asyncio.Event) -> None:
        """Run both loops until ``stop`` is set, then return.

        A pass or promotion in progress when ``stop`` is set is allowed to finish; cancel the
        task running this coroutine to abandon it instead.

        Args:
            stop: set it to end the loops.
        """
        self._log.info(
            "reconciler started",
            interval_s=self._interval,
            promote_interval_s=self._promote_interval,
            batch=self._batch,
            event_loop=eventloop.running_loop_name(),
        )
        async with asyncio.TaskGroup() as group:
            group.create_task(self._reconcile_loop(stop), name="dtq-reconcile")
            group.create_task(self._promote_loop(stop), name="dtq-promote")
            if self._retention is not None:
                group.create_task(self._retention_loop(stop), name="dtq-retention")
        self._log.info("reconciler stopped")

    async def run_pass(self) -> ReconcileReport | None:
        """Run one reconcile pass, recording it in the metrics and the log.

        Returns:
            The pass's report, or None when the pass failed (the error is logged and counted).
        """
        loop = asyncio.get_running_loop()
        metrics = self._metrics
        if metrics is not None:
            metrics.reconcile_runs.inc()
        started = loop.time()
        try:
            report = await self._reconcile.reconcile_once(self._batch)
        except BackendUnavailable as exc:
            if metrics is not None:
                metrics.reconcile_errors.inc()
            self._log.warning("reconcile pass failed: backend unavailable", error=str(exc))
            return None
        except Exception:
            if metrics is not None:
                metrics.reconcile_errors.inc()
            self._log.exception("reconcile pass failed")
            return None
        finally:
            if metrics is not None:
                metrics.reconcile_duration.observe(loop.time() - started)
        if metrics is not None:
            metrics.reconcile_enqueued.inc(report.enqueued)
            metrics.reconcile_reclaimed.inc(report.reclaimed)
            metrics.reconcile_promoted.inc(report.promoted)
        self._report_queue_state(report)
        if report.enqueued or report.reclaimed or report.promoted:
            self._log.info(
                "reconcile pass",
                enqueued=report.enqueued,
                reclaimed=report.reclaimed,
                promoted=report.promoted,
                duration_s=round(loop.time() - started, 6),
            )
        return report

    async def prune_pass(self) -> PruneReport | None:
        """Run one retention pass, counting what it deleted and logging it when it did.

        Returns:
            The pass's report, or None when there is no retention service or the pass failed
            (logged, and counted in ``orchestrator_reconcile_errors_total``).
        """
        if self._retention is None:
            return None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            report = await self._retention.prune_once()
        except BackendUnavailable as exc:
            if self._metrics is not None:
                self._metrics.reconcile_errors.inc()
            self._log.warning("retention pass failed: backend unavailable", error=str(exc))
            return None
        except Exception:
            if self._metrics is not None:
                self._metrics.reconcile_errors.inc()
            self._log.exception("retention pass failed")
            return None
        if self._metrics is not None:
            pruned = self._metrics.pruned
            for what, count in (
                ("jobs", report.jobs),
                ("tasks", report.tasks),
                ("runs", report.runs),
                ("tombstones", report.tombstones),
                ("sessions", report.sessions),
            ):
                if count:
                    pruned.labels(what=what).inc(count)
        if report.pruned:
            self._log.info(
                "retention pass",
                jobs=report.jobs,
                tasks=report.tasks,
                runs=report.runs,
                tombstones_written=report.tombstones_written,
                tombstones_expired=report.tombstones,
                sessions_expired=report.sessions,
                duration_s=round(loop.time() - started, 6),
            )
        return report

    def _report_queue_state(self, report: ReconcileReport) -> None:
        """Warn about a new queue (first used, or its data lost), about runs held back for
        their workers' other Redis key prefix and about due tasks no live worker polls; set the
        gauges."""
        if report.queue_reset:
            self._log.warning(
                "new queue epoch (the first use of this Redis prefix, or its data was lost): "
                "reclaims held back for one lease TTL while workers re-create their leases"
            )
        if report.reclaims_held:
            self._log.warning(
                "running tasks of live workers registered with another REDIS_KEY_PREFIX are not"
                " reclaimed: every process on one database must use the same prefix",
                held=report.reclaims_held,
            )
        if self._metrics is not None:
            self._metrics.reclaims_held.set(sum(report.reclaims_held.values()))
        if report.unpolled is None:
            return  # this pass did not finish counting: the gauge keeps the last count
        for priority, queued in report.unpolled.items():
            self._log.warning(
                "queued tasks of a priority no live worker polls",
                priority=priority,
                queued=queued,
            )
        if self._metrics is None:
            return
        gauge = self._metrics.queued_unpolled
        for priority in self._unpolled_labels - report.unpolled.keys():
            gauge.remove(priority)
        for priority, queued in report.unpolled.items():
            gauge.labels(priority=priority).set(queued)
        self._unpolled_labels = set(report.unpolled)

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = loop.time()
            await self.run_pass()
            delay = self._interval - (loop.time() - started)
            if await _wait(stop, max(delay, 0.0)):
                return

    async def _retention_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            report = await self.prune_pass()
            more = report is not None and report.more
            if await _wait(stop, 0.0 if more else self._interval):
                return

    async def _promote_loop(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                promoted = await self._reconcile.promote_scheduled(self._batch)
            except BackendUnavailable as exc:
                failures += 1
                if failures == 1:
                    self._log.warning(
                        "promoting scheduled tasks failed: backend unavailable; backing off",
                        error=str(exc),
                    )
                else:
                    self._log.debug("promoting scheduled tasks failed again", failures=failures)
            except Exception:
                failures += 1
                if failures == 1:
                    self._log.exception("promoting scheduled tasks failed; backing off")
                else:
                    self._log.debug("promoting scheduled tasks failed again", failures=failures)
            else:
                if failures:
                    self._log.info("promoting scheduled tasks recovered", failures=failures)
                failures = 0
                if promoted and self._metrics is not None:
                    self._metrics.reconcile_promoted.inc(promoted)
            if await _wait(stop, self._promote_delay(failures)):
                return

    def _promote_delay(self, failures: int) -> float:
        if failures == 0:
            return self._promote_interval
        backoff: float = self._promote_interval * 2.0 ** min(failures, 30)
        return min(backoff, max(self._interval, self._promote_interval))


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``, waking early when ``stop`` is set.

    Returns:
        True when ``stop`` is set.
    """
    if stop.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True
