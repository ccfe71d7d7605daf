"""The optional worker registry (spec §4 ``workers``, §8 WORKER_HEARTBEAT_INTERVAL)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from dtq.application.fleet import advertised
from dtq.application.ports import Store, Transaction
from dtq.domain.entities import Worker


class WorkerRegistryService:
    """Upserts and removes a worker's registry row. Nothing in the claim path depends on it.

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
            metadata: JSON object, e.g. ``{"kinds": [...], "concurrency": 4}``; replaces the
                row's.

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

    async def serving(
        self,
        worker_id: str,
        *,
        kinds: Collection[str],
        priorities: Sequence[str],
        live_within: float,
    ) -> None:
        """Record that ``worker_id`` is alive now and serves ``kinds`` on ``priorities`` (a
        worker that claims over HTTP), keeping the rest of its row.

        A row whose heartbeat is within ``live_within`` seconds keeps its hostname and
        metadata, and gains the kinds and priorities it does not list yet (a row without a
        list of strings there lists none); an older row, or none, becomes
        ``{"kinds": [...], "priorities": [...]}`` with its hostname kept.

        Raises:
            BackendUnavailable: the database failed.
        """

        async def upsert(tx: Transaction) -> None:
            now = await tx.now()
            row = await tx.workers.get(worker_id)
            live = row is not None and row.last_heartbeat_at >= now - timedelta(seconds=live_within)
            metadata = dict(row.metadata) if row is not None and live else {}
            metadata["kinds"] = _widened(metadata, "kinds", sorted(kinds))
            metadata["priorities"] = _widened(metadata, "priorities", priorities)
            await tx.workers.upsert(
                Worker(
                    id=worker_id,
                    hostname=None if row is None else row.hostname,
                    last_heartbeat_at=now,
                    metadata=metadata,
                    redis_key_prefix=self._queue_prefix,
                )
            )

        await self._store.run(upsert)

    async def remove(self, worker_id: str) -> bool:
        """Delete ``worker_id``'s row (a worker that stops on purpose); idempotent.

        Returns:
            True when a row was deleted; False when there was none.

        Raises:
            BackendUnavailable: the database failed.
        """

        async def delete(tx: Transaction) -> bool:
            return await tx.workers.delete(worker_id)

        return await self._store.run(delete)


def _widened(metadata: dict[str, Any], key: str, more: Sequence[str]) -> list[str]:
    """``metadata[key]`` (when :func:`~dtq.application.fleet.advertised` reads it as a list)
    followed by the values of ``more`` it lacks."""
    names = list(metadata[key]) if advertised(metadata, key) is not None else []
    names.extend(v for v in more if v not in names)
    return names
