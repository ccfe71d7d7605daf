"""Webhooks (issue 16 item 2): a subscription to outbox events, its delivery state, the request
signature and the retry schedule.

A webhook is delivered from the transition outbox in order: ``cursor_at``/``cursor_id`` is the
outbox position (``(created_at, id)``) delivered up to, moved only after a 2xx. While the event
after the cursor keeps failing, ``attempts`` counts the failed tries and ``next_attempt_at`` is
when the next one is due (:func:`backoff_delay`). Nothing here reads a clock or does I/O.

Signature (like Stripe's): the request carries ``X-Dtq-Timestamp: <unix seconds>`` and
``X-Dtq-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed with the secret>``
(:func:`signature`). The secret is stored, since it is needed to sign; it is not an API token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from urllib.parse import urlsplit
from uuid import UUID

from dtq.domain.errors import NotFound, ValidationError
from dtq.domain.events import EVENT_TYPES
from dtq.domain.urls import has_control, http_url_problem

#: Length bounds of a webhook secret, in characters.
SECRET_MIN = 16
SECRET_MAX = 256
#: Longest accepted url, in characters.
URL_MAX = 2048
#: Longest error text kept in the delivery state, in characters.
ERROR_MAX = 500
#: The header names of a delivery.
TIMESTAMP_HEADER = "X-Dtq-Timestamp"
SIGNATURE_HEADER = "X-Dtq-Signature"


class WebhookNotFound(NotFound):
    """No webhook with this id."""

    code = "webhook_not_found"


class InvalidWebhook(ValidationError):
    """A webhook needs an http(s) url, known event types and a secret of 16..256 characters."""

    code = "invalid_webhook"


def check_url(url: str) -> str:
    """``url`` if it is an absolute ``http``/``https`` url with a host, at most ``URL_MAX``
    characters, without whitespace or control characters.

    Raises:
        InvalidWebhook: otherwise (field ``url``), saying which.
    """
    if len(url) > URL_MAX:
        raise InvalidWebhook(f"the url has {len(url)} characters; at most {URL_MAX}", field="url")
    problem = http_url_problem(url)
    if problem is not None:
        raise InvalidWebhook(f"{url[:100]!r} {problem}", field="url")
    return url


def shown_url(url: str) -> str:
    """``url`` as reads show it: a password in it (``https://user:password@host/``) reads
    ``***``, as the secret is never shown again; deliveries use the url as given."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return parts._replace(netloc=f"{name}:***@{host}").geturl()


def check_events(types: Sequence[str]) -> tuple[str, ...]:
    """The subscribed event types, deduplicated in order: one or more of ``EVENT_TYPES``.

    Raises:
        InvalidWebhook: empty, or a type not in ``EVENT_TYPES`` (field ``events``).
    """
    if not types:
        raise InvalidWebhook("give at least one event type", field="events")
    for kind in types:
        if kind not in EVENT_TYPES:
            raise InvalidWebhook(
                f"unknown event type {kind!r}; expected some of {', '.join(EVENT_TYPES)}",
                field="events",
            )
    return tuple(dict.fromkeys(types))


def check_secret(secret: str) -> str:
    """``secret`` if it has 16..256 characters, none of them a control character.

    Raises:
        InvalidWebhook: otherwise (field ``secret``).
    """
    if not SECRET_MIN <= len(secret) <= SECRET_MAX:
        raise InvalidWebhook(
            f"the secret must have {SECRET_MIN}..{SECRET_MAX} characters, not {len(secret)}",
            field="secret",
        )
    if has_control(secret):
        raise InvalidWebhook("the secret must not hold a control character", field="secret")
    return secret


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Dtq-Signature`` value: ``sha256=`` + hex HMAC-SHA256 of ``b"<timestamp>." + body``
    keyed with the UTF-8 ``secret`` (``timestamp``: unix seconds, the ``X-Dtq-Timestamp``)."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, header: str) -> bool:
    """True when ``header`` is the signature of ``body`` at ``timestamp`` (constant-time)."""
    if not timestamp.isascii() or not timestamp.isdigit():
        return False
    return hmac.compare_digest(signature(secret, int(timestamp), body), header)


def backoff_delay(attempts: int, *, first: float, cap: float, jitter: float) -> float:
    """Seconds before the next try after ``attempts`` (>= 1) failed tries in a row.

    Exponential: ``first * 2**(attempts - 1)`` capped at ``cap``, then scaled by ``jitter``
    (the caller's random draw in [0, 1)) into ``[delay / 2, delay)`` ("equal jitter"), so
    retries of many webhooks spread out while each gap still grows.
    """
    delay: float = min(cap, first * 2.0 ** min(attempts - 1, 62))
    return delay / 2 + delay / 2 * jitter


@dataclass(frozen=True, slots=True)
class Webhook:
    """A webhook and its delivery state.

    Attributes:
        id: its id.
        url: where every delivery is POSTed (and nowhere else: redirects are not followed).
        events: the event types it receives (a subset of ``EVENT_TYPES``).
        secret: the signing key (stored: it is needed to sign; never returned by the API).
        created_at: when it was created; delivery starts with the events after it.
        cursor_at, cursor_id: the outbox position delivered up to (an event's
            ``(created_at, id)``; ``(created_at, UUID(0))`` before the first delivery).
        attempts: failed tries in a row of the event after the cursor (0 after a success).
        next_attempt_at: not tried again before then (a retry's backoff, or the hold an
            orchestrator takes while it delivers, so another does not deliver the same event).
        last_status: the HTTP status of the last try, None when it got no response.
        last_error: why the last try failed (at most 500 characters), None after a success.
        last_attempt_at: when the last try ended, None before the first.
        delivered: deliveries that got a 2xx.
    """

    id: UUID
    url: str
    events: tuple[str, ...]
    secret: str
    created_at: datetime
    cursor_at: datetime
    cursor_id: UUID
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_status: int | None = None
    last_error: str | None = None
    last_attempt_at: datetime | None = None
    delivered: int = 0

    @classmethod
    def create(
        cls, *, id: UUID, url: str, events: Sequence[str], secret: str, at: datetime
    ) -> Webhook:
        """A checked new webhook, due at once, positioned at ``at``.

        Raises:
            InvalidWebhook: naming ``url``, ``events`` or ``secret``.
        """
        return cls(
            id=id,
            url=check_url(url),
            events=check_events(events),
            secret=check_secret(secret),
            created_at=at,
            cursor_at=at,
            cursor_id=UUID(int=0),
            next_attempt_at=at,
        )

    def held(self, until: datetime) -> Webhook:
        """Taken for one delivery until ``until``."""
        return replace(self, next_attempt_at=until)

    def delivered_to(
        self, cursor_at: datetime, cursor_id: UUID, *, status: int, at: datetime
    ) -> Webhook:
        """The event at ``(cursor_at, cursor_id)`` got a 2xx ``status`` at ``at``."""
        return replace(
            self,
            cursor_at=cursor_at,
            cursor_id=cursor_id,
            attempts=0,
            next_attempt_at=at,
            last_status=status,
            last_error=None,
            last_attempt_at=at,
            delivered=self.delivered + 1,
        )

    def skipped_to(self, cursor_at: datetime, cursor_id: UUID) -> Webhook:
        """Moved over events it does not subscribe to (no delivery)."""
        return replace(self, cursor_at=cursor_at, cursor_id=cursor_id)

    def failed(self, *, status: int | None, error: str, at: datetime, delay: float) -> Webhook:
        """A try failed at ``at``; the next is due ``delay`` seconds later."""
        return replace(
            self,
            attempts=self.attempts + 1,
            next_attempt_at=at + timedelta(seconds=delay),
            last_status=status,
            last_error=error[:ERROR_MAX],
            last_attempt_at=at,
        )
