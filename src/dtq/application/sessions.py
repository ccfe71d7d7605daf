"""Dashboard login sessions shared by every orchestrator (issue 16 item 3).

:class:`SessionService` is what the dashboard's login, gate and logout call. A session is a
row of the store (``tx.sessions``), so an orchestrator behind a load balancer honours a login
made on another one, and a restart logs nobody out. The browser holds only a random id
(``dtq.domain.sessions.new_session_id``); the row holds its hash, the id of the API token the
operator logged in with (never the secret) and the session's CSRF token.

Each lookup reads the session and its token in one statement and judges both on the database
clock, so a revoked or expired token ends its sessions at their next request. Good lookups are
cached in the process for at most ``cache_ttl`` seconds (1 s by default, never past the
session's or the token's expiry), keyed by the id's hash: a busy page costs about one read a
second per session, and a logout or a revocation made on another orchestrator is seen here
within that second (a logout here at once). Refusals are not cached, so a burst of forged
cookies cannot push the good entries out; a cookie that cannot be a session id costs no read.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from dtq.application.ports import Clock, Store, Transaction
from dtq.application.tokens import Principal, principal_of, secret_digest
from dtq.domain.sessions import (
    DashboardSession,
    hash_session_id,
    looks_like_session_id,
    new_csrf_token,
    new_session_id,
)
from dtq.domain.tokens import Scope

#: Seconds a session lasts after its login (and never past its token's expiry).
SESSION_TTL = 12 * 3600.0
#: Default bound of the lookup cache, in seconds (the token cache's bound).
CACHE_TTL = 1.0
#: Most sessions' lookups kept in the cache; the oldest entry is dropped when it is full.
CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class LiveSession:
    """A session that is valid now.

    Attributes:
        principal: the token it logged in with (its name and scopes as they are now).
        csrf: the token its state-changing requests must carry.
    """

    principal: Principal
    csrf: str


@dataclass(frozen=True, slots=True)
class OpenedSession:
    """What :meth:`SessionService.open` returns.

    Attributes:
        cookie: the new session id, for the browser's cookie (it is stored only hashed).
        session: the session itself.
    """

    cookie: str
    session: LiveSession


@dataclass(frozen=True, slots=True)
class _Cached:
    session: LiveSession
    until: datetime  # host clock


class SessionService:
    """Sessions and shared keys on the ``Store`` port, with a short-lived lookup cache.

    Args:
        store: the system of record (``tx.sessions``, ``tx.tokens``).
        clock: the host clock, for the cache's ages only; expiry is judged on the database clock.
        ttl: seconds a session lasts after its login.
        cache_ttl: seconds a lookup may be reused (0 disables the cache).
        cache_size: most cached lookups.

    Raises:
        ValueError: ``ttl`` is not positive, or ``cache_ttl`` or ``cache_size`` is negative.
    """

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        ttl: float = SESSION_TTL,
        cache_ttl: float = CACHE_TTL,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        if ttl <= 0 or cache_ttl < 0 or cache_size < 0:
            raise ValueError("ttl must be positive, cache bounds not negative")
        self._store = store
        self._clock = clock
        self._ttl = timedelta(seconds=ttl)
        self._cache_ttl = timedelta(seconds=cache_ttl)
        self._size = cache_size
        self._cache: dict[str, _Cached] = {}
        self._keys: dict[str, str] = {}

    async def open(self, secret: str | None, *, scope: Scope = Scope.READ) -> OpenedSession:
        """Log in with the API token ``secret``: check it holds ``scope`` and store a new
        session for it (one transaction: the token's read and the session's insert).

        Raises:
            Unauthenticated: not a valid, unrevoked, unexpired token (nothing is stored).
            Forbidden: the token lacks ``scope`` (nothing is stored).
            BackendUnavailable: the database failed.
        """
        digest = secret_digest(secret)
        cookie, csrf = new_session_id(), new_csrf_token()

        async def add(tx: Transaction) -> tuple[LiveSession, timedelta]:
            token = await tx.tokens.get_by_hash(digest)
            now = await tx.now()
            principal = principal_of(token, digest, now)
            principal.require(scope)
            assert token is not None  # principal_of refuses a missing token
            expires = now + self._ttl
            if token.expires_at is not None:
                expires = min(expires, token.expires_at)
            session = DashboardSession(hash_session_id(cookie), token.id, csrf, now, expires)
            await tx.sessions.add(session)
            return LiveSession(principal, csrf), expires - now

        live, left = await self._store.run(add)
        self._remember(hash_session_id(cookie), live, left)
        return OpenedSession(cookie=cookie, session=live)

    async def resolve(self, cookie: object) -> LiveSession | None:
        """The live session of the cookie value ``cookie``; None when there is none.

        None for a value that cannot be a session id (no read), an unknown session, an expired
        one, or one whose token was revoked or expired; the last two are deleted as they are
        found. At most one statement (none on a cache hit), plus that delete.

        Raises:
            BackendUnavailable: the database could not be asked.
        """
        if not looks_like_session_id(cookie):
            return None
        assert isinstance(cookie, str)
        key = hash_session_id(cookie)
        cached = self._cache.get(key)
        if cached is not None and self._clock.now() < cached.until:
            return cached.session

        async def read(tx: Transaction) -> tuple[LiveSession, timedelta] | None:
            found = await tx.sessions.get(key)
            if found is None:
                return None
            session, token = found
            now = await tx.now()
            if not session.live_at(now) or not token.usable_at(now):
                await tx.sessions.delete(key)
                return None
            ends = session.expires_at
            if token.expires_at is not None:
                ends = min(ends, token.expires_at)
            principal = Principal(name=token.name, scopes=token.scopes)
            return LiveSession(principal, session.csrf), ends - now

        result = await self._store.run(read)
        if result is None:
            self._cache.pop(key, None)
            return None
        self._remember(key, *result)
        return result[0]

    async def close(self, cookie: object) -> bool:
        """End the session of ``cookie`` (logout) on every orchestrator: this one at once,
        the others within their cache's TTL. True when it existed; idempotent.

        Raises:
            BackendUnavailable: the database failed.
        """
        if not looks_like_session_id(cookie):
            return False
        assert isinstance(cookie, str)
        key = hash_session_id(cookie)
        self._cache.pop(key, None)

        async def delete(tx: Transaction) -> bool:
            return await tx.sessions.delete(key)

        return await self._store.run(delete)

    async def shared_key(self, name: str) -> str:
        """A random secret (32 bytes, URL-safe) that every orchestrator on this database
        shares, created at its first use (``tx.sessions.key``); read once per process, then
        cached for the process's life.

        Raises:
            BackendUnavailable: the database failed (nothing is cached).
        """
        found = self._keys.get(name)
        if found is None:
            candidate = secrets.token_urlsafe(32)

            async def get(tx: Transaction) -> str:
                return await tx.sessions.key(name, candidate)

            found = self._keys[name] = await self._store.run(get)
        return found

    def _remember(self, key: str, session: LiveSession, left: timedelta) -> None:
        if self._cache_ttl <= timedelta(0) or self._size == 0:
            return
        self._cache.pop(key, None)
        while len(self._cache) >= self._size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = _Cached(session, self._clock.now() + min(self._cache_ttl, left))

    @property
    def cached(self) -> int:
        """How many lookups the cache holds (for tests)."""
        return len(self._cache)
