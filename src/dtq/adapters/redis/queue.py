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

Every compound operation is one Lua script registered once per ``RedisQueue``: enqueue (marker +
LPUSH), extend and delete of a lease guarded by its ``run_id``, promotion of due scheduled entries
(which reads ``TIME``, the Redis server's clock), and the non-blocking pop over several tiers.

Known limitation (Redis Cluster): the promotion script computes the per-task marker and ready-list
keys from the prefix passed in ARGV instead of declaring them in KEYS, because they are only known
after reading the sorted set. That is fine on a single Redis or under Sentinel, but on Redis
Cluster it is only correct when every key lives in one hash slot, i.e. when the prefix carries a
hash tag such as ``{dto}:``. The other scripts declare all their keys (enqueue still touches two
keys, so the same hash-tag advice applies there on Cluster).

Requires Redis >= 6.0 (fractional BRPOP timeouts; scripts that write after ``TIME``).
No redis-py exception escapes: driver errors and ``OSError`` become ``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisError, ResponseError
from redis.typing import EncodableT, FieldT

from dtq.application.ports import Lease, LeaseState
from dtq.domain.errors import BackendUnavailable

DEFAULT_PORT = 6379
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_MIN_BLOCK = 0.01  # seconds; BRPOP rounds to ms and a 0 timeout would block forever

# KEYS[1] marker, KEYS[2] ready list; ARGV[1] marker ttl ms, ARGV[2] task id. Returns 1 or 0.
_ENQUEUE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""

# KEYS = ready lists, highest tier first. Returns the first id popped, or nil.
_POP_NOW = """
for _, key in ipairs(KEYS) do
  local id = redis.call('RPOP', key)
  if id then return id end
end
return false
"""

# KEYS[1] lease hash; ARGV[1] run id, ARGV[2] ttl ms, ARGV[3] new deadline_ms.
_EXTEND_LEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then return 'lost' end
redis.call('HSET', KEYS[1], 'deadline_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 'extended'
"""

# KEYS[1] lease hash; ARGV[1] run id. Returns 1 when deleted.
_DELETE_LEASE = """
if redis.call('HGET', KEYS[1], 'run_id') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] scheduled zset; ARGV[1] key prefix, ARGV[2] limit, ARGV[3] marker ttl ms.
# Not Redis-Cluster safe without a hash tag in the prefix (see the module docstring).
_PROMOTE_DUE = """
local t = redis.call('TIME')
local now_ms = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, ARGV[2])
local pushed = 0
for _, member in ipairs(members) do
  redis.call('ZREM', KEYS[1], member)
  local sep = string.find(member, '|[^|]*$')
  if sep then
    local priority = string.sub(member, 1, sep - 1)
    local task_id = string.sub(member, sep + 1)
    local marker = ARGV[1] .. 'queue:pending:' .. task_id
    if redis.call('SET', marker, '1', 'NX', 'PX', ARGV[3]) then
      redis.call('LPUSH', ARGV[1] .. 'queue:ready:' .. priority, task_id)
      pushed = pushed + 1
    end
  end
end
return pushed
"""


@contextmanager
def _wrapped(operation: str) -> Iterator[None]:
    """Turn driver and socket errors into ``BackendUnavailable``: no redis error escapes."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise BackendUnavailable(f"redis {operation} failed: {type(exc).__name__}") from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _uuid(value: bytes | str | None) -> UUID | None:
    """Parse a stored id; None for a missing or malformed value."""
    if value is None:
        return None
    try:
        return UUID(_text(value))
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

    Raises:
        ValueError: ``marker_ttl`` is not positive.
    """

    def __init__(self, client: Redis, *, prefix: str = "dto:", marker_ttl: float = 60.0) -> None:
        self._client = client
        self._prefix = prefix
        self._marker_ttl_ms = _ms(marker_ttl)
        self._scheduled_key = f"{prefix}queue:scheduled"
        self._enqueue = client.register_script(_ENQUEUE)
        self._pop_now = client.register_script(_POP_NOW)
        self._extend = client.register_script(_EXTEND_LEASE)
        self._delete = client.register_script(_DELETE_LEASE)
        self._promote = client.register_script(_PROMOTE_DUE)
        # BRPOP must return before the client's socket read timeout, or redis-py raises (and
        # retries) a TimeoutError; long waits are therefore cut into slices below that timeout.
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        self._block_slice = (
            math.inf if not socket_timeout else max(socket_timeout - 1.0, socket_timeout / 2)
        )

    def _ready_key(self, priority: str) -> str:
        return f"{self._prefix}queue:ready:{priority}"

    def _marker_key(self, task_id: UUID) -> str:
        return f"{self._prefix}queue:pending:{task_id}"

    def _lease_key(self, task_id: UUID) -> str:
        return f"{self._prefix}lease:task:{task_id}"

    async def enqueue(self, task_id: UUID, priority: str) -> bool:
        """SET NX PX the pending marker and LPUSH the id, in one script.

        Returns:
            True when pushed; False when a marker already exists.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        keys = [self._marker_key(task_id), self._ready_key(priority)]
        with _wrapped("enqueue"):
            pushed = await self._enqueue(keys=keys, args=[self._marker_ttl_ms, str(task_id)])
        return bool(pushed)

    async def release_marker(self, task_id: UUID) -> None:
        """DEL the pending marker; idempotent. Raises ``BackendUnavailable``."""
        with _wrapped("release_marker"):
            await self._client.delete(self._marker_key(task_id))

    async def has_marker(self, task_id: UUID) -> bool:
        """True while the pending marker exists. Raises ``BackendUnavailable``."""
        with _wrapped("has_marker"):
            return bool(await self._client.exists(self._marker_key(task_id)))

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
        if isinstance(priorities, str) or not priorities:
            raise ValueError("priorities must be a non-empty sequence of tier names")
        keys = [self._ready_key(priority) for priority in priorities]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with _wrapped("pop"):
            while True:
                remaining = deadline - loop.time()
                if remaining < _MIN_BLOCK:
                    return _uuid(await self._pop_now(keys=keys))
                block = min(remaining, self._block_slice)
                reply = await self._client.brpop(keys, timeout=round(block, 3))
                if reply is not None:
                    task_id = _uuid(reply[1])
                    if task_id is not None:
                        return task_id
                elif block >= remaining:
                    return None

    async def schedule(self, task_id: UUID, priority: str, due_at: datetime) -> None:
        """ZADD ``"{priority}|{task_id}"`` scored by ``due_at`` in epoch milliseconds.

        Raises:
            ValueError: ``due_at`` is naive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        member = f"{priority}|{task_id}"
        with _wrapped("schedule"):
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
        with _wrapped("promote_due"):
            pushed = await self._promote(
                keys=[self._scheduled_key], args=[self._prefix, limit, self._marker_ttl_ms]
            )
        return int(pushed)

    async def set_lease(self, lease: Lease, ttl: float) -> None:
        """Replace the lease hash and PEXPIRE it after ``ttl`` seconds (one MULTI/EXEC).

        Raises:
            ValueError: ``ttl`` is not positive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        key = self._lease_key(lease.task_id)
        fields: dict[FieldT, EncodableT] = {
            "worker_id": lease.worker_id,
            "run_id": str(lease.run_id),
            "deadline_ms": lease.deadline_ms,
        }
        ttl_ms = _ms(ttl)
        with _wrapped("set_lease"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=fields)
                pipe.pexpire(key, ttl_ms)
                await pipe.execute()

    async def extend_lease(self, lease: Lease, ttl: float) -> LeaseState:
        """If the hash names ``lease.run_id``: PEXPIRE ``ttl`` seconds, store ``deadline_ms``.

        Returns:
            EXTENDED, MISSING (no hash) or LOST (another run's hash; unchanged).

        Raises:
            ValueError: ``ttl`` is not positive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        args: list[str | int] = [str(lease.run_id), _ms(ttl), lease.deadline_ms]
        with _wrapped("extend_lease"):
            state = await self._extend(keys=[self._lease_key(lease.task_id)], args=args)
        return LeaseState(_text(state))

    async def delete_lease(self, task_id: UUID, run_id: UUID) -> None:
        """Delete the lease hash if it names ``run_id``; idempotent.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        with _wrapped("delete_lease"):
            await self._delete(keys=[self._lease_key(task_id)], args=[str(run_id)])

    async def leases_present(self, task_ids: Sequence[UUID]) -> set[UUID]:
        """The ids that have a lease hash: one pipelined round trip of EXISTS.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        ids = list(task_ids)
        if not ids:
            return set()
        with _wrapped("leases_present"):
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
        with _wrapped("get_lease"):
            raw = await self._client.hgetall(self._lease_key(task_id))
        fields = {_text(name): _text(value) for name, value in raw.items()}
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
        with _wrapped("ping"):
            await self._client.ping()


def connect_redis(addr: str) -> Redis:
    """Build a client (hiredis parser, bytes responses); it connects on first use.

    Args:
        addr: ``"host:port"`` as in ``REDIS_ADDR`` (spec §8; port defaults to 6379, IPv6 as
            ``"[::1]:6379"``), or a ``redis://`` / ``rediss://`` / ``unix://`` URL.

    Returns:
        A ``redis.asyncio.Redis`` with a 5 s connect timeout, a 10 s socket read timeout
        (``RedisQueue.pop`` keeps each BRPOP under it) and at most 3 retries of a command on
        connection errors (jittered backoff up to 0.5 s), so an outage surfaces as
        ``BackendUnavailable`` within seconds. The caller closes it (``aclose()``).

    Raises:
        ValueError: ``addr`` cannot be parsed.
    """
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_connect_timeout": 5.0,
        "socket_timeout": 10.0,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=3),
    }
    if "://" in addr:
        return Redis.from_url(addr, **options)
    parts = urlsplit(f"redis://{addr}")
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"invalid Redis address {addr!r}") from exc
    if not host or parts.path or parts.query:
        raise ValueError(f"invalid Redis address {addr!r}; expected host:port")
    return Redis(host=host, port=port, **options)


async def check_eviction_policy(client: Redis) -> str | None:
    """Warn unless ``maxmemory-policy`` is ``noeviction`` (DESIGN §5: evicted leases mean reruns).

    Args:
        client: the Redis client the queue uses.

    Returns:
        A warning text when the policy evicts keys or cannot be read (CONFIG disabled, renamed
        or not permitted, as on some managed services); None when it is ``noeviction``.

    Raises:
        BackendUnavailable: Redis is unreachable.
    """
    unreadable = (
        "could not read Redis maxmemory-policy ({reason}); make sure it is 'noeviction', or "
        "evicted leases and markers will cause reruns and stalls"
    )
    try:
        with _wrapped("config_get"):
            reply = await client.config_get("maxmemory-policy")
    except BackendUnavailable as exc:
        if isinstance(exc.__cause__, ResponseError):  # CONFIG disabled, renamed or not permitted
            return unreadable.format(reason="CONFIG GET refused")
        raise
    # The reply maps name -> value; redis-py decodes CONFIG GET to str even with bytes responses.
    raw_policy: bytes | str | None = next(iter(reply.values()), None)
    if raw_policy is None:
        return unreadable.format(reason="no such setting")
    policy = _text(raw_policy)
    if policy == "noeviction":
        return None
    return (
        f"Redis maxmemory-policy is {policy!r}, not 'noeviction': under memory pressure Redis "
        "may evict leases (tasks reclaimed and rerun) and queue entries (delayed until reconcile)"
    )
