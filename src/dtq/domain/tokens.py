"""API tokens (issue 15 item 3): scopes, the token entity, the secret and its hash, the errors.

A token's secret is ``dtq_`` followed by 32 random bytes in URL-safe base64 (43 characters):
256 bits of entropy, so a fast hash is enough to store it (no password-hashing work factor is
needed: nobody can guess a 256-bit value, and the hash cannot be reversed). Only
:func:`hash_secret`'s SHA-256 hex digest is ever stored; the secret is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from dtq.domain.errors import Conflict, DtqError, NotFound, ValidationError

#: Every secret starts with this, so a leaked one is recognisable (secret scanners, logs).
SECRET_PREFIX = "dtq_"  # noqa: S105  (a public prefix, not a secret)
#: Random bytes in a secret (256 bits).
SECRET_BYTES = 32
#: A token name: 1..64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Scope(StrEnum):
    """What a token may do. Scopes are independent: ``admin`` does not imply ``read``."""

    SUBMIT = "submit"  # POST /v1/jobs, /v1/tasks, /v1/artifacts
    READ = "read"  # every GET/HEAD under /v1 (and /metrics with METRICS_AUTH)
    ADMIN = "admin"  # every other /v1 route: cancel, retry, bulk, tokens, webhooks
    WORKER = "worker"  # everything under /v1/worker/ (the HTTP worker protocol)


# --- errors -------------------------------------------------------------------------------------


class Unauthenticated(DtqError):
    """A valid API token is required: send the header Authorization: Bearer <token>.

    ``field`` is ``Authorization`` unless given.
    """

    code = "unauthenticated"

    def __init__(self, detail: str | None = None, *, field: str | None = "Authorization") -> None:
        super().__init__(detail, field=field)


class Forbidden(DtqError):
    """The token does not have the scope this route needs."""

    code = "forbidden"


class InvalidScope(ValidationError):
    """Not a known scope (submit, read, admin, worker)."""

    code = "invalid_scope"


class InvalidTokenName(ValidationError):
    """A token name is 1..64 letters, digits, '.', '_' or '-', starting with a letter or digit."""

    code = "invalid_token_name"


class InvalidExpiry(ValidationError):
    """A token's lifetime must be positive and at most ten years."""

    code = "invalid_expiry"


class TokenNameTaken(Conflict):
    """Another token already has this name."""

    code = "token_name_taken"


class TokenNotFound(NotFound):
    """No token has this name."""

    code = "token_not_found"


# --- values -------------------------------------------------------------------------------------


def parse_scopes(text: str) -> frozenset[Scope]:
    """``"submit,read"`` -> ``{Scope.SUBMIT, Scope.READ}`` (spaces around names ignored).

    Raises:
        InvalidScope: an empty list, or a name that is not a :class:`Scope` (``field="scopes"``).
    """
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise InvalidScope("at least one scope is required (submit, read, admin, worker)")
    known = {scope.value: scope for scope in Scope}
    unknown = [name for name in names if name not in known]
    if unknown:
        allowed = ", ".join(scope.value for scope in Scope)
        raise InvalidScope(f"unknown scope {unknown[0]!r} (use {allowed})", field="scopes")
    return frozenset(known[name] for name in names)


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid token name.

    Raises:
        InvalidTokenName: see the class docstring (``field="name"``).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidTokenName(field="name")
    return name


def new_secret() -> str:
    """A new random secret: ``dtq_`` + 43 URL-safe characters (:data:`SECRET_BYTES` bytes)."""
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    """The stored form of a secret: its SHA-256 as 64 lowercase hex digits."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def same_hash(stored: str, computed: str) -> bool:
    """Compare two hashes in constant time (``hmac.compare_digest``)."""
    return hmac.compare_digest(
        stored.encode("ascii", "replace"), computed.encode("ascii", "replace")
    )


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One API token as stored: never the secret, only its hash.

    Attributes:
        id: the token's id (random UUID).
        name: unique, chosen by the operator (``dtq token create --name``).
        secret_hash: :func:`hash_secret` of the secret.
        scopes: what it may do.
        created_at: when it was created (database clock).
        expires_at: when it stops working, or None for never.
        revoked_at: when it was revoked, or None.
    """

    id: UUID
    name: str
    secret_hash: str
    scopes: frozenset[Scope]
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def usable_at(self, at: datetime) -> bool:
        """True when the token is neither revoked nor expired at ``at``."""
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or at < self.expires_at

    def revoke(self, *, at: datetime) -> ApiToken:
        """This token revoked at ``at``; an already revoked one keeps its first ``revoked_at``."""
        if self.revoked_at is not None:
            return self
        return replace(self, revoked_at=at)
