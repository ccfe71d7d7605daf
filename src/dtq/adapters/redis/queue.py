"""Redis implementation of the ``Queue`` port (spec §5 "Redis data model", DESIGN §3-§4).

Keys (``dtq.adapters.redis.keys``), all under the configurable prefix (``REDIS_KEY_PREFIX``,
default ``dto:``) made a hash tag, ``{dto}:``, so that every key of a deployment shares one Redis
Cluster hash slot:

=====================================  ======  ==================================================
``{tag}queue:ready:{priority}``        LIST    LPUSH on enqueue, BRPOP over tiers in order
``{tag}queue:pending:{task_id}``       STRING  pending marker, ``SET NX PX marker_ttl``, value "1"
``{tag}lease:task:{task_id}``          HASH    ``worker_id``, ``run_id``, ``deadline_ms``; PEXPIRE
``{tag}queue:scheduled``               ZSET    score = due time in Unix epoch milliseconds
``{tag}epoch``                         STRING  the reconciler's queue epoch (``epoch``)
=====================================  ======  ==================================================

Kind-aware routing (issue 15 item 2) adds ``{tag}queue:routed:{priority}:{kind}`` (LIST): ids a
worker that does not serve their kind popped from a tier, pushed there by ``route`` and popped,
with the tier, only by workers serving the kind (``pop_many`` with ``kinds``).

Each list has books (issue 17 item 5): ``{tag}queue:pushes:{list}`` (STRING, pushes ever) and
``{tag}queue:listed:{list}`` (ZSET, id -> number of its latest push), written by every push
script, so ``enqueue_unlisted`` and the inspector know whether (and where) an id waits on a list
without reading the list (``keys``, ``scripts._BOOKS``). Pops are plain RPOP/BRPOP.

A ready-list entry is a task id (canonical lowercase hyphenated UUID), or, for a lone submit's
task pushed onto an empty list, the id, ``|`` and the JSON of its ``CarriedTask``
(``carried_entry``, at most ``CARRY_MAX_BYTES``): the pop keeps the snapshot for ``carried`` and
returns the id (ARCHITECTURE.md, "The carried claim"). Books, markers and every other key name
the bare id.

Scheduled-set member encoding: ``"{priority}|{task_id}"`` (task id in canonical lowercase
hyphenated UUID form). It is split at the *last* ``|``, so a priority name may itself contain
``|``. The same task scheduled under two priorities is two members; re-scheduling under the same
priority moves the due time (ZADD overwrites the score).

Every compound operation is one Lua script (``dtq.adapters.redis.scripts``) registered once per
``RedisQueue``: enqueue (marker + LPUSH) of one id or a batch, extend and delete of lease hashes
guarded by their ``run_id``, promotion of due scheduled entries (which reads ``TIME``, the Redis
server's clock), and the non-blocking pop of up to N ids over several tiers. Every batch method
costs one round trip, and none for an empty batch; the push scripts take 500 ids per call
(``_SCRIPT_IDS``), so no single call holds the server for long.

Redis Cluster (issue 17 item 6): every script declares the keys it touches in KEYS, except
``PROMOTE_DUE``, which builds the marker and ready-list keys of the ids it reads from the
scheduled set from the tagged prefix in ARGV; all of them carry the same hash tag as its KEYS[1],
so they live in the slot the cluster client routed the script to. Multi-key commands (BRPOP over
tiers, DEL of markers, the EXISTS pipeline) are single-slot for the same reason.

Re-sending after a lost reply (a connection error or timeout): the client's own command retries
are turned off (``set_retry`` at construction). Idempotent commands and scripts (enqueue, marker
release, schedule, promotion, every lease operation in ``dtq.adapters.redis.leases``) are
re-sent by ``connection.idempotent``; BLMPOP, BRPOP and the pop script never are, since a re-sent
pop would take other ids while the first ones sit on no list behind their markers (issue 12 bug
4).
A pop whose reply was lost strands only the ids it took, until their marker TTL.

Requires Redis >= 6.2 (RPOP with a count; fractional BRPOP timeouts; writes after ``TIME``);
on Redis >= 7.0 a waiting pop is one BLMPOP instead of a BRPOP and a pop script.
No redis-py exception escapes: driver errors and ``OSError`` become ``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import cast
from uuid import UUID

import msgspec
from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from dtq.adapters.redis import scripts
from dtq.adapters.redis.connection import (
    NO_RETRY,
    RedisClient,
    as_text,
    idempotent,
    ms,
    parse_uuid,
    socket_timeout,
    wrap_errors,
)
from dtq.adapters.redis.inspect import RedisQueueInspector
from dtq.adapters.redis.keys import KeyLayout
from dtq.adapters.redis.leases import RedisLeases
from dtq.application.ports import CarriedTask, QueueEpoch
from dtq.domain.entities import Job, Task

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_MIN_BLOCK = 0.01  # seconds; BRPOP rounds to ms and a 0 timeout would block forever
# Most ids one push script takes: a 10,000-task submit is twenty calls of ~4 ms (median) on the
# Redis server rather than one that blocks every other client for ~40-100 ms (issue 17 item 5,
# measured on the loaded 2-core box); the round trips cost ~0.1 ms each.
_SCRIPT_IDS = 500
#: Longest list entry that carries a snapshot (``carried_entry``), in bytes; a larger snapshot
#: (a job with much metadata) is not carried.
CARRY_MAX_BYTES = 4096
#: Most carried snapshots a process keeps for popped ids not yet claimed (oldest dropped first).
CARRIED_KEPT = 256
_ID_TEXT = 36  # a canonical UUID's length
_SNAPSHOT_ENCODER = msgspec.json.Encoder()
_SNAPSHOT_DECODER = msgspec.json.Decoder(tuple[Task, Job])


def carried_entry(snapshot: CarriedTask) -> bytes | None:
    """The list entry carrying ``snapshot``: its task id (canonical text), ``|``, then the task
    and job as JSON; None when that is longer than ``CARRY_MAX_BYTES`` or not encodable (the
    bare id goes instead)."""
    try:
        body = _SNAPSHOT_ENCODER.encode((snapshot.task, snapshot.job))
    except (TypeError, ValueError, OverflowError):
        return None
    entry = b"%s|%s" % (str(snapshot.task.id).encode(), body)
    return entry if len(entry) <= CARRY_MAX_BYTES else None


def _split_entry(entry: bytes | str) -> tuple[UUID | None, bytes | str | None]:
    """A popped entry's id and carried snapshot (None for a bare id); ``(None, None)`` for a
    malformed entry."""
    if len(entry) <= _ID_TEXT:
        return parse_uuid(entry), None
    if entry[_ID_TEXT : _ID_TEXT + 1] not in (b"|", "|"):
        return None, None
    return parse_uuid(entry[:_ID_TEXT]), entry[_ID_TEXT + 1 :]


def _epoch_ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError("a timezone-aware datetime is required")
    return (moment - _EPOCH) // _ONE_MS


class _Books:
    """KEYS and ARGV of a push script (layout in ``scripts``): the markers of the ids, the
    books (list, pushes, listed) of each distinct list once, and per id the number of its
    list(s), so a batch names each list once however many of its ids go there."""

    __slots__ = ("_ids", "_keys", "_layout", "_lists", "_markers", "_numbers", "_of")

    def __init__(self, layout: KeyLayout) -> None:
        self._layout = layout
        self._markers: list[str] = []
        self._ids: list[str] = []
        self._numbers: list[int] = []
        self._keys: list[str] = []
        self._of: dict[tuple[str, ...], int] = {}  # (priority,) or (priority, kind) -> number

    def _number(self, name: tuple[str, ...], books: tuple[str, str, str]) -> int:
        number = self._of.get(name)
        if number is None:
            number = self._of[name] = len(self._of) + 1
            self._keys += books
        return number

    def ready(self, priority: str) -> int:
        """The number of the ready list of ``priority`` in this call."""
        name = (priority,)
        number = self._of.get(name)
        return number if number else self._number(name, self._layout.ready_books(priority))

    def routed(self, priority: str, kind: str) -> int:
        """The number of the routed list of ``(priority, kind)`` in this call."""
        name = (priority, kind)
        number = self._of.get(name)
        return number if number else self._number(name, self._layout.routed_books(priority, kind))

    def add(self, task_id: UUID, *numbers: int) -> None:
        """One id of the batch, with the number(s) of its list(s)."""
        self._markers.append(self._layout.marker(task_id))
        self._ids.append(str(task_id))
        self._numbers += numbers

    def keys(self) -> list[str]:
        """KEYS: the markers, then the books of each list."""
        return self._markers + self._keys

    def args(
        self, marker_ttl_ms: int, carried: Sequence[tuple[int, bytes]] = ()
    ) -> list[str | int | bytes]:
        """ARGV: marker TTL, how many ids, the ids, their list numbers, then the ``(i, entry)``
        pairs of the carried entries (``scripts.ENQUEUE_MANY``; i is 1-based)."""
        args: list[str | int | bytes] = [marker_ttl_ms, len(self._ids), *self._ids]
        args += self._numbers
        for pair in carried:
            args += pair
        return args


class RedisQueue(RedisLeases):
    """The ``Queue`` port on Redis (spec §5). See the module docstring for keys and scripts.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` (from ``connect_redis``); responses
            may be bytes or str.
            Its own command retries are turned off (``set_retry``): the queue alone decides
            what is re-sent (see the module docstring).
        prefix: key namespace, ``REDIS_KEY_PREFIX`` (spec §8), used as the hash tag of every
            key (``keys.tagged_prefix``: ``dto:`` gives ``{dto}:queue:ready:default``).
        marker_ttl: pending-marker lifetime in seconds (float, > 0), sent as PX milliseconds.

    Raises:
        ValueError: ``marker_ttl`` is not positive, or ``prefix`` cannot be made a hash tag.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "dto:",
        marker_ttl: float = 15.0,
    ) -> None:
        super().__init__(client, prefix=prefix)
        client.set_retry(NO_RETRY)  # re-sends are the adapter's choice, per command
        self._marker_ttl_ms = ms(marker_ttl)
        self._scheduled_key = self._keys.scheduled
        self._enqueue_many = client.register_script(scripts.ENQUEUE_MANY)
        self._enqueue_unlisted = client.register_script(scripts.ENQUEUE_UNLISTED)
        self._pop_now = client.register_script(scripts.POP_MANY)
        self._blmpop = True  # until the server says it has no BLMPOP (Redis < 7.0)
        self._route = client.register_script(scripts.ROUTE)
        self._rotation = 0  # where each tier's lists start, when popping with kinds
        self._promote = client.register_script(scripts.PROMOTE_DUE)
        self._time = client.register_script(scripts.SERVER_TIME)
        self._carried: dict[UUID, bytes | str] = {}  # popped ids' snapshots, oldest first
        # BRPOP must return before the client's socket read timeout, or redis-py raises a
        # TimeoutError; long waits are therefore cut into slices below that timeout.
        read_timeout = socket_timeout(client)
        self._block_slice = (
            math.inf if not read_timeout else max(read_timeout - 1.0, read_timeout / 2)
        )

    def _ready_key(self, priority: str) -> str:
        return self._keys.ready(priority)

    def _ready_keys(
        self, priorities: Sequence[str], kinds: Collection[str] | None = None
    ) -> list[str]:
        """The lists a pop takes from, in order: per tier its ready list, and with ``kinds``
        the routed list of each kind too, the tier's lists rotated by one place per call."""
        if isinstance(priorities, str) or not priorities:
            raise ValueError("priorities must be a non-empty sequence of tier names")
        if kinds is None:
            return [self._ready_key(priority) for priority in priorities]
        if isinstance(kinds, str):
            raise ValueError("kinds must be a collection of kind names, not a string")
        served = sorted(set(kinds))
        self._rotation += 1
        keys: list[str] = []
        for priority in priorities:
            tier = [self._ready_key(priority)]
            tier += [self._keys.routed(priority, kind) for kind in served]
            start = self._rotation % len(tier)
            keys += tier[start:] + tier[:start]
        return keys

    def _marker_key(self, task_id: UUID) -> str:
        return self._keys.marker(task_id)

    # --- pending markers ----------------------------------------------------------------------

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        """For each ``(task_id, priority)`` in order: SET NX PX its pending marker and push the
        id onto its ready list (LPUSH, numbered in the list's books: ``scripts._BOOKS``), in one
        script per 500 ids (one round trip for a batch up to that size; none for no items).

        An id whose marker is live, including one set earlier in the same batch, is skipped.
        A ``carried`` snapshot rides in its id's list entry (``carried_entry``) when the list
        was empty, else it is dropped (``scripts.ENQUEUE_MANY``).

        Returns:
            How many ids were pushed.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        entries = {c.task.id: entry for c in carried if (entry := carried_entry(c)) is not None}
        pushed = 0
        for start in range(0, len(items), _SCRIPT_IDS):
            books = _Books(self._keys)
            riding: list[tuple[int, bytes]] = []
            for i, (task_id, priority) in enumerate(items[start : start + _SCRIPT_IDS], 1):
                books.add(task_id, books.ready(priority))
                if task_id in entries:
                    riding.append((i, entries[task_id]))
            pushed += await self._run(self._enqueue_many, "enqueue_many", books, riding)
        return pushed

    def carried(self, task_id: UUID) -> CarriedTask | None:
        """The snapshot the entry of ``task_id`` carried when this queue popped it, once; None
        when it carried none, its snapshot was dropped (``CARRIED_KEPT``), does not decode, or
        dates anything by a naive time."""
        body = self._carried.pop(task_id, None)
        if body is None:
            return None
        try:
            task, job = _SNAPSHOT_DECODER.decode(body)
        except (msgspec.DecodeError, ValueError, TypeError):
            return None
        times = (
            task.scheduled_at,
            task.created_at,
            task.updated_at,
            job.created_at,
            job.updated_at,
        )
        if any(moment.tzinfo is None for moment in times):
            return None  # not one this adapter wrote (its times are aware)
        return CarriedTask(task=task, job=job)

    def _parse(self, raw: Sequence[bytes | str]) -> list[UUID]:
        """The ids among popped list entries, in order (malformed entries are dropped); the
        snapshots some entries carried are kept for :meth:`carried`."""
        ids: list[UUID] = []
        for entry in raw:
            task_id, snapshot = _split_entry(entry)
            if task_id is None:
                continue
            ids.append(task_id)
            if snapshot is not None:
                kept = self._carried
                kept[task_id] = snapshot
                if len(kept) > CARRIED_KEPT:
                    del kept[next(iter(kept))]  # the oldest
        return ids

    async def enqueue_unlisted(self, items: Sequence[tuple[UUID, str, str]]) -> int:
        """``enqueue_many`` over ``(task_id, priority, kind)`` that does not push an id still
        waiting in its ready list or in the routed list of its ``(priority, kind)``; one script
        (one round trip) per 500 ids. Whether an id waits on a list is read from the list's
        books (one ZSCORE, ``scripts._BOOKS``), never from its entries: O(log n) per id on the
        Redis server at any list length. An id pushed without books (by a version before them)
        reads as not listed and is pushed once more (a duplicate entry, refused at claim).

        Returns:
            How many ids were pushed.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        pushed = 0
        for start in range(0, len(items), _SCRIPT_IDS):
            books = _Books(self._keys)
            for task_id, priority, kind in items[start : start + _SCRIPT_IDS]:
                books.add(task_id, books.ready(priority), books.routed(priority, kind))
            pushed += await self._run(self._enqueue_unlisted, "enqueue_unlisted", books)
        return pushed

    async def _run(
        self,
        script: AsyncScript,
        operation: str,
        books: _Books,
        carried: Sequence[tuple[int, bytes]] = (),
    ) -> int:
        """One idempotent push script over ``books`` (re-sent after a lost reply)."""
        keys, args = books.keys(), books.args(self._marker_ttl_ms, carried)
        return int(await idempotent(operation, lambda: script(keys=keys, args=args)))

    async def route(self, items: Sequence[tuple[UUID, str, str]]) -> None:
        """For each ``(task_id, priority, kind)``: SET its pending marker (a full TTL) and push
        the id onto the routed list of ``(priority, kind)`` (numbered in its books), in one
        script (``ROUTE``) per 500 ids, none for no items. Never re-sent (see the module
        docstring).

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        for start in range(0, len(items), _SCRIPT_IDS):
            books = _Books(self._keys)
            for task_id, priority, kind in items[start : start + _SCRIPT_IDS]:
                books.add(task_id, books.routed(priority, kind))
            with wrap_errors("route"):
                await self._route(keys=books.keys(), args=books.args(self._marker_ttl_ms))

    async def release_markers(self, task_ids: Sequence[UUID]) -> None:
        """One DEL of all the pending markers; idempotent. Raises ``BackendUnavailable``."""
        if not task_ids:
            return
        keys = [self._marker_key(task_id) for task_id in task_ids]
        await idempotent("release_markers", lambda: self._client.delete(*keys))

    # --- ready lists --------------------------------------------------------------------------

    async def _take(self, keys: list[str], count: int) -> list[UUID]:
        """Up to ``count`` ids over the tiers in order, without blocking (one script).

        Malformed entries (not UUIDs) are popped and discarded, so fewer may come back.
        """
        raw: list[bytes | str] = await self._pop_now(keys=keys, args=[count])
        return self._parse(raw)

    async def _pop_blocking(self, keys: list[str], deadline: float, count: int) -> list[UUID]:
        """Wait for ids until the event-loop time ``deadline``; up to ``count`` of them.

        One round trip on Redis >= 7.0: BLMPOP takes up to ``count`` ids from the first
        non-empty list. Before 7.0, BRPOP waits for one and the pop script takes up to
        ``count - 1`` more; should that second trip fail, the id already popped is returned
        rather than lost (the next call reports the outage). Each blocking call is kept under
        the socket read timeout (``_block_slice``); once less than ``_MIN_BLOCK`` is left, one
        non-blocking pass ends the wait (never a timeout of 0, which would block forever).
        """
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            if remaining < _MIN_BLOCK:
                return await self._take(keys, count)
            block = round(min(remaining, self._block_slice), 3)
            if self._blmpop:
                try:
                    reply = await self._client.blmpop(
                        block, len(keys), *keys, direction="RIGHT", count=count
                    )
                except ResponseError as exc:
                    if "unknown command" not in str(exc).lower():
                        raise
                    self._blmpop = False  # Redis < 7.0: BRPOP, then the pop script
                    continue
                found = [] if reply is None else self._parse(cast("list[bytes | str]", reply[1]))
            else:
                single = await self._client.brpop(keys, timeout=block)
                found = [] if single is None else self._parse([single[1]])
                if found and count > 1:
                    with contextlib.suppress(RedisError, RedisClusterException, OSError):
                        found += await self._take(keys, count - 1)
            if found:
                return found
            if block >= remaining:
                return []

    async def pop_many(
        self,
        priorities: Sequence[str],
        timeout: float,
        max_count: int,
        kinds: Collection[str] | None = None,
    ) -> list[UUID]:
        """Up to ``max_count`` ids over the tiers in order (first non-empty tier wins, oldest id
        first): the first blocking, the rest only if waiting. A malformed list entry (not a
        UUID) is discarded. With ``kinds`` each tier is its ready list and the routed list of
        each kind under it, rotated by one place per call (fairness across kinds): the same
        round trips, over ``len(priorities) * (len(kinds) + 1)`` keys.

        Round trips: when ids are waiting, one script pops up to ``max_count`` over the tiers in
        order and that is all. Otherwise (and only if ``timeout`` allows blocking) a BLMPOP loop
        waits and takes up to ``max_count`` from the first list that gets ids: two round trips
        in all, the second the one that wakes (on Redis < 7.0 a BRPOP and a pop script, three).
        Cancellation while a call is in flight loses what the server already popped (its marker
        stalls the task until the marker TTL, then the reconciler re-enqueues it, spec §5).

        Args:
            priorities: tier names, highest first (non-empty).
            timeout: seconds to block for the first id; ``<= 0`` does not block.
            max_count: most ids to return (>= 1).
            kinds: the kinds the popping worker serves; None pops the ready lists alone.

        Returns:
            Between 0 and ``max_count`` ids, in pop order (tier by tier, oldest first).

        Raises:
            ValueError: ``max_count < 1``, ``priorities`` is empty or a bare string, or
                ``kinds`` is a bare string.
            BackendUnavailable: Redis failed or is unreachable.
        """
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        keys = self._ready_keys(priorities, kinds)
        deadline = asyncio.get_running_loop().time() + timeout
        with wrap_errors("pop_many"):
            found = await self._take(keys, max_count)
            if found or timeout < _MIN_BLOCK:
                return found
            return await self._pop_blocking(keys, deadline, max_count)

    # --- scheduled set ------------------------------------------------------------------------

    async def schedule(self, task_id: UUID, priority: str, due_at: datetime) -> None:
        """ZADD ``"{priority}|{task_id}"`` scored by ``due_at`` in epoch milliseconds.

        Raises:
            ValueError: ``due_at`` is naive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        member = f"{priority}|{task_id}"
        score = {member: _epoch_ms(due_at)}
        await idempotent("schedule", lambda: self._client.zadd(self._scheduled_key, score))

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
        keys = [self._scheduled_key]
        args: list[str | int] = [self._keys.prefix, limit, self._marker_ttl_ms]
        pushed = await idempotent("promote_due", lambda: self._promote(keys=keys, args=args))
        return int(pushed)

    def inspector(self) -> RedisQueueInspector:
        """The ``QueueInspector`` of this queue's keys (same client and prefix); for explain."""
        return RedisQueueInspector(self._client, prefix=self._keys.prefix)

    async def ping(self) -> None:
        """Check that the server holding the queue's keys answers: EXISTS of the epoch key (a
        read of one key, no write), not PING, which a Redis Cluster client sends to a node of
        its choice; a keyed read goes to the master of the keys' slot, so that master being
        down fails the check (``/healthz``).

        Raises:
            BackendUnavailable: that server failed, is unreachable, or (a ``redis://`` address
                of a cluster node that does not serve the slot) answered MOVED.
        """
        with wrap_errors("ping"):
            await self._client.exists(self._keys.epoch)

    # --- reconciler safety (issue 12 bugs 3 and 7) --------------------------------------------

    async def server_time(self) -> datetime:
        """TIME of the server that holds the queue's keys (the clock ``promote_due`` and the
        TTLs run on; on a Redis Cluster, the master of the key slot), aware UTC. One script
        whose only key is the scheduled set, so the cluster client routes it to that master.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        keys = [self._scheduled_key]
        seconds, micros = await idempotent("server_time", lambda: self._time(keys=keys))
        return _EPOCH + timedelta(seconds=int(seconds), microseconds=int(micros))

    async def epoch(self, token: str) -> QueueEpoch:
        """The ``{tag}epoch`` string (``"{token}|{created_ms}"``, no TTL), created by one
        script from the server's TIME when absent.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        script = self._client.register_script(scripts.EPOCH)  # once a pass: no need to keep it
        value, age_ms, created = await idempotent(
            "epoch", lambda: script(keys=[self._keys.epoch], args=[token])
        )
        return QueueEpoch(id=as_text(value), age=int(age_ms) / 1000, created=bool(int(created)))
