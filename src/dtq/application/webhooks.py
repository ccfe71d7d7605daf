"""Webhooks driven from the transition outbox (issue 16 item 2): the subscriptions' CRUD and
the delivery step the orchestrator's webhook loop runs per webhook.

Delivery is at-least-once and in order per webhook: :meth:`WebhookService.deliver_next` takes
the first settled outbox event after the webhook's cursor that it subscribes to, POSTs it
signed (``domain.webhooks.signature``) and moves the cursor past it only after a 2xx; a failure
is recorded and retried after :func:`~dtq.domain.webhooks.backoff_delay`. Every write of the
delivery state is a compare-and-set on the cursor and ``next_attempt_at`` as read, and an
orchestrator first *holds* the webhook (sets ``next_attempt_at`` ahead by the hold) in the
transaction that picks the event, so two orchestrators do not send the same event in the normal
case. The HTTP request happens between two short transactions, never inside one. See
ARCHITECTURE.md "Webhooks (issue 16 item 2)".
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from dtq.application.events import event_document, format_event_id
from dtq.application.ports import (
    DeliveryFailed,
    Event,
    EventCursor,
    Store,
    Transaction,
    WebhookSender,
)
from dtq.domain.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Webhook,
    WebhookNotFound,
    backoff_delay,
    signature,
)


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """How webhooks are delivered (all seconds).

    Attributes:
        timeout: most one request may take (``WEBHOOK_TIMEOUT``, the sender's timeout).
        backoff_first: the delay after the first failure (``WEBHOOK_BACKOFF_MIN``).
        backoff_cap: the longest delay between tries (``WEBHOOK_BACKOFF_MAX``).
        poll_interval: how often a caught-up webhook reads the outbox
            (``WEBHOOK_POLL_INTERVAL``).
        settle: only events at least this old are delivered (``EVENTS_SETTLE``, the
            outbox's visibility horizon).
        page_size: most outbox events read per step.
    """

    timeout: float = 5.0
    backoff_first: float = 1.0
    backoff_cap: float = 300.0
    poll_interval: float = 1.0
    settle: float = 1.0
    page_size: int = 200

    @property
    def hold(self) -> float:
        """How long an orchestrator holds a webhook while it delivers one event: the request's
        timeout twice over plus a second, so a live holder always finishes first."""
        return 2 * self.timeout + 1.0


def event_body(event: Event) -> bytes:
    """The JSON body of a delivery: the event as ``GET /v1/events`` sends it (``id``, ``type``,
    ``job_id``, ``task_id``, ``data``, ``created_at``), UTF-8, compact."""
    document = event_document(event)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def delivery_headers(webhook: Webhook, event: Event, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers of one delivery: the JSON content type, ``X-Dtq-Event`` (its type),
    ``X-Dtq-Event-Id`` (its stream id: receivers deduplicate on it, delivery being
    at-least-once), ``X-Dtq-Webhook-Id``, ``X-Dtq-Timestamp`` (``timestamp``, unix seconds) and
    ``X-Dtq-Signature``."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "dtq-webhooks",
        "X-Dtq-Event": event.type,
        "X-Dtq-Event-Id": format_event_id(event.cursor),
        "X-Dtq-Webhook-Id": str(webhook.id),
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(webhook.secret, timestamp, body),
    }


@dataclass(frozen=True, slots=True)
class _Take:
    webhook: Webhook  # as held by this orchestrator
    event: Event


class WebhookService:
    """Webhook subscriptions (``/v1/webhooks``) and their delivery.

    Args:
        store: the system of record (webhooks, their state, the outbox).
        sender: sends the requests (bounded by its own timeout).
        policy: timings.
        jitter: a random draw in [0, 1) per retry (tests pass a fixed one).
        now_seconds: unix seconds for ``X-Dtq-Timestamp`` (host clock).
    """

    def __init__(
        self,
        *,
        store: Store,
        sender: WebhookSender,
        policy: WebhookPolicy | None = None,
        jitter: Callable[[], float] = random.random,
        now_seconds: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._sender = sender
        self.policy = policy or WebhookPolicy()
        self._jitter = jitter
        self._now_seconds = now_seconds

    async def create(self, *, url: str, events: Sequence[str], secret: str) -> Webhook:
        """Create a webhook; it receives the matching events committed from now on.

        Raises:
            InvalidWebhook: naming ``url``, ``events`` or ``secret``.
        """

        async def write(tx: Transaction) -> Webhook:
            hook = Webhook.create(
                id=uuid.uuid4(), url=url, events=events, secret=secret, at=await tx.now()
            )
            await tx.webhooks.add(hook)
            return hook

        return await self._store.run(write)

    async def list(self) -> list[Webhook]:
        """Every webhook, oldest first."""

        async def read(tx: Transaction) -> list[Webhook]:
            return await tx.webhooks.list_all()

        return await self._store.run(read)

    async def get(self, webhook_id: UUID) -> Webhook:
        """The webhook with its delivery state.

        Raises:
            WebhookNotFound: no such webhook (field ``id``).
        """

        async def read(tx: Transaction) -> Webhook | None:
            return await tx.webhooks.get(webhook_id)

        hook = await self._store.run(read)
        if hook is None:
            raise WebhookNotFound(f"webhook {webhook_id} not found", field="id")
        return hook

    async def delete(self, webhook_id: UUID) -> None:
        """Delete the webhook (no more deliveries start; one in flight may still land).

        Raises:
            WebhookNotFound: no such webhook (field ``id``).
        """

        async def write(tx: Transaction) -> bool:
            return await tx.webhooks.delete(webhook_id)

        if not await self._store.run(write):
            raise WebhookNotFound(f"webhook {webhook_id} not found", field="id")

    async def aclose(self) -> None:
        """Close the sender's connections (the webhook loop does when it stops)."""
        await self._sender.aclose()

    async def deliver_next(self, webhook_id: UUID) -> float | None:
        """One delivery step of one webhook: try the next event it subscribes to, if due.

        Returns:
            Seconds to wait before the next step (0: go on at once), or None when the
            webhook no longer exists.

        Raises:
            BackendUnavailable: the store failed (the step did nothing durable, or only its
                hold, which expires after ``policy.hold``).
        """
        taken = await self._store.run(lambda tx: self._take(tx, webhook_id))
        if taken is None or isinstance(taken, float):
            return taken
        hook, event = taken.webhook, taken.event
        body = event_body(event)
        headers = delivery_headers(hook, event, body, int(self._now_seconds()))
        status: int | None
        try:
            status = await self._sender.post(hook.url, body, headers)
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except DeliveryFailed as exc:
            status, error = None, str(exc) or type(exc).__name__
        delay = 0.0 if error is None else self._delay(hook.attempts + 1)

        async def record(tx: Transaction) -> None:
            at = await tx.now()
            if error is None:
                assert status is not None
                new = hook.delivered_to(event.created_at, event.id, status=status, at=at)
            else:
                new = hook.failed(status=status, error=error, at=at, delay=delay)
            await tx.webhooks.replace(hook, new)  # False: deleted, or our hold was taken over

        await self._store.run(record)
        return delay

    def _delay(self, attempts: int) -> float:
        return backoff_delay(
            attempts,
            first=self.policy.backoff_first,
            cap=self.policy.backoff_cap,
            jitter=self._jitter(),
        )

    async def _take(self, tx: Transaction, webhook_id: UUID) -> _Take | float | None:
        """Pick the event to deliver and hold the webhook for it, or say how long to wait."""
        hook = await tx.webhooks.get(webhook_id)
        if hook is None:
            return None
        now = await tx.now()
        if hook.next_attempt_at is not None and hook.next_attempt_at > now:
            return min((hook.next_attempt_at - now).total_seconds(), self.policy.poll_interval)
        policy = self.policy
        events = await tx.events.page(
            after=EventCursor(hook.cursor_at, hook.cursor_id),
            job_id=None,
            types=None,
            settle=policy.settle,
            limit=policy.page_size,
        )
        wanted = set(hook.events)
        target = next((e for e in events if e.type in wanted), None)
        if target is None:
            if not events:
                return policy.poll_interval
            last = events[-1]
            moved = await tx.webhooks.replace(hook, hook.skipped_to(last.created_at, last.id))
            return 0.0 if moved and len(events) >= policy.page_size else policy.poll_interval
        held = hook.held(now + timedelta(seconds=policy.hold))
        if not await tx.webhooks.replace(hook, held):
            return policy.poll_interval
        return _Take(held, target)
