"""The login form's CSRF token (issue 16 item 3): a signed double-submit cookie.

Before there is a session there is no server-side place for a synchronizer token, so
``GET /ui/login`` gives the browser a token twice: in the ``dtq_login_csrf`` cookie
(HttpOnly, SameSite=Strict, path ``/ui/login``, an hour) and in the form's hidden ``csrf``
field. ``POST /ui/login`` accepts only when both are present, equal, and signed with the
dashboard's login key (``<nonce>.<HMAC-SHA256(key, nonce)>``). The key is random, created in
the store by the first orchestrator that needs it and shared by all of them
(``SessionService.shared_key``, table ``dashboard_keys``), so a form served by one orchestrator
posts to another, and a restart leaves open forms valid. A cross-site page cannot read the
cookie to copy it into its form, and a cookie planted from a sibling host (which a plain
double-submit would trust) fails the signature.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

#: The login form's CSRF cookie.
LOGIN_COOKIE = "dtq_login_csrf"
#: Seconds the login cookie lives.
LOGIN_COOKIE_AGE = 3600


class LoginTokens:
    """Issues and checks the login form's signed tokens.

    Args:
        key: the signing key (the dashboard passes the shared one); default 32 random bytes.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._key, nonce.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        """A fresh token: a random nonce and its signature."""
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def signed(self, token: object) -> bool:
        """True when ``token`` was signed with this key (whatever its age)."""
        if not isinstance(token, str) or not token.isascii():
            return False
        nonce, _, mac = token.partition(".")
        return bool(nonce) and hmac.compare_digest(mac.encode(), self._sign(nonce).encode())

    def accepts(self, cookie: object, field: object) -> bool:
        """True when the cookie and the form field carry the same token, signed here
        (compared in constant time)."""
        if not isinstance(cookie, str) or not isinstance(field, str) or not field.isascii():
            return False
        return hmac.compare_digest(cookie.encode(), field.encode()) and self.signed(cookie)
