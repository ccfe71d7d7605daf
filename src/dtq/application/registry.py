"""The optional worker registry (spec §4 ``workers``, §8 WORKER_HEARTBEAT_INTERVAL)."""

from __future__ import annotations

from typing import Any

from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Worker


class WorkerRegistryService:
    """Upserts a worker's registry row. Nothing in the claim path depends on it.

    Args:
        store: the system of record.
        queue_prefix: the Redis key prefix (hash-tagged form) the leases of the workers this
            service registers live under, written to each row (``Worker.redis_key_prefix``: a
            reconciler on another prefix leaves their runs alone); None leaves it unset.
    """

    def __init__(self, *, store: Store, queue_prefix: str | None = None) -> None:
        self._store = store
        self._queue_prefix = queue_prefix

    async def heartbeat(
        self, worker_id: str, hostname: str | None, metadata: dict[str, Any]
    ) -> None:
        """Record that ``worker_id`` is alive now (database clock).

        Args:
            worker_id: stable worker identity (``WORKER_ID``).
            hostname: the host it runs on.
            metadata: JSON object, e.g. ``{"kinds": [...], "concurrency": 4}``.

        Raises:
            BackendUnavailable: the database failed.
        """

        async def upsert(tx: Transaction) -> None:
            now = await tx.now()
            await tx.workers.upsert(
                Worker(
                    id=worker_id,
                    hostname=hostname,
                    last_heartbeat_at=now,
                    metadata=metadata,
                    redis_key_prefix=self._queue_prefix,
                )
            )

        await self._store.run(upsert)
