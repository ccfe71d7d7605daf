"""Dashboard sessions (issue 16 item 3): the ``dtq_session`` cookie and the CSRF comparison.

The cookie holds only a random session id (32 bytes, URL-safe). The session itself (the id's
hash, the id of the token the operator logged in with, never its secret, and the session's
CSRF token) is a row of the store, kept by :class:`dtq.application.sessions.SessionService`:
every orchestrator on the database honours it, a restart keeps it, and each request judges
the token again (a revoked or expired token ends the session within the lookup cache's
second). Sessions last ``SESSION_TTL`` (12 h) from their login, never past the token's expiry.
"""

from __future__ import annotations

import hmac

#: The session cookie's name.
COOKIE = "dtq_session"
#: The name of the shared key (``SessionService.shared_key``) signing the login form's token.
LOGIN_KEY = "login_csrf"
#: The name of the shared key that is the CSRF token of every page with ``API_AUTH=none``.
ANONYMOUS_KEY = "anonymous_csrf"


def csrf_matches(expected: str, sent: object) -> bool:
    """True when the form's ``csrf`` value ``sent`` equals ``expected`` (constant time)."""
    return isinstance(sent, str) and hmac.compare_digest(expected.encode(), sent.encode())
