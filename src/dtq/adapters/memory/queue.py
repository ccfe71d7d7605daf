"""In-memory fake of the ``Queue`` port with the Redis adapter's semantics (spec §5, DESIGN §4).

What it mirrors, key by key of spec §5:

* ``queue:ready:{priority}`` (LIST, LPUSH + BRPOP): one FIFO per tier; ``pop_many`` takes the
  oldest ids of the first non-empty tier in the order given, and a blocked pop is served directly by
  the next push to any of its tiers, longest-waiting popper first, as Redis serves blocked clients.
* ``queue:routed:{priority}:{kind}`` (LIST, kind-aware routing, issue 15 item 2): one FIFO per
  ``(priority, kind)``, filled by ``route``; ``pop_many`` with ``kinds`` takes, per tier, from its
  ready list and the routed lists of those kinds, in an order rotated by one place per call.
* ``queue:pending:{task_id}`` (SET NX PX): a marker with an expiry time read from the clock port.
* ``lease:task:{task_id}`` (HASH + PEXPIRE): the ``Lease`` plus an expiry time read from the clock.
* ``queue:scheduled`` (ZSET): one entry per ``(priority, task_id)`` member, scored by the due
  time in epoch milliseconds; ``promote_due`` compares it with ``clock.now()`` (the fake's
  "server clock").

Expiry is lazy and driven by the clock only: a key whose expiry time is ``<= clock.now()`` is gone
(so a 60 s TTL has lapsed once ``FakeClock.advance(60)`` ran). Blocking in ``pop_many`` is the one
place where real (event-loop) time is used, as the port's ``timeout`` is real seconds.

Every method runs without awaiting between reading and writing its state, so each one is atomic
under asyncio concurrency, like a Redis command or Lua script. Not thread-safe.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections import Counter, defaultdict, deque
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from dtq.application.ports import (
    CarriedTask,
    Clock,
    Lease,
    LeaseState,
    QueueEpoch,
    QueueSnapshot,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)

# A list: a priority (its ready list) or a ``(priority, kind)`` (its routed list).
_List = str | tuple[str, str]
#: Most carried snapshots kept for ids not yet claimed (the oldest dropped first).
CARRIED_KEPT = 256

# A blocked popper: the future a push resolves with ``(list, task_id)``.
_Waiter = asyncio.Future[tuple[_List, UUID]]


def _epoch_ms(moment: datetime) -> int:
    """Whole milliseconds since the Unix epoch (floor), for an aware ``moment``."""
    if moment.tzinfo is None:
        raise ValueError("a timezone-aware datetime is required")
    return (moment - _EPOCH) // _ONE_MS


def _check_ttl(ttl: float) -> None:
    if ttl <= 0:
        raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")


def _check_priorities(priorities: Sequence[str]) -> list[str]:
    if isinstance(priorities, str) or not priorities:
        raise ValueError("priorities must be a non-empty sequence of tier names")
    return list(priorities)


class InMemoryQueue:
    """Fake ``Queue`` (spec §5 Redis data model) for unit tests and ``dtq dev``.

    Args:
        clock: time source for marker/lease expiry and for ``promote_due``'s notion of "now".
        marker_ttl: lifetime of a pending marker in seconds (float, > 0); the backstop for a
            marker whose release never happened (spec §5 Pending enqueue deduplication).

    Raises:
        ValueError: ``marker_ttl`` is not positive.
    """

    def __init__(self, clock: Clock, *, marker_ttl: float = 15.0) -> None:
        _check_ttl(marker_ttl)
        self._clock = clock
        self._marker_ttl = timedelta(seconds=marker_ttl)
        self._ready: defaultdict[_List, deque[UUID]] = defaultdict(deque)  # oldest at the left
        # How many entries of each id each list holds: the Redis lists' books (``enqueue_unlisted``
        # knows whether an id waits on a list at any depth without reading it).
        self._entries: defaultdict[_List, Counter[UUID]] = defaultdict(Counter)
        self._waiters: defaultdict[_List, deque[_Waiter]] = defaultdict(deque)  # longest first
        self._rotation = 0  # where each tier's lists start, when popping with kinds
        self._markers: dict[UUID, datetime] = {}  # task id -> expiry
        self._leases: dict[UUID, tuple[Lease, datetime]] = {}  # task id -> (lease, expiry)
        self._scheduled: dict[tuple[str, UUID], int] = {}  # (priority, task id) -> due epoch ms
        self._carried: dict[UUID, CarriedTask] = {}  # oldest first, at most CARRIED_KEPT

    # --- pending markers ----------------------------------------------------------------------

    def _marker_live(self, task_id: UUID) -> bool:
        expires = self._markers.get(task_id)
        if expires is None:
            return False
        if expires <= self._clock.now():
            del self._markers[task_id]
            return False
        return True

    def _reserve(self, task_id: UUID) -> bool:
        """SET NX PX: set the marker unless a live one exists."""
        if self._marker_live(task_id):
            return False
        self._markers[task_id] = self._clock.now() + self._marker_ttl
        return True

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        """For each ``(task_id, priority)`` in order: set the pending marker and push the id
        onto the ``priority`` tier, unless a live marker exists. A ``carried`` snapshot of an
        id pushed onto an empty list is kept (a copy) for :meth:`carried`, as the Redis
        adapter keeps it on the list. Returns how many were pushed."""
        snapshots = {c.task.id: c for c in carried}
        pushed_to: set[str] = set()  # a list pushed to earlier in the call is not empty
        pushed = 0
        for task_id, priority in items:
            if self._reserve(task_id):
                empty = not self._ready.get(priority) and priority not in pushed_to
                if task_id in snapshots and empty:
                    self._keep_carried(snapshots[task_id])
                self._push(priority, task_id)
                pushed_to.add(priority)
                pushed += 1
        return pushed

    def _keep_carried(self, snapshot: CarriedTask) -> None:
        self._carried[snapshot.task.id] = copy.deepcopy(snapshot)
        while len(self._carried) > CARRIED_KEPT:
            del self._carried[next(iter(self._carried))]  # the oldest

    def carried(self, task_id: UUID) -> CarriedTask | None:
        """The snapshot kept for ``task_id`` by ``enqueue_many``, once; None without one."""
        return self._carried.pop(task_id, None)

    async def enqueue_unlisted(self, items: Sequence[tuple[UUID, str, str]]) -> int:
        """Set each marker; push the ``(task_id, priority, kind)`` id onto its ready list unless
        it already waits, at any depth, on that list or on the routed list of ``(priority,
        kind)``. Returns how many were pushed."""
        pushed = 0
        for task_id, priority, kind in items:
            if not self._reserve(task_id):
                continue
            if not self._listed(priority, task_id) and not self._listed((priority, kind), task_id):
                self._push(priority, task_id)
                pushed += 1
        return pushed

    def _listed(self, name: _List, task_id: UUID) -> bool:
        listed = self._entries.get(name)
        return listed is not None and listed[task_id] > 0

    async def route(self, items: Sequence[tuple[UUID, str, str]]) -> None:
        """For each ``(task_id, priority, kind)``: re-arm the marker for a full TTL and push the
        id onto the routed list of ``(priority, kind)``."""
        for task_id, priority, kind in items:
            self._markers[task_id] = self._clock.now() + self._marker_ttl
            self._push((priority, kind), task_id)

    async def release_markers(self, task_ids: Sequence[UUID]) -> None:
        """Delete several pending markers; idempotent."""
        for task_id in task_ids:
            self._markers.pop(task_id, None)

    # --- ready lists --------------------------------------------------------------------------

    def _push(self, name: _List, task_id: UUID, *, front: bool = False) -> None:
        """LPUSH: hand the id to the longest-waiting popper of the list, else append it.

        ``front`` puts it where the next pop takes it (used to give back an undelivered id).
        """
        waiters = self._waiters[name]
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result((name, task_id))
                return
        if front:
            self._ready[name].appendleft(task_id)
        else:
            self._ready[name].append(task_id)
        self._entries[name][task_id] += 1

    def _take(self, names: Sequence[_List]) -> UUID | None:
        for name in names:
            ready = self._ready.get(name)
            if ready:
                task_id = ready.popleft()
                listed = self._entries[name]
                listed[task_id] -= 1
                if listed[task_id] <= 0:
                    del listed[task_id]
                return task_id
        return None

    def _lists(self, tiers: list[str], kinds: Collection[str] | None) -> list[_List]:
        """The lists a pop takes from, in order (as ``RedisQueue``): per tier its ready list
        and, with ``kinds``, each kind's routed list, rotated by one place per call."""
        if kinds is None:
            return list(tiers)
        if isinstance(kinds, str):
            raise ValueError("kinds must be a collection of kind names, not a string")
        served = sorted(set(kinds))
        self._rotation += 1
        names: list[_List] = []
        for priority in tiers:
            tier: list[_List] = [priority, *((priority, kind) for kind in served)]
            start = self._rotation % len(tier)
            names += tier[start:] + tier[:start]
        return names

    async def _pop_one(self, tiers: list[_List], timeout: float) -> UUID | None:
        """Take the oldest id of the first non-empty tier, blocking up to ``timeout`` real
        seconds (``<= 0`` returns at once); None when nothing arrived in time."""
        found = self._take(tiers)
        if found is not None or timeout <= 0:
            return found
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        for tier in dict.fromkeys(tiers):
            self._waiters[tier].append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return (await waiter)[1]
        except TimeoutError:
            # The deadline may have fired after a push resolved the future: keep that id.
            return waiter.result()[1] if waiter.done() and not waiter.cancelled() else None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                priority, task_id = waiter.result()
                self._push(priority, task_id, front=True)  # not delivered: give it back
            raise
        finally:
            for tier in dict.fromkeys(tiers):
                waiters = self._waiters[tier]
                if waiter in waiters:
                    waiters.remove(waiter)

    async def pop_many(
        self,
        priorities: Sequence[str],
        timeout: float,
        max_count: int,
        kinds: Collection[str] | None = None,
    ) -> list[UUID]:
        """Take the oldest id of the first non-empty tier, blocking up to ``timeout`` real
        seconds (``<= 0`` returns at once; a blocked pop is served by the next push to any of
        its tiers), then up to ``max_count - 1`` more that are already waiting, without blocking.
        With ``kinds``, a tier is its ready list and the routed lists of those kinds.

        Raises:
            ValueError: ``priorities`` is empty or a bare string, ``kinds`` is a bare string,
                or ``max_count < 1``.
        """
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        tiers = self._lists(_check_priorities(priorities), kinds)
        first = await self._pop_one(tiers, timeout)
        if first is None:
            return []
        found = [first]
        while len(found) < max_count:
            more = self._take(tiers)
            if more is None:
                break
            found.append(more)
        return found

    # --- scheduled set ------------------------------------------------------------------------

    async def schedule(self, task_id: UUID, priority: str, due_at: datetime) -> None:
        """Add (or re-score) the ``(priority, task_id)`` entry, due at ``due_at`` (epoch ms).

        Raises:
            ValueError: ``due_at`` is naive.
        """
        self._scheduled[(priority, task_id)] = _epoch_ms(due_at)

    async def promote_due(self, limit: int) -> int:
        """Move up to ``limit`` entries due by ``clock.now()`` to their ready lists.

        Entries are taken in (due time, ``"{priority}|{task_id}"``) order, like ZRANGEBYSCORE.
        Each is removed; it is pushed only if its pending marker could be set, else dropped.

        Returns:
            How many ids were pushed.
        """
        if limit <= 0:
            return 0
        now_ms = _epoch_ms(self._clock.now())
        due = sorted(
            (score, f"{priority}|{task_id}", priority, task_id)
            for (priority, task_id), score in self._scheduled.items()
            if score <= now_ms
        )[:limit]
        pushed = 0
        for _, _, priority, task_id in due:
            del self._scheduled[(priority, task_id)]
            if self._reserve(task_id):
                self._push(priority, task_id)
                pushed += 1
        return pushed

    # --- leases -------------------------------------------------------------------------------

    def _live_lease(self, task_id: UUID) -> Lease | None:
        entry = self._leases.get(task_id)
        if entry is None:
            return None
        if entry[1] <= self._clock.now():
            del self._leases[task_id]
            return None
        return entry[0]

    async def set_leases(
        self, leases: Sequence[Lease], ttl: float, *, release: Sequence[UUID] = ()
    ) -> None:
        """Create or overwrite each lease, expiring ``ttl`` seconds from ``clock.now()``, and
        drop the pending markers of ``release``.

        Raises:
            ValueError: ``ttl`` is not positive (checked only when there are leases).
        """
        await self.release_markers(release)
        if not leases:
            return
        _check_ttl(ttl)
        expires = self._clock.now() + timedelta(seconds=ttl)
        for lease in leases:
            self._leases[lease.task_id] = (lease, expires)

    async def extend_leases(self, leases: Sequence[Lease], ttl: float) -> list[LeaseState]:
        """For each lease: extend it by ``ttl`` seconds and store ``lease.deadline_ms`` if it
        names ``lease.run_id``.

        Returns:
            One state per lease, in order: EXTENDED; MISSING when there is no live lease; LOST
            when another run holds it (nothing changed).

        Raises:
            ValueError: ``ttl`` is not positive (checked only when there are leases).
        """
        if leases:
            _check_ttl(ttl)
        return [self._extend(lease, ttl) for lease in leases]

    def _extend(self, lease: Lease, ttl: float) -> LeaseState:
        current = self._live_lease(lease.task_id)
        if current is None:
            return LeaseState.MISSING
        if current.run_id != lease.run_id:
            return LeaseState.LOST
        updated = dataclasses.replace(current, deadline_ms=lease.deadline_ms)
        self._leases[lease.task_id] = (updated, self._clock.now() + timedelta(seconds=ttl))
        return LeaseState.EXTENDED

    async def recreate_lease(self, lease: Lease, ttl: float) -> LeaseState:
        """Create the lease if none is live; extend it if it names ``lease.run_id``; else
        leave another run's lease alone (atomic: no await between check and write).

        Returns:
            EXTENDED (created, or ours and extended) or LOST (another run holds it).

        Raises:
            ValueError: ``ttl`` is not positive.
        """
        _check_ttl(ttl)
        if self._live_lease(lease.task_id) is None:
            self._leases[lease.task_id] = (lease, self._clock.now() + timedelta(seconds=ttl))
            return LeaseState.EXTENDED
        return self._extend(lease, ttl)

    async def delete_leases(self, leases: Sequence[tuple[UUID, UUID]]) -> None:
        """For each ``(task_id, run_id)``, delete the lease if it names ``run_id``; idempotent."""
        for task_id, run_id in leases:
            current = self._live_lease(task_id)
            if current is not None and current.run_id == run_id:
                del self._leases[task_id]

    async def leases_present(self, task_ids: Sequence[UUID]) -> set[UUID]:
        """The ids among ``task_ids`` that hold a live lease."""
        return {task_id for task_id in task_ids if self._live_lease(task_id) is not None}

    async def ping(self) -> None:
        """Always succeeds: the fake is always reachable."""

    # --- inspection (tests and ``dtq dev``; not part of the ``Queue`` port) -------------------

    def has_marker(self, task_id: UUID) -> bool:
        """True while the pending marker exists and has not expired by the clock."""
        return self._marker_live(task_id)

    def get_lease(self, task_id: UUID) -> Lease | None:
        """The live lease of the task, or None."""
        return self._live_lease(task_id)

    def flush(self) -> None:
        """Drop every marker, ready id, lease and scheduled entry (like FLUSHALL).

        Blocked poppers keep waiting, as blocked Redis clients do.
        """
        self._ready.clear()
        self._entries.clear()
        self._markers.clear()
        self._leases.clear()
        self._scheduled.clear()
        self._epoch = None

    def ready_ids(self, priority: str) -> list[UUID]:
        """The ids on the ``priority`` tier, oldest first (the order ``pop_many`` takes them)."""
        return list(self._ready.get(priority, ()))

    def routed_ids(self, priority: str, kind: str) -> list[UUID]:
        """The ids on the routed list of ``(priority, kind)``, oldest first."""
        return list(self._ready.get((priority, kind), ()))

    def scheduled_ids(self) -> list[UUID]:
        """The ids in the scheduled set, due or not, soonest first (ties by member text)."""
        entries = sorted(
            (score, f"{priority}|{task_id}", task_id)
            for (priority, task_id), score in self._scheduled.items()
        )
        return [task_id for _, _, task_id in entries]

    # --- the QueueInspector port (explain, issue 14 item 7) -----------------------------------

    def inspector(self) -> InMemoryQueue:
        """This fake as the ``QueueInspector`` of its own state (the composition root's hook)."""
        return self

    async def inspect(self, task_id: UUID, priority: str, kind: str | None = None) -> QueueSnapshot:
        """The marker, lease, scheduled entry and ready-list place of ``task_id`` under
        ``priority``, as ``RedisQueueInspector`` reads them: the place is exact at any depth
        (the fake keeps books of every push, as the Redis lists do), so ``searched`` is the
        whole list; with ``kind``, the routed list of ``(priority, kind)`` when the task is
        found there. Expiry is by the clock port."""
        now = self._clock.now()
        marker_ttl = lease_ttl = None
        if self._marker_live(task_id):
            marker_ttl = (self._markers[task_id] - now).total_seconds()
        lease = self._live_lease(task_id)
        if lease is not None:
            lease_ttl = (self._leases[task_id][1] - now).total_seconds()
        score = self._scheduled.get((priority, task_id))
        name: _List = priority
        routed = False
        if kind is not None and self._listed((priority, kind), task_id):
            name, routed = (priority, kind), True
        ready = self._ready.get(name, deque())
        return QueueSnapshot(
            server_time=now,
            marker_ttl=marker_ttl,
            lease=lease,
            lease_ttl=lease_ttl,
            scheduled_at=None if score is None else _EPOCH + score * _ONE_MS,
            ready_depth=len(ready),
            ready_position=ready.index(task_id) if self._listed(name, task_id) else None,
            searched=len(ready),
            routed=routed,
        )

    # --- reconciler safety (issue 12 bugs 3 and 7) --------------------------------------------

    # The fake starts as a queue that has held its data forever; ``flush`` loses the epoch
    # with everything else, and the next ``epoch`` call starts a new one at ``clock.now()``.
    _epoch: tuple[str, datetime] | None = ("initial", _EPOCH)

    async def server_time(self) -> datetime:
        """The fake's "server clock": ``clock.now()``."""
        return self._clock.now()

    async def epoch(self, token: str) -> QueueEpoch:
        """The current epoch; a new one named ``token``, begun now, if ``flush`` dropped it."""
        now = self._clock.now()
        created = self._epoch is None
        if self._epoch is None:
            self._epoch = (token, now)
        epoch_id, began = self._epoch
        return QueueEpoch(id=epoch_id, age=max((now - began).total_seconds(), 0.0), created=created)
