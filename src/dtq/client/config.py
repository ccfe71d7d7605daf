"""Where the client connects and with which token: arguments, else ``DTQ_URL`` / ``DTQ_TOKEN``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_URL", "ClientConfig"]

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
            ValueError: the URL is not http(s), or ``retries`` is negative.
        """
        env = os.environ if environ is None else environ
        base = (url or env.get("DTQ_URL") or DEFAULT_URL).rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"DTQ_URL must start with http:// or https://, got {base!r}")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        return cls(url=base, token=token or env.get("DTQ_TOKEN") or None, retries=retries)

    def headers(self) -> dict[str, str]:
        """Headers sent with every request."""
        headers = {"Content-Type": "application/json", "User-Agent": "dtq-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers
