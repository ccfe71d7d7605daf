"""The lease half of ``RedisQueue`` (spec §5 "Lease / visibility"; DESIGN §3 lease ownership).

``{tag}lease:task:{task_id}`` (``keys.KeyLayout.lease``) is a HASH of ``worker_id``, ``run_id``
and ``deadline_ms`` (Unix epoch milliseconds at which the holder's lease window ends), with a
PEXPIRE slightly longer than that window. Every write that is conditional on the owner (extend,
re-create, delete) is one Lua script, so no other client's write lands between the check and the
write. Every command here is idempotent, so each is re-sent after a lost reply
(``connection.idempotent``).
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from dtq.adapters.redis import scripts
from dtq.adapters.redis.connection import RedisClient, as_text, idempotent, ms
from dtq.adapters.redis.keys import KeyLayout
from dtq.application.ports import Lease, LeaseState


class RedisLeases:
    """Lease hashes on Redis; the base of ``RedisQueue``.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` (from ``connect_redis``).
        prefix: key namespace, ``REDIS_KEY_PREFIX`` (spec §8), used as the hash tag of every
            key (``keys.tagged_prefix``).

    Raises:
        ValueError: ``prefix`` cannot be made a hash tag.
    """

    def __init__(self, client: RedisClient, *, prefix: str) -> None:
        self._client = client
        self._keys = KeyLayout(prefix)
        self._set_leases = client.register_script(scripts.SET_LEASES)
        self._extend = client.register_script(scripts.EXTEND_LEASES)
        self._recreate = client.register_script(scripts.RECREATE_LEASE)
        self._delete_many = client.register_script(scripts.DELETE_LEASES)

    def _lease_key(self, task_id: UUID) -> str:
        return self._keys.lease(task_id)

    async def set_leases(
        self, leases: Sequence[Lease], ttl: float, *, release: Sequence[UUID] = ()
    ) -> None:
        """Replace each lease hash and PEXPIRE it after ``ttl`` seconds, and delete the pending
        markers of ``release``, all in one script call (one round trip, one command).

        Each hash is replaced whole (DEL, HSET of worker_id, run_id, deadline_ms) and given its
        PEXPIRE inside the script, so it is atomic like a MULTI/EXEC: a client dying mid-send
        cannot leave a hash without its TTL (a lease that never expires would block the reclaim
        of its task forever), and no other client sees a hash between its DEL and its HSET. One
        script instead of three commands per lease: the worker's Redis client packs and parses
        one command per batch (``benchmarks/PROFILE.md``). The markers are a claim's: the
        claim's Redis side is this one call.

        Raises:
            ValueError: ``ttl`` is not positive (checked only when there are leases).
            BackendUnavailable: Redis failed or is unreachable.
        """
        if not leases and not release:
            return
        ttl_ms = ms(ttl) if leases else 0
        keys = [self._lease_key(lease.task_id) for lease in leases]
        keys += [self._keys.marker(task_id) for task_id in release]
        args: list[str | int] = [ttl_ms, len(leases)]
        for lease in leases:
            args += (lease.worker_id, str(lease.run_id), lease.deadline_ms)
        operation = "set_leases" if len(leases) > 1 else "set_lease"
        await idempotent(operation, lambda: self._set_leases(keys=keys, args=args))

    async def extend_leases(self, leases: Sequence[Lease], ttl: float) -> list[LeaseState]:
        """For each hash naming its ``lease.run_id``: PEXPIRE ``ttl`` seconds, store
        ``deadline_ms``; one script call for all of them (a worker's renewal tick).

        Returns:
            One state per lease, in order: EXTENDED, MISSING (no hash) or LOST (another run's
            hash; unchanged).

        Raises:
            ValueError: ``ttl`` is not positive (checked only when there are leases).
            BackendUnavailable: Redis failed or is unreachable.
        """
        if not leases:
            return []
        keys = [self._lease_key(lease.task_id) for lease in leases]
        args: list[str | int] = [ms(ttl)]
        for lease in leases:
            args += (str(lease.run_id), lease.deadline_ms)
        operation = "extend_leases" if len(leases) > 1 else "extend_lease"
        states = await idempotent(operation, lambda: self._extend(keys=keys, args=args))
        return [LeaseState(as_text(state)) for state in states]

    async def recreate_lease(self, lease: Lease, ttl: float) -> LeaseState:
        """Write the lease hash only if none exists; extend it if it names ``lease.run_id``.

        One script (check and write atomic), so a hash another run wrote since this run's
        ``extend_leases`` answered MISSING is never overwritten.

        Returns:
            EXTENDED (created, or ours and extended) or LOST (another run's hash; unchanged).

        Raises:
            ValueError: ``ttl`` is not positive.
            BackendUnavailable: Redis failed or is unreachable.
        """
        args: list[str | int] = [str(lease.run_id), lease.worker_id, lease.deadline_ms, ms(ttl)]
        keys = [self._lease_key(lease.task_id)]
        state = await idempotent("recreate_lease", lambda: self._recreate(keys=keys, args=args))
        return LeaseState(as_text(state))

    async def delete_leases(self, leases: Sequence[tuple[UUID, UUID]]) -> None:
        """Delete each ``(task_id, run_id)`` lease hash that names its run_id, in one script.

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        if not leases:
            return
        keys = [self._lease_key(task_id) for task_id, _ in leases]
        args = [str(run_id) for _, run_id in leases]
        await idempotent("delete_leases", lambda: self._delete_many(keys=keys, args=args))

    async def leases_present(self, task_ids: Sequence[UUID]) -> set[UUID]:
        """The ids that have a lease hash: one pipelined round trip of EXISTS (no MULTI; on a
        Redis Cluster the keys share one slot, so the pipeline goes to one master).

        Raises:
            BackendUnavailable: Redis failed or is unreachable.
        """
        ids = list(task_ids)
        if not ids:
            return set()

        async def exists() -> list[int]:
            async with self._client.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.exists(self._lease_key(task_id))
                found: list[int] = await pipe.execute()
                return found

        found = await idempotent("leases_present", exists)
        return {task_id for task_id, exists in zip(ids, found, strict=True) if exists}
