"""``/v1/webhooks`` (issue 16 item 2): create, list and delete webhooks, and read a webhook's
delivery log. The bodies live in :mod:`~dtq.entrypoints.api.schemas` (the client shares them).

The secret is write-only: no response carries it. Scopes follow the API's rule (``auth.py``):
``POST`` and ``DELETE`` need ``admin``, the ``GET`` routes ``read``.
"""

from __future__ import annotations

from litestar import Controller, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from dtq.application.events import format_event_id
from dtq.application.ports import EventCursor
from dtq.application.webhooks import WebhookService
from dtq.domain.webhooks import Webhook, shown_url
from dtq.entrypoints.api import guards, responses
from dtq.entrypoints.api.params import ResourceId, parse_id
from dtq.entrypoints.api.schemas import DeliveryLogBody, WebhookBody, WebhookList, WebhookRequest

__all__ = [
    "DeliveryLogBody",
    "WebhookBody",
    "WebhookController",
    "WebhookList",
    "WebhookRequest",
    "delivery_log_body",
    "webhook_body",
]


def webhook_body(hook: Webhook) -> WebhookBody:
    """The wire form of a webhook, without its secret (or a password in its url)."""
    return WebhookBody(
        id=str(hook.id),
        url=shown_url(hook.url),
        events=list(hook.events),
        created_at=hook.created_at,
    )


def delivery_log_body(hook: Webhook) -> DeliveryLogBody:
    """The wire form of a webhook's delivery state."""
    moved = hook.cursor_at != hook.created_at or hook.cursor_id.int != 0
    return DeliveryLogBody(
        webhook_id=str(hook.id),
        cursor=format_event_id(EventCursor(hook.cursor_at, hook.cursor_id)) if moved else None,
        delivered=hook.delivered,
        attempts=hook.attempts,
        last_status=hook.last_status,
        last_error=hook.last_error,
        last_attempt_at=hook.last_attempt_at,
        next_attempt_at=hook.next_attempt_at,
    )


class WebhookController(Controller):
    """``/v1/webhooks``."""

    path = "/v1/webhooks"
    tags = ["webhooks"]

    @post(
        "/",
        status_code=201,
        summary="Create a webhook",
        responses={
            400: responses.BAD_REQUEST,
            413: responses.TOO_LARGE,
            415: responses.UNSUPPORTED,
            **responses.COMMON,
        },
        before_request=guards.json_body(WebhookRequest),
    )
    async def create_webhook(
        self, *, data: JSONBody[WebhookRequest], webhooks: NamedDependency[WebhookService]
    ) -> Response[WebhookBody]:
        """201 with the webhook (``Location: /v1/webhooks/{id}``); it receives the matching
        events committed from now on. 400 naming ``url`` (not http/https), ``events`` (empty
        or an unknown type) or ``secret`` (not 16..256 characters)."""
        hook = await webhooks.create(url=data.url, events=data.events, secret=data.secret)
        return Response(
            webhook_body(hook), status_code=201, headers={"Location": f"/v1/webhooks/{hook.id}"}
        )

    @get(
        "/",
        summary="List the webhooks",
        responses=responses.COMMON,
        before_request=guards.no_input,
    )
    async def list_webhooks(self, webhooks: NamedDependency[WebhookService]) -> WebhookList:
        """Every webhook, oldest first (a handful: no paging)."""
        return WebhookList(webhooks=[webhook_body(h) for h in await webhooks.list()])

    @delete(
        "/{id:str}",
        status_code=204,
        summary="Delete a webhook",
        responses=responses.READ_BY_ID,
        before_request=guards.no_input,
    )
    async def delete_webhook(
        self, id: ResourceId, webhooks: NamedDependency[WebhookService]
    ) -> None:
        """204; no delivery starts after it (one in flight may still land). 404 unknown,
        400 not a UUID."""
        await webhooks.delete(parse_id(id))

    @get(
        "/{id:str}/deliveries",
        summary="A webhook's delivery log",
        responses=responses.READ_BY_ID,
        before_request=guards.no_input,
    )
    async def deliveries(
        self, id: ResourceId, webhooks: NamedDependency[WebhookService]
    ) -> DeliveryLogBody:
        """The outbox position delivered up to, the count of deliveries, and the last try's
        status, error and time with the next try's time (one record per webhook: deliveries
        are in order, so only the event after the cursor is ever being retried). 404 unknown,
        400 not a UUID."""
        return delivery_log_body(await webhooks.get(parse_id(id)))
