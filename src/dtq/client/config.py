"""Where the client connects and with which token: arguments, else ``DTQ_URL`` / ``DTQ_TOKEN``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from dtq.entrypoints.api.schemas import IDEMPOTENCY_KEY_MAX

__all__ = [
    "DEFAULT_URL",
    "ClientConfig",
    "idempotency_key_problem",
    "token_problem",
    "url_problem",
]

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """A client's resolved settings.

    Attributes:
        url: base URL without a trailing slash.
        token: bearer token, or None (the orchestrator runs with ``API_AUTH=none``).
        retries: re-sends after 429/503 or an unreachable server (>= 0).
    """

    url: str
    token: str | None
    retries: int

    @classmethod
    def resolve(
        cls,
        url: str | None,
        token: str | None,
        retries: int,
        environ: Mapping[str, str] | None = None,
    ) -> ClientConfig:
        """Arguments win over the environment.

        Raises:
            ValueError: the URL is one the client cannot connect to (:func:`url_problem`), the
                token cannot be sent in a header (:func:`token_problem`; it is not shown), or
                ``retries`` is negative.
        """
        env = os.environ if environ is None else environ
        base = url or env.get("DTQ_URL") or DEFAULT_URL
        if (problem := url_problem(base)) is not None:
            raise ValueError(f"DTQ_URL {problem}, got {base!r}")
        chosen = token or env.get("DTQ_TOKEN") or None
        if chosen is not None and (problem := token_problem(chosen)) is not None:
            raise ValueError(f"DTQ_TOKEN {problem}")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        return cls(url=base.rstrip("/"), token=chosen, retries=retries)

    def headers(self) -> dict[str, str]:
        """Headers sent with every request."""
        headers = {"Content-Type": "application/json", "User-Agent": "dtq-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


def url_problem(url: str) -> str | None:
    """What keeps the client from connecting to ``url`` (``"names no host"``), or None."""
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https://"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        return f"not a URL ({exc})"
    if not parts.hostname:
        return "names no host"
    try:
        port = parts.port
    except ValueError:  # not a number, or beyond 65535
        port = 0
    if port == 0:
        return "the port must be a number in 1..65535"
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"not a URL ({exc})"
    return None


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be sent as a bearer token's header (it is never quoted), or None."""
    if all("!" <= char <= "~" for char in token):
        return None
    return (
        "holds a character not allowed in a bearer token's HTTP header"
        " (printable ASCII without spaces only)"
    )


def idempotency_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be sent as a submit's ``Idempotency-Key`` header, or None: the API's
    bounds (1 to ``IDEMPOTENCY_KEY_MAX`` characters of printable ASCII), and no space at
    either end, which HTTP drops (the key stored would not be the one given)."""
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        return f"must be 1 to {IDEMPOTENCY_KEY_MAX} characters long, got {len(key)}"
    if not (key.isascii() and key.isprintable()):
        return "printable ASCII characters only (0x20-0x7E)"
    if key[0] == " " or key[-1] == " ":
        return "no space at either end (HTTP drops it, so another key would be stored)"
    return None
