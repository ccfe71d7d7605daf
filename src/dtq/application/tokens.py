"""Scoped API tokens: create, list, revoke, and authenticate a request's secret (issue 15 item 3).

:class:`TokenService` is what the CLI (``dtq token``) and the API's auth guard call. The secret
exists only in the caller's hands: :meth:`TokenService.create` returns it once and stores its
hash (``dtq.domain.tokens.hash_secret``); :meth:`TokenService.authenticate` hashes what a request
presents, finds the token by that hash and compares the hashes with ``hmac.compare_digest``.

Authentication results (good and bad) are cached in the process for at most ``cache_ttl``
seconds (1 s by default, never past a token's expiry), keyed by the hash, never the secret, so
a busy API reads each token from the database about once a second, and a revocation or an
expiry is seen by every API process within that second.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from dtq.application.ports import Clock, Store, Transaction
from dtq.domain.errors import BackendUnavailable
from dtq.domain.tokens import (
    SECRET_PREFIX,
    ApiToken,
    Forbidden,
    InvalidExpiry,
    InvalidScope,
    Scope,
    TokenNotFound,
    Unauthenticated,
    check_name,
    hash_secret,
    new_secret,
    same_hash,
)

#: Longest token lifetime accepted by :meth:`TokenService.create`: ten years, in seconds.
MAX_LIFETIME = 3650 * 86400.0
#: Default bound of the authentication cache, in seconds (issue 15: "no cache longer than a
#: second or two").
CACHE_TTL = 1.0
#: Most secrets' results kept in the cache; the oldest entry is dropped when it is full.
CACHE_SIZE = 4096
#: How long, in seconds, a token the database confirmed stays usable while the database cannot
#: be asked (an outage): its holder's Redis-only calls (an HTTP worker's heartbeats) go on.
OUTAGE_GRACE = 600.0


@dataclass(frozen=True, slots=True)
class Principal:
    """The token a request authenticated with (what the API knows of the caller).

    Attributes:
        name: the token's name (safe to log: it is not the secret).
        scopes: what it may do.
    """

    name: str
    scopes: frozenset[Scope]

    def require(self, scope: Scope) -> None:
        """Return if the token holds ``scope``.

        Raises:
            Forbidden: it does not (HTTP 403 ``forbidden``, naming the scope needed).
        """
        if scope not in self.scopes:
            raise Forbidden(
                f"this route needs a token with the {scope.value!r} scope", field="Authorization"
            )


@dataclass(frozen=True, slots=True)
class CreatedToken:
    """What :meth:`TokenService.create` returns: the stored token and its secret (shown once).

    Attributes:
        token: the token as stored (its hash, never the secret).
        secret: the secret to hand to the client; it cannot be recovered later.
    """

    token: ApiToken
    secret: str


@dataclass(frozen=True, slots=True)
class Revoked:
    """What :meth:`TokenService.revoke` returns.

    Attributes:
        token: the token with its ``revoked_at`` (the first revocation's time).
        newly: False when it was revoked already (the call changed nothing).
    """

    token: ApiToken
    newly: bool


@dataclass(frozen=True, slots=True)
class _Cached:
    principal: Principal | None  # None: refused
    reason: str  # why refused (the Unauthenticated detail)
    until: datetime  # host clock: reused without asking until then
    confirmed: datetime  # host clock: when the database said so
    expires: datetime | None  # host clock: the token's expiry, None: never


class TokenService:
    """Tokens on the ``Store`` port, with the API's short-lived authentication cache.

    Args:
        store: the system of record (``tx.tokens``).
        clock: the host clock, for the cache's ages only; expiry is judged on the database clock
            (``tx.now()``) when a token is read.
        cache_ttl: seconds an authentication result may be reused (0 disables the cache).
        cache_size: most cached results.
        outage_grace: seconds a token the database accepted stays accepted while the database
            cannot be asked (see :meth:`authenticate`); 0: never.
    """

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        cache_ttl: float = CACHE_TTL,
        cache_size: int = CACHE_SIZE,
        outage_grace: float = OUTAGE_GRACE,
    ) -> None:
        self._store = store
        self._clock = clock
        self._ttl = timedelta(seconds=cache_ttl)
        self._size = cache_size
        self._grace = timedelta(seconds=outage_grace)
        self._cache: dict[str, _Cached] = {}

    async def create(
        self, name: str, scopes: Collection[Scope], *, expires_in: float | None = None
    ) -> CreatedToken:
        """Create a token and return it with its new secret.

        Args:
            name: unique name (see ``dtq.domain.tokens.NAME_PATTERN``).
            scopes: at least one scope.
            expires_in: lifetime in seconds from now (database clock), or None for no expiry.

        Raises:
            InvalidTokenName, InvalidScope, InvalidExpiry: bad arguments (HTTP 400 family).
            TokenNameTaken: the name is taken (409 family).
            BackendUnavailable: the database failed.
        """
        check_name(name)
        if not scopes:
            raise InvalidScope("at least one scope is required", field="scopes")
        if expires_in is not None and not 0 < expires_in <= MAX_LIFETIME:
            raise InvalidExpiry(field="expires")
        secret = new_secret()

        async def add(tx: Transaction) -> ApiToken:
            now = await tx.now()
            token = ApiToken(
                id=uuid4(),
                name=name,
                secret_hash=hash_secret(secret),
                scopes=frozenset(scopes),
                created_at=now,
                expires_at=None if expires_in is None else now + timedelta(seconds=expires_in),
            )
            await tx.tokens.add(token)
            return token

        return CreatedToken(token=await self._store.run(add), secret=secret)

    async def list_tokens(self) -> list[ApiToken]:
        """Every token (revoked and expired included), ordered by name."""

        async def read(tx: Transaction) -> list[ApiToken]:
            return await tx.tokens.list_all()

        return await self._store.run(read)

    async def revoke(self, name: str) -> Revoked:
        """Revoke the token named ``name`` (idempotent: a second call changes nothing).

        API processes refuse it within ``cache_ttl``; this process at once.

        Raises:
            TokenNotFound: no token has this name (``field="name"``).
        """

        async def revoke(tx: Transaction) -> Revoked:
            token = await tx.tokens.get_by_name(name)
            if token is None:
                raise TokenNotFound(f"no token is named {name!r}", field="name")
            now = await tx.now()
            newly = await tx.tokens.set_revoked(token.id, now)
            return Revoked(token=token.revoke(at=now), newly=newly)

        revoked = await self._store.run(revoke)
        self._cache.pop(revoked.token.secret_hash, None)
        return revoked

    async def authenticate(self, secret: str | None) -> Principal:
        """The token ``secret`` belongs to, if it is usable now.

        Args:
            secret: what the request presented (the part after ``Bearer``), or None.

        While the database cannot be asked, a token it accepted in this process within the
        last ``outage_grace`` seconds (and not expired since) is accepted still, so that calls
        served without the database go on (an HTTP worker's heartbeats renew its leases in
        Redis alone); a revocation written just before the outage may thus take up to that
        long to reach this process. Any other token is a 503 then.

        Raises:
            Unauthenticated: no secret, an unknown one, or an expired or revoked token (HTTP 401).
                The message never contains the secret or its hash.
            BackendUnavailable: the database could not be asked, and the token was not
                confirmed within ``outage_grace`` (HTTP 503).
        """
        digest = secret_digest(secret)
        now = self._clock.now()
        cached = self._cache.get(digest)
        if cached is not None and now < cached.until:
            return _result(cached)

        async def read(tx: Transaction) -> tuple[ApiToken | None, datetime]:
            return await tx.tokens.get_by_hash(digest), await tx.now()

        try:
            token, db_now = await self._store.run(read)
        except BackendUnavailable:
            if cached is not None and cached.principal is not None and self._usable(cached, now):
                return cached.principal
            raise
        entry = _judge(token, digest, db_now, now, self._ttl)
        if self._ttl > timedelta(0) or self._grace > timedelta(0):
            self._remember(digest, entry)
        return _result(entry)

    def _usable(self, cached: _Cached, now: datetime) -> bool:
        """Whether an accepted result may stand in for the database's answer at ``now``."""
        fresh = now - cached.confirmed <= self._grace
        return fresh and (cached.expires is None or now < cached.expires)

    def _remember(self, digest: str, entry: _Cached) -> None:
        self._cache.pop(digest, None)
        while len(self._cache) >= self._size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[digest] = entry

    @property
    def cached(self) -> int:
        """How many authentication results the cache holds (for tests and metrics)."""
        return len(self._cache)


def _judge(
    token: ApiToken | None, digest: str, db_now: datetime, host_now: datetime, ttl: timedelta
) -> _Cached:
    """The cache entry for a token read at ``db_now`` (database clock) and ``host_now`` (host
    clock): refused, or accepted for ``ttl`` or until its expiry, whichever comes first."""
    until = host_now + ttl
    try:
        principal = principal_of(token, digest, db_now)
    except Unauthenticated as exc:
        return _Cached(None, exc.detail, until, host_now, None)
    expires = None
    if token is not None and token.expires_at is not None:
        expires = host_now + (token.expires_at - db_now)
        until = min(until, expires)
    return _Cached(principal, "", until, host_now, expires)


def secret_digest(secret: str | None) -> str:
    """The stored hash of a presented ``secret`` (``hash_secret``), once it looks like one.

    Raises:
        Unauthenticated: no secret, or one that cannot be a dtq API token (no ``dtq_``
            prefix, or over 200 characters).
    """
    if not secret:
        raise Unauthenticated()
    if not secret.startswith(SECRET_PREFIX) or len(secret) > 200:
        raise Unauthenticated("the bearer token is not a dtq API token")
    return hash_secret(secret)


def principal_of(token: ApiToken | None, digest: str, at: datetime) -> Principal:
    """The caller ``token`` names, found by the secret hash ``digest``, if it is usable at
    ``at`` (database clock).

    Raises:
        Unauthenticated: no token, a hash that does not match (compared in constant time), or
            a revoked or expired token; the message says which, never the secret or its hash.
    """
    if token is None or not same_hash(token.secret_hash, digest):
        raise Unauthenticated("the API token is not valid")
    if token.revoked_at is not None:
        raise Unauthenticated("the API token was revoked")
    if not token.usable_at(at):
        raise Unauthenticated("the API token has expired")
    return Principal(name=token.name, scopes=token.scopes)


def _result(entry: _Cached) -> Principal:
    if entry.principal is None:
        raise Unauthenticated(entry.reason)
    return entry.principal
