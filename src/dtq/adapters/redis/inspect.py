"""Redis implementation of the ``QueueInspector`` port (explain, issue 14 item 7).

Reads, in one MULTI/EXEC (one round trip, one instant), the keys ``RedisQueue`` writes for a task
(key layout in ``dtq.adapters.redis.keys``): PTTL of ``queue:pending:{id}``, HGETALL and PTTL of
``lease:task:{id}``, ZSCORE of ``"{priority}|{id}"`` in ``queue:scheduled``, LLEN of
``queue:ready:{priority}``, LPOS of the id searched from the list's oldest end (RANK -1, MAXLEN
``scan_limit``: O(scan_limit) on the server at most) and TIME; given the task's kind, also LLEN
and LPOS of the routed list of its (priority, kind) (kind-aware routing). Read-only, so it is
re-sent after a lost reply (``connection.idempotent``). Never on the claim path. Every key shares
the deployment's hash tag, so the MULTI is one slot on Redis Cluster too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from dtq.adapters.redis.connection import RedisClient, as_text, idempotent
from dtq.adapters.redis.keys import KeyLayout
from dtq.application.ports import Lease, QueueSnapshot

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: How many of a ready list's oldest entries ``inspect`` searches for the task by default.
DEFAULT_SCAN_LIMIT = 10_000


def _ttl(pttl: int) -> float | None:
    """PTTL's reply in seconds; None for a missing key (-2). A key without expiry (-1, which
    dtq never writes) reads as None too."""
    return pttl / 1000 if pttl >= 0 else None


def _lease(task_id: UUID, raw: dict[Any, Any]) -> Lease | None:
    fields = {as_text(name): as_text(value) for name, value in raw.items()}
    try:
        return Lease(
            task_id=task_id,
            worker_id=fields["worker_id"],
            run_id=UUID(fields["run_id"]),
            deadline_ms=int(fields["deadline_ms"]),
        )
    except (KeyError, ValueError):
        return None


class RedisQueueInspector:
    """``QueueInspector`` on the keys of a ``RedisQueue`` (same client and prefix).

    Args:
        client: a Redis or Redis Cluster client (from ``connect_redis``).
        prefix: key namespace, ``REDIS_KEY_PREFIX`` (spec §8), as the queue's (tagged by
            ``KeyLayout``).
        scan_limit: how many of the ready list's oldest entries are searched for the task.
    """

    def __init__(
        self, client: RedisClient, *, prefix: str, scan_limit: int = DEFAULT_SCAN_LIMIT
    ) -> None:
        self._client = client
        self._keys = KeyLayout(prefix)
        self._scan_limit = scan_limit

    async def inspect(self, task_id: UUID, priority: str, kind: str | None = None) -> QueueSnapshot:
        """One MULTI/EXEC of seven reads, nine with ``kind`` (see the module docstring).

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        keys = self._keys
        ready_key = keys.ready(priority)
        lease_key = keys.lease(task_id)

        async def read() -> list[Any]:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.pttl(keys.marker(task_id))
                pipe.hgetall(lease_key)
                pipe.pttl(lease_key)
                pipe.zscore(keys.scheduled, f"{priority}|{task_id}")
                pipe.llen(ready_key)
                pipe.lpos(ready_key, str(task_id), rank=-1, maxlen=self._scan_limit)
                pipe.time()
                if kind is not None:
                    routed_key = keys.routed(priority, kind)
                    pipe.llen(routed_key)
                    pipe.lpos(routed_key, str(task_id), rank=-1, maxlen=self._scan_limit)
                return list(await pipe.execute())

        replies = await idempotent("inspect", read)
        marker_pttl, lease_raw, lease_pttl, score, depth, index, (secs, micros) = replies[:7]
        routed = len(replies) > 7 and replies[8] is not None
        if routed:
            depth, index = replies[7], replies[8]
        lease = _lease(task_id, lease_raw)
        depth = int(depth)
        return QueueSnapshot(
            server_time=_EPOCH + timedelta(seconds=int(secs), microseconds=int(micros)),
            marker_ttl=_ttl(int(marker_pttl)),
            lease=lease,
            lease_ttl=_ttl(int(lease_pttl)) if lease is not None else None,
            scheduled_at=None if score is None else _EPOCH + timedelta(milliseconds=score),
            ready_depth=depth,
            ready_position=None if index is None else depth - 1 - int(index),
            searched=min(depth, self._scan_limit),
            routed=routed,
        )
