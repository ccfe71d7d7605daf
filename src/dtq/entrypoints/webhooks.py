"""The orchestrator's webhook loop (issue 16 item 2): one delivery task per webhook.

Every ``refresh`` seconds the loop lists the webhooks and starts a task for each new one; each
task runs ``WebhookService.deliver_next`` and waits as long as it says (a retry's backoff, the
poll interval when caught up, nothing while it has a backlog), until the webhook is deleted or
``stop`` is set. Webhooks are independent: a slow or failing endpoint only delays its own task
(each request is bounded by ``WEBHOOK_TIMEOUT``), and nothing here is on the task-processing
path. A failing step is retried after the poll interval and the loop never dies of it; the first
failure of a streak is logged (an outage as a warning without a traceback), and the recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING
from uuid import UUID

import structlog

from dtq.domain.errors import BackendUnavailable

if TYPE_CHECKING:
    from dtq.application.webhooks import WebhookService


class WebhookLoop:
    """Delivers every webhook until told to stop.

    Args:
        webhooks: the service doing the work.
        refresh: seconds between two reads of the webhook list (new webhooks start within
            about that long); the policy's poll interval when None.
    """

    def __init__(self, webhooks: WebhookService, *, refresh: float | None = None) -> None:
        self._webhooks = webhooks
        self._refresh = webhooks.policy.poll_interval if refresh is None else refresh
        self._log = structlog.get_logger("dtq.webhooks")

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; the delivery tasks are cancelled then (an event in flight
        is delivered again by the next orchestrator: at-least-once) and the sender's
        connections closed."""
        running: dict[UUID, asyncio.Task[None]] = {}
        failing = False
        try:
            while not stop.is_set():
                try:
                    hooks = await self._webhooks.list()
                except BackendUnavailable as exc:
                    if not failing:
                        self._log.warning(
                            "webhook list failed: backend unavailable", error=str(exc)
                        )
                    failing, hooks = True, []
                except Exception:
                    if not failing:
                        self._log.exception("webhook list failed")
                    failing, hooks = True, []
                else:
                    failing = False
                for hook in hooks:
                    task = running.get(hook.id)
                    if task is None or task.done():
                        running[hook.id] = asyncio.create_task(
                            self._follow(hook.id, stop), name=f"dtq-webhook-{hook.id}"
                        )
                await _wait(stop, self._refresh)
        finally:
            for task in running.values():
                task.cancel()
            for task in running.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self._webhooks.aclose()

    async def _follow(self, webhook_id: UUID, stop: asyncio.Event) -> None:
        poll = self._webhooks.policy.poll_interval
        failing = False
        while not stop.is_set():
            try:
                wait = await self._webhooks.deliver_next(webhook_id)
            except BackendUnavailable as exc:
                if not failing:
                    self._log.warning(
                        "webhook step failed: backend unavailable",
                        webhook_id=str(webhook_id),
                        error=str(exc),
                    )
                failing, wait = True, poll
            except Exception:
                if not failing:
                    self._log.exception("webhook step failed", webhook_id=str(webhook_id))
                failing, wait = True, poll
            else:
                if failing:
                    self._log.info("webhook steps recovered", webhook_id=str(webhook_id))
                failing = False
            if wait is None:
                return
            if wait > 0:
                await _wait(stop, wait)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
