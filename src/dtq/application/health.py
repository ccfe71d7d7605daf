"""Health of the backing services (spec §7 GET /healthz)."""

from __future__ import annotations

from dtq.application.ports import Queue, Store


class HealthService:
    """Pings the store and the queue.

    Args:
        store: the system of record.
        queue: the fast path.
    """

    def __init__(self, *, store: Store, queue: Queue) -> None:
        self._store = store
        self._queue = queue

    async def check(self) -> dict[str, str | None]:
        """Ping both backends.

        Returns:
            ``{"store": None | error text, "queue": None | error text}``; None means healthy.
            Never raises for a backend failure.
        """
        result: dict[str, str | None] = {}
        for name, ping in (("store", self._store.ping), ("queue", self._queue.ping)):
            try:
                await ping()
            except Exception as exc:  # a health check reports every failure
                result[name] = f"{type(exc).__name__}: {exc}"
            else:
                result[name] = None
        return result
