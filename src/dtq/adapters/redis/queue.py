"""Redis implementation of the ``Queue`` port (spec §5 "Redis data model", DESIGN §3-§4).

Keys, all under a configurable prefix (``REDIS_KEY_PREFIX``, default ``dto:``):

=====================================  ======  ==================================================
``{prefix}queue:ready:{priority}``     LIST    LPUSH on enqueue, BRPOP over tiers in order
``{prefix}queue:pending:{task_id}``    STRING  pending marker, ``SET NX PX marker_ttl``, value "1"
``{prefix}lease:task:{task_id}``       HASH    ``worker_id``, ``run_id``, ``deadline_ms``; PEXPIRE
``{prefix}queue:scheduled``            ZSET    score = due time in Unix epoch milliseconds
=====================================  ======  ==================================================

Scheduled-set member encoding: ``"{priority}|{task_id}"`` (task id in canonical lowercase
hyphenated UUID form). It is split at the *last* ``|``, so a priority name may itself contain
``|``. The same task scheduled under two priorities is two members; re-scheduling under the same
priority moves the due time (ZADD overwrites the score).

Every compound operation is one Lua script (``dtq.adapters.redis.scripts``) registered once per
``RedisQueue``: enqueue (marker + LPUSH) of one id or a batch, extend and delete of lease hashes
guarded by their ``run_id``, promotion of due scheduled entries (which reads ``TIME``, the Redis
server's clock), and the non-blocking pop of up to N ids over several tiers. Every batch method
costs one round trip, and none for an empty batch.

Known limitation (Redis Cluster): the promotion script computes the per-task marker and ready-list
keys from the prefix passed in ARGV instead of declaring them in KEYS, because they are only known
after reading the sorted set. That is fine on a single Redis or under Sentinel, but on Redis
Cluster it is only correct when every key lives in one hash slot, i.e. when the prefix carries a
hash tag such as ``{dto}:``. The other scripts declare all their keys (but enqueue and the batch
scripts touch several keys, so the same hash-tag advice applies there on Cluster).

Requires Redis >= 6.2 (RPOP with a count; fractional BRPOP timeouts; writes after ``TIME``).
No redis-py exception escapes: driver errors and ``OSError`` become ``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from dtq.adapters.redis import scripts
from dtq.adapters.redis.connection import as_text, wrap_errors
from dtq.application.ports import Lease, LeaseState, QueueEpoch

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_MIN_BLOCK = 0.01  # seconds; BRPOP rounds to ms and a 0 timeout would block forever


def _uuid(value: bytes | str | None) -> UUID | None:
    """Parse a stored id; None for a missing or malformed value."""
    if value is None:
        return None
    try:
        return UUID(as_text(value))
    except ValueError:
        return None


def _ms(seconds: float) -> int:
    """A positive TTL in whole milliseconds (rounded up, at least 1)."""
    if seconds <= 0:
        raise ValueError(f"ttl must be > 0 seconds, got {seconds!r}")
    return max(1, math.ceil(seconds * 1000))


def _epoch_ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError("a timezone-aware datetime is required")
    return (moment - _EPOCH) // _ONE_MS


class RedisQueue:
    """The ``Queue`` port on Redis (spec §5). See the module docstring for keys and scripts.

    Args:
        client: a ``redis.asyncio.Redis`` (from ``connect_redis``); responses may be bytes or str.
        prefix: key namespace, ``REDIS_KEY_PREFIX`` (spec §8).
        marker_ttl: pending-marker lifetime in seconds (float, > 0), sent as PX milliseconds.
        listed_scan_limit: how many of a ready list's oldest entries ``enqueue_unlisted``
            searches for an id before pushing it again.

    Raises:
        ValueError: ``marker_ttl`` is not positive.
    """

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "dto:",
        marker_ttl: float = 60.0,
        listed_scan_limit: int = 10_000,
    ) -> None:
        self._client = client
        self._listed_scan_limit = listed_scan_limit
        self._prefix = prefix
        self._marker_ttl_ms = _ms(marker_ttl)
        self._scheduled_key = f"{prefix}queue:scheduled"
        self._enqueue_many = client.register_script(scripts.ENQUEUE_MANY)
        self._enqueue_unlisted = client.register_script(scripts.ENQUEUE_UNLISTED)
        self._pop_now = client.register_script(scripts.POP_MANY)
        self._set_leases = client.register_script(scripts.SET_LEASES)
        self._extend = client.register_script(scripts.EXTEND_LEASE)
        self._delete_many = client.register_script(scripts.DELETE_LEASES)
        self._promote = client.register_script(scripts.PROMOTE_DUE)
        # BRPOP must return before the client's socket read timeout, or redis-py raises (and
        # retries) a TimeoutError; long waits are therefore cut into slices below that timeout.
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        self._block_slice = (
            math.inf if not socket_timeout else max(socket_timeout - 1.0, socket_timeout / 2)
        )

    def _ready_key(self, priority: str) -> str:
        return f"{self._prefix}queue:ready:{priority}"

    def _ready_keys(self, priorities: Sequence[str]) -> list[str]:
        if isinstance(priorities, str) or not priorities:
            raise ValueError("priorities must be a non-empty sequence of tier names")
        return [self._ready_key(priority) for priority in priorities]

    def _marker_key(self, task_id: UUID) -> str:
        return f"{self._prefix}queue:pending:{task_id}"

    def _lease_key(self, task_id: UUID) -> str:
        return f"{self._prefix}lease:task:{task_id}"

    # --- pending markers ----------------------------------------------------------------------

    async def enqueue(self, task_id: UUID, priority: str) -> bool:
        """SET NX PX the pending marker and LPUSH the id, in one script.

        Returns:
            True when pushed; False when a marker already exists.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        return bool(await self._push(self._enqueue_many, "enqueue", [(task_id, priority)]))

    async def enqueue_many(self, items: Sequence[tuple[UUID, str]]) -> int:
        """``enqueue`` for each ``(task_id, priority)`` in order, in one script (one round trip).

        An id whose marker is live, including one set earlier in the same batch, is skipped.

        Returns:
            How many ids were pushed.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        return await self._push(self._enqueue_many, "enqueue_many", items)

    async def enqueue_unlisted(self, items: Sequence[tuple[UUID, str]]) -> int:
        """``enqueue_many`` that does not push an id still waiting in its ready list (searched
        from the oldest entry, ``listed_scan_limit`` entries at most); one script, one round
        trip. Its cost is O(ids x min(list length, limit)) on the Redis server.

        Returns:
            How many ids were pushed.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        return await self._push(
            self._enqueue_unlisted, "enqueue_unlisted", items, self._listed_scan_limit
        )

    async def _push(
        self,
        script: AsyncScript,
        operation: str,
        items: Sequence[tuple[UUID, str]],
        *extra: int,
    ) -> int:
        """Run an enqueue script over ``(task_id, priority)`` items: KEYS are (marker, ready
        list) pairs, ARGV the marker TTL, then ``extra``, then the ids. Returns how many ids
        were pushed (none and no round trip for no items)."""
        if not items:
            return 0
        keys: list[str] = []
        args: list[str | int] = [self._marker_ttl_ms, *extra]
        for task_id, priority in items:
            keys += (self._marker_key(task_id), self._ready_key(priority))
            args.append(str(task_id))
        with wrap_errors(operation):
            pushed = await script(keys=keys, args=args)
        return int(pushed)

    async def release_marker(self, task_id: UUID) -> None:
        """DEL the pending marker; idempotent. Raises ``BackendUnavailable``."""
        with wrap_errors("release_marker"):
            await self._client.delete(self._marker_key(task_id))

    async def release_markers(self, task_ids: Sequence[UUID]) -> None:
        """One DEL of all the pending markers; idempotent. Raises ``BackendUnavailable``."""
        if not task_ids:
            return
        with wrap_errors("release_markers"):
            await self._client.delete(*(self._marker_key(task_id) for task_id in task_ids))

    async def has_marker(self, task_id: UUID) -> bool:
        """True while the pending marker exists. Raises ``BackendUnavailable``."""
        with wrap_errors("has_marker"):
            return bool(await self._client.exists(self._marker_key(task_id)))

    # --- ready lists --------------------------------------------------------------------------

    async def _take(self, keys: list[str], count: int) -> list[UUID]:
        """Up to ``count`` ids over the tiers in order, without blocking (one script).

        Malformed entries (not UUIDs) are popped and discarded, so fewer may come back.
        """
        raw: list[bytes | str] = await self._pop_now(keys=keys, args=[count])
        return [task_id for task_id in map(_uuid, raw) if task_id is not None]

    async def _pop_one(self, keys: list[str], deadline: float) -> UUID | None:
        """BRPOP until an id arrives or the event-loop time ``deadline`` passes.

        Each BRPOP is kept under the socket read timeout (``_block_slice``); once less than
        ``_MIN_BLOCK`` is left, one non-blocking pass ends the wait (never BRPOP 0, which would
        block forever).
        """
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            if remaining < _MIN_BLOCK:
                found = await self._take(keys, 1)
                return found[0] if found else None
            block = min(remaining, self._block_slice)
            reply = await self._client.brpop(keys, timeout=round(block, 3))
            if reply is not None:
                task_id = _uuid(reply[1])
                if task_id is not None:
                    return task_id
            elif block >= remaining:
                return None

    async def pop(self, priorities: Sequence[str], timeout: float) -> UUID | None:
        """BRPOP over the tiers in order (first non-empty tier wins, oldest id first).

        A malformed list entry (not a UUID) is discarded. If the caller is cancelled while a
        BRPOP is in flight, an id the server already popped is lost; its marker then stalls
        the task until the marker TTL, after which the reconciler re-enqueues it (spec §5).

        Args:
            priorities: tier names, highest first (non-empty).
            timeout: seconds to block; ``<= 0`` does one non-blocking pass (a Lua RPOP per tier),
                never BRPOP 0, which would block forever.

        Returns:
            A task id, or None when nothing arrived within ``timeout``.

        Raises:
            ValueError: ``priorities`` is empty or a bare string.
            BackendUnavailable: Redis failed or is unreachable.
        """
        keys = self._ready_keys(priorities)
        deadline = asyncio.get_running_loop().time() + timeout
        with wrap_errors("pop"):
            return await self._pop_one(keys, deadline)

    async def pop_many(
        self, priorities: Sequence[str], timeout: float, max_count: int
    ) -> list[UUID]:
        """Up to ``max_count`` ids: the first blocking like ``pop``, the rest only if waiting.

        Round trips: when ids are waiting, one script pops up to ``max_count`` over the tiers in
        order and that is all. Otherwise (and only if ``timeout`` allows blocking) ``pop``'s
        BRPOP loop waits for the first id, then the same script takes up to ``max_count - 1``
        more: two round trips. Should that second trip fail, the id already popped is returned
        rather than lost (the next call reports the outage). Cancellation while a call is in
        flight loses what the server already popped, as with ``pop`` (markers stall until TTL).

        Args:
            priorities: tier names, highest first (non-empty).
            timeout: seconds to block for the first id; ``<= 0`` does not block.
            max_count: most ids to return (>= 1).

        Returns:
            Between 0 and ``max_count`` ids, in pop order (tier by tier, oldest first).

        Raises:
            ValueError: ``max_count < 1``, or ``priorities`` is empty or a bare string.
            BackendUnavailable: Redis failed or is unreachable.
        """
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        keys = self._ready_keys(priorities)
        deadline = asyncio.get_running_loop().time() + timeout
        with wrap_errors("pop_many"):
            found = await self._take(keys, max_count)
            if found or timeout < _MIN_BLOCK:
                return found
            first = await self._pop_one(keys, deadline)
            if first is None or max_count == 1:
                return [] if first is None else [first]
            try:
                return [first, *await self._take(keys, max_count - 1)]
            except (RedisError, OSError):
                return [first]

    # --- scheduled set ------------------------------------------------------------------------

    async def schedule(self, task_id: UUID, priority: str, due_at: datetime) -> None:
        """ZADD ``"{priority}|{task_id}"`` scored by ``due_at`` in epoch milliseconds.

        Raises:
            ValueError: ``due_at`` is naive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        member = f"{priority}|{task_id}"
        with wrap_errors("schedule"):
            await self._client.zadd(self._scheduled_key, {member: _epoch_ms(due_at)})

    async def promote_due(self, limit: int) -> int:
        """Move up to ``limit`` entries due by the Redis server clock to their ready lists.

        One script: ZRANGEBYSCORE up to ``TIME``, then per member ZREM, SET NX PX the marker and
        LPUSH only if the marker was set (an entry whose marker exists is dropped).

        Returns:
            How many ids were pushed.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        if limit <= 0:
            return 0
        with wrap_errors("promote_due"):
            pushed = await self._promote(
                keys=[self._scheduled_key], args=[self._prefix, limit, self._marker_ttl_ms]
            )
        return int(pushed)

    # --- leases -------------------------------------------------------------------------------

    async def set_lease(self, lease: Lease, ttl: float) -> None:
        """Replace the lease hash and PEXPIRE it after ``ttl`` seconds (see :meth:`set_leases`).

        Raises:
            ValueError: ``ttl`` is not positive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        await self.set_leases([lease], ttl)

    async def set_leases(self, leases: Sequence[Lease], ttl: float) -> None:
        """``set_lease`` for each lease, all in one script call (one round trip, one command).

        Each hash is replaced whole (DEL, HSET of worker_id, run_id, deadline_ms) and given its
        PEXPIRE inside the script, so it is atomic like a MULTI/EXEC: a client dying mid-send
        cannot leave a hash without its TTL (a lease that never expires would block the reclaim
        of its task forever), and no other client sees a hash between its DEL and its HSET. One
        script instead of three commands per lease: the worker's Redis client packs and parses
        one command per batch (``benchmarks/PROFILE.md``).

        Raises:
            ValueError: ``ttl`` is not positive (checked only when there are leases).
            BackendUnavailable: Redis failed or is unreachable.
        """
        if not leases:
            return
        ttl_ms = _ms(ttl)
        keys = [self._lease_key(lease.task_id) for lease in leases]
        args: list[str | int] = [ttl_ms]
        for lease in leases:
            args += (lease.worker_id, str(lease.run_id), lease.deadline_ms)
        with wrap_errors("set_leases" if len(leases) > 1 else "set_lease"):
            await self._set_leases(keys=keys, args=args)

    async def extend_lease(self, lease: Lease, ttl: float) -> LeaseState:
        """If the hash names ``lease.run_id``: PEXPIRE ``ttl`` seconds, store ``deadline_ms``.

        Returns:
            EXTENDED, MISSING (no hash) or LOST (another run's hash; unchanged).

        Raises:
            ValueError: ``ttl`` is not positive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        args: list[str | int] = [str(lease.run_id), _ms(ttl), lease.deadline_ms]
        with wrap_errors("extend_lease"):
            state = await self._extend(keys=[self._lease_key(lease.task_id)], args=args)
        return LeaseState(as_text(state))

    async def delete_lease(self, task_id: UUID, run_id: UUID) -> None:
        """Delete the lease hash if it names ``run_id``; idempotent.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        await self.delete_leases([(task_id, run_id)])

    async def delete_leases(self, leases: Sequence[tuple[UUID, UUID]]) -> None:
        """Delete each ``(task_id, run_id)`` lease hash that names its run_id, in one script.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        if not leases:
            return
        keys = [self._lease_key(task_id) for task_id, _ in leases]
        args = [str(run_id) for _, run_id in leases]
        with wrap_errors("delete_leases"):
            await self._delete_many(keys=keys, args=args)

    async def leases_present(self, task_ids: Sequence[UUID]) -> set[UUID]:
        """The ids that have a lease hash: one pipelined round trip of EXISTS.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        ids = list(task_ids)
        if not ids:
            return set()
        with wrap_errors("leases_present"):
            async with self._client.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.exists(self._lease_key(task_id))
                found = await pipe.execute()
        return {task_id for task_id, exists in zip(ids, found, strict=True) if exists}

    async def get_lease(self, task_id: UUID) -> Lease | None:
        """HGETALL the lease hash; None when absent or missing a field.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        with wrap_errors("get_lease"):
            raw = await self._client.hgetall(self._lease_key(task_id))
        fields = {as_text(name): as_text(value) for name, value in raw.items()}
        run_id = _uuid(fields.get("run_id"))
        try:
            deadline_ms = int(fields["deadline_ms"])
            worker_id = fields["worker_id"]
        except (KeyError, ValueError):
            return None
        if run_id is None:
            return None
        return Lease(task_id=task_id, worker_id=worker_id, run_id=run_id, deadline_ms=deadline_ms)

    async def ping(self) -> None:
        """PING. Raises ``BackendUnavailable`` unless Redis answers."""
        with wrap_errors("ping"):
            await self._client.ping()

    # --- reconciler safety (issue 12 bugs 3 and 7) --------------------------------------------

    async def server_time(self) -> datetime:
        """TIME: the Redis server's clock, aware UTC.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        with wrap_errors("server_time"):
            seconds, micros = await self._client.time()
        return _EPOCH + timedelta(seconds=int(seconds), microseconds=int(micros))

    async def epoch(self, token: str) -> QueueEpoch:
        """The ``{prefix}epoch`` string (``"{token}|{created_ms}"``, no TTL), created by one
        script from the server's TIME when absent.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        script = self._client.register_script(scripts.EPOCH)  # once a pass: no need to keep it
        with wrap_errors("epoch"):
            value, age_ms, created = await script(keys=[f"{self._prefix}epoch"], args=[token])
        return QueueEpoch(id=as_text(value), age=int(age_ms) / 1000, created=bool(int(created)))
