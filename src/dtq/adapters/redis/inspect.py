"""Redis implementation of the ``QueueInspector`` port (explain, issue 14 item 7).

Reads, in one MULTI/EXEC (one round trip, one instant), the keys ``RedisQueue`` writes for a task
(key layout in ``dtq.adapters.redis.keys``): PTTL of ``queue:pending:{id}``, HGETALL and PTTL of
``lease:task:{id}``, ZSCORE of ``"{priority}|{id}"`` in ``queue:scheduled``, LLEN of
``queue:ready:{priority}``, LPOS of the id searched from the list's oldest end (RANK -1, MAXLEN
``scan_limit``: O(scan_limit) on the server at most), the list's books (GET of its push counter,
ZSCORE of the id in its listed set: ``scripts._BOOKS``) and the server's TIME (read by the
``scripts.SERVER_TIME`` script on the scheduled set's key, so that on a Redis Cluster it has a
slot, runs in the same MULTI on the slot's master and the snapshot is one instant there too:
redis-py refuses the keyless TIME in a cluster pipeline); given the task's kind, also the
LLEN, LPOS and books of the routed list of its (priority, kind) (kind-aware routing). The place
comes from LPOS when the id is among the oldest ``scan_limit`` entries (its oldest entry), else
from the books, exact at any depth (the entry of its latest push); only an id pushed without
books (by an older version) deeper than ``scan_limit`` has no known place. Read-only, so it is
re-sent after a lost reply (``connection.idempotent``). Never on the claim path. Every key shares
the deployment's hash tag, so the MULTI is one slot on Redis Cluster too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from dtq.adapters.redis import scripts
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


def _place(depth: int, replies: list[Any], scan_limit: int) -> tuple[int | None, int]:
    """``(ready_position, searched)`` of an id on a list of ``depth`` entries, from LPOS's
    ``index`` (from the head; None: not among the oldest ``scan_limit``) and the list's books
    (GET of its push counter, ZSCORE of the id: None when absent). The list holds the pushes
    numbered ``pushes - depth + 1 .. pushes``, the oldest one next to be popped. With a score,
    the books settle the question for the whole list (``searched`` = ``depth``)."""
    index, pushes, seq = replies
    if index is not None:
        return depth - 1 - int(index), depth if seq is not None else min(depth, scan_limit)
    if seq is None:
        return None, min(depth, scan_limit)
    pushed = int(as_text(pushes)) if pushes is not None else 0
    popped, number = pushed - depth, int(float(seq))
    return (number - popped - 1 if popped < number <= pushed else None), depth


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
        """One MULTI/EXEC of nine reads, thirteen with ``kind`` (see the module docstring).

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        keys = self._keys
        lease_key = keys.lease(task_id)
        member = str(task_id)
        lists = [keys.ready_books(priority)]
        if kind is not None:
            lists.append(keys.routed_books(priority, kind))

        async def read() -> list[Any]:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.pttl(keys.marker(task_id))
                pipe.hgetall(lease_key)
                pipe.pttl(lease_key)
                pipe.zscore(keys.scheduled, f"{priority}|{task_id}")
                # TIME through a script on the queue's key, not TIME itself: a keyless
                # command has no slot, and redis-py refuses it in a cluster pipeline.
                pipe.eval(scripts.SERVER_TIME, 1, keys.scheduled)
                for list_key, pushes_key, listed_key in lists:
                    pipe.llen(list_key)
                    pipe.lpos(list_key, member, rank=-1, maxlen=self._scan_limit)
                    pipe.get(pushes_key)
                    pipe.zscore(listed_key, member)
                return list(await pipe.execute())

        replies = await idempotent("inspect", read)
        marker_pttl, lease_raw, lease_pttl, score, (secs, micros) = replies[:5]
        places = [
            (
                int(replies[at]),
                *_place(int(replies[at]), replies[at + 1 : at + 4], self._scan_limit),
            )
            for at in range(5, len(replies), 4)
        ]
        routed = len(places) > 1 and places[1][1] is not None
        depth, position, searched = places[1] if routed else places[0]
        lease = _lease(task_id, lease_raw)
        return QueueSnapshot(
            server_time=_EPOCH + timedelta(seconds=int(secs), microseconds=int(micros)),
            marker_ttl=_ttl(int(marker_pttl)),
            lease=lease,
            lease_ttl=_ttl(int(lease_pttl)) if lease is not None else None,
            scheduled_at=None if score is None else _EPOCH + timedelta(milliseconds=score),
            ready_depth=depth,
            ready_position=position,
            searched=searched,
            routed=routed,
        )
