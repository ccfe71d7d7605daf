"""``HttpxWebhookSender``: webhook requests over httpx (issue 16 item 2).

One shared ``httpx.AsyncClient`` (connection pooling per host), opened on the first request on
the running event loop and closed by :meth:`HttpxWebhookSender.aclose`; every request has the whole
timeout (connect, write, read, pool) bounded by ``timeout`` seconds, redirects are never followed
(a delivery goes to the configured url only) and no proxy or ``.netrc`` from the environment is
used. The response body is read and discarded (at most :data:`MAX_RESPONSE_BYTES`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from dtq.application.ports import DeliveryFailed

#: Most response bytes read before the connection is dropped.
MAX_RESPONSE_BYTES = 64 * 1024


class HttpxWebhookSender:
    """``WebhookSender`` on httpx.

    Args:
        timeout: seconds one request may take in all (``WEBHOOK_TIMEOUT``).
    """

    def __init__(self, *, timeout: float) -> None:
        self._timeout = timeout
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self._timeout),
                follow_redirects=False,
                trust_env=False,
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
            )
        return self._client

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        """See the port.

        Raises:
            DeliveryFailed: connect/TLS/protocol error or no answer within the timeout.
        """
        try:
            async with asyncio.timeout(self._timeout):
                async with self._http().stream(
                    "POST", url, content=body, headers=dict(headers)
                ) as response:
                    read = 0
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read > MAX_RESPONSE_BYTES:
                            break
                    return response.status_code
        except TimeoutError:
            raise DeliveryFailed(f"no response within {self._timeout:g}s") from None
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:300]) from None

    async def aclose(self) -> None:
        """Close the connections (a later request opens new ones)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
