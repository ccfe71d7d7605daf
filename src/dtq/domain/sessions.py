"""Dashboard login sessions (issue 16 item 3): the session value and its cookie id.

The browser holds a random session id (:func:`new_session_id`, 256 bits); the database holds
only its SHA-256 (:func:`hash_session_id`), the id of the API token the session logged in with
(never the token's secret) and the session's CSRF token. Any orchestrator can then look a
session up by the cookie, and a copy of the table gives nobody a usable cookie.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

#: Random bytes in a session id and in a CSRF token (256 bits).
SESSION_ID_BYTES = 32
#: What a session id looks like: 43 URL-safe base64 characters (``secrets.token_urlsafe(32)``).
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")


def new_session_id() -> str:
    """A new random session id (the ``dtq_session`` cookie's value)."""
    return secrets.token_urlsafe(SESSION_ID_BYTES)


def new_csrf_token() -> str:
    """A new random per-session CSRF token (43 URL-safe characters)."""
    return secrets.token_urlsafe(SESSION_ID_BYTES)


def looks_like_session_id(value: object) -> bool:
    """True when ``value`` has the shape of a :func:`new_session_id` (so a cookie that cannot
    be one costs no database read)."""
    return isinstance(value, str) and SESSION_ID_PATTERN.fullmatch(value) is not None


def hash_session_id(session_id: str) -> str:
    """The stored key of a session id: its SHA-256 as 64 lowercase hex digits."""
    return hashlib.sha256(session_id.encode("ascii")).hexdigest()


@dataclass(frozen=True, slots=True)
class DashboardSession:
    """One logged-in browser, as stored.

    Attributes:
        id_hash: :func:`hash_session_id` of the cookie's id.
        token_id: the API token it logged in with; the session is only as good as that token
            (revoked or expired: the session is over).
        csrf: the token every state-changing dashboard request must carry.
        created_at: when it logged in (database clock).
        expires_at: when it ends (database clock): login + the session lifetime, never after
            the token's own expiry.
    """

    id_hash: str
    token_id: UUID
    csrf: str
    created_at: datetime
    expires_at: datetime

    def live_at(self, at: datetime) -> bool:
        """True when the session has not expired at ``at``."""
        return at < self.expires_at
