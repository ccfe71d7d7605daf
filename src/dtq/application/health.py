"""Health of the backing services (spec §7 GET /healthz)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dtq.application.ports import Queue, Store

#: Seconds one backend ping may take before it counts as down. ``/healthz`` must answer within
#: 2 s whatever state the backends are in (issue 12); both pings run at the same time.
DEFAULT_PING_TIMEOUT = 1.5


class HealthService:
    """Pings the store and the queue, concurrently and each within a time bound.

    Args:
        store: the system of record.
        queue: the fast path.
        timeout: seconds each ping may take (> 0); a slower one is reported as down.
    """

    def __init__(
        self, *, store: Store, queue: Queue, timeout: float = DEFAULT_PING_TIMEOUT
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self._store = store
        self._queue = queue
        self._timeout = timeout
        # Timed-out pings still unwinding: referenced so they are not garbage-collected.
        self._unwinding: set[asyncio.Future[None]] = set()

    async def check(self) -> dict[str, str | None]:
        """Ping both backends; return within about ``timeout`` seconds.

        Returns:
            ``{"store": None | error text, "queue": None | error text}``; None means healthy.
            The error text names the failure (``BackendUnavailable: database unreachable:
            ...``, or ``TimeoutError: no answer within 1.5s``). Never raises for a backend
            failure.
        """
        store, queue = await asyncio.gather(
            self._ping(self._store.ping), self._ping(self._queue.ping)
        )
        return {"store": store, "queue": queue}

    async def _ping(self, ping: Callable[[], Awaitable[None]]) -> str | None:
        # Not wait_for: it waits for the cancelled ping to finish, and a ping cancelled mid-query
        # may take long to unwind (psycopg sends the server a cancel request and waits up to
        # 10 s for it on a black-holed database). The slow ping is cancelled and left to unwind
        # on its own; the answer does not wait for it.
        task = asyncio.ensure_future(ping())
        done, _ = await asyncio.wait({task}, timeout=self._timeout)
        if not done:
            task.cancel()
            self._unwinding.add(task)
            task.add_done_callback(self._unwound)
            return f"TimeoutError: no answer within {self._timeout:g}s"
        try:
            task.result()
        except Exception as exc:  # a health check reports every failure
            return f"{type(exc).__name__}: {exc}"
        return None

    def _unwound(self, task: asyncio.Future[None]) -> None:
        self._unwinding.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log "never retrieved"
