"""Dashboard sessions (issue 16 item 3): what the ``dtq_session`` cookie points at.

The cookie holds only a random session id (32 bytes, URL-safe); the token secret the operator
logged in with stays in this process's memory, next to the session's CSRF token, and is
checked again with ``TokenService.authenticate`` on every request (so a revoked token stops
working within the token cache's TTL). Sessions live ``SESSION_TTL`` seconds from their login
and at most ``MAX_SESSIONS`` are kept (the oldest is dropped); an orchestrator restart logs
everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

#: The session cookie's name.
COOKIE = "dtq_session"
#: Seconds a session lasts after its login.
SESSION_TTL = 12 * 3600.0
#: Most sessions kept in memory.
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    """One logged-in browser.

    Attributes:
        secret: the API token secret it logged in with.
        csrf: the per-session token every dashboard form posts back (field ``csrf``).
        expires: ``time.monotonic()`` instant after which the session is gone.
    """

    secret: str
    csrf: str
    expires: float


class SessionStore:
    """The sessions of one process, bounded in number and age.

    Args:
        ttl: seconds a session lasts.
        limit: most sessions kept; a new one beyond it drops the oldest.
        clock: a monotonic clock in seconds (tests pass their own).
    """

    def __init__(
        self,
        *,
        ttl: float = SESSION_TTL,
        limit: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._limit = limit
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def create(self, secret: str) -> tuple[str, Session]:
        """Open a session for ``secret``; returns the new cookie value and the session."""
        sid = secrets.token_urlsafe(32)
        session = Session(secret, secrets.token_urlsafe(32), self._clock() + self._ttl)
        self._sessions[sid] = session
        while len(self._sessions) > self._limit:
            self._sessions.popitem(last=False)
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session of cookie value ``sid``; None when unknown or expired."""
        if not sid:
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        if self._clock() >= session.expires:
            del self._sessions[sid]
            return None
        return session

    def drop(self, sid: str | None) -> None:
        """End a session (logout, or its token stopped authenticating). Unknown: no-op."""
        if sid:
            self._sessions.pop(sid, None)

    def __len__(self) -> int:
        return len(self._sessions)


def csrf_matches(expected: str, sent: object) -> bool:
    """True when the form's ``csrf`` value ``sent`` equals ``expected`` (constant time)."""
    return isinstance(sent, str) and hmac.compare_digest(expected.encode(), sent.encode())
