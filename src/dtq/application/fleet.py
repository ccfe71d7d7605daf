"""Who serves what: the live workers' advertised kinds and priorities (issue 14 item 7, issue 15
item 2's visibility part): the ``queued_no_worker`` check of explain and the submit warnings.

A worker advertises, in its registry row's metadata (``entrypoints/worker/session.py``),
``"kinds"`` (the kinds it registered) and ``"priorities"`` (the tiers it polls); an HTTP
worker's claims add the kinds and priorities they name to its row (``application.remote``). A
row without ``"priorities"`` (a worker older than this field) polls the default tier only, as
the reconciler's unpolled check reads it; a row without ``"kinds"`` is taken to serve every
kind (nothing is known); a field that is not a list of strings (``POST /v1/worker/registry``
refuses one; a row written before it did) counts as serving everything, so a malformed row
never produces a false alarm. A worker whose row names another Redis key prefix than this
deployment's queue (``Worker.redis_key_prefix``) serves nothing here: it pops other lists
(``on_queue``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from dtq.application.commands import TaskSpec
from dtq.application.ports import Clock, Store, Transaction
from dtq.domain.entities import DEFAULT_PRIORITY, Worker

#: Seconds a registry read is reused by ``FleetService.cached`` (issue 14 item 7: at most one
#: read per second on the submit path).
CACHE_FOR = 1.0

#: Seconds a submit waits for a registry read before it answers without warnings.
READ_TIMEOUT = 1.0

#: Single-task submit warnings remembered per fleet read (distinct kind, priority and name);
#: past that the memo starts over.
MEMO_MAX = 1024


class Missing(StrEnum):
    """What no live worker offers for a task."""

    PRIORITY = "priority"  # no live worker polls the task's priority
    KIND = "kind"  # no live worker that polls its priority registered its kind


class WarningCode(StrEnum):
    """Submit warning codes (``POST /v1/tasks``, ``POST /v1/jobs``): the submit succeeded."""

    NO_WORKER_FOR_PRIORITY = "no_worker_for_priority"
    NO_WORKER_FOR_KIND = "no_worker_for_kind"


@dataclass(frozen=True, slots=True)
class SubmitWarning:
    """One warning of a submit: ``task`` (its name) will not run until a worker serves it."""

    code: WarningCode
    task: str
    message: str


def on_queue(workers: Sequence[Worker], queue_prefix: str | None) -> list[Worker]:
    """The ``workers`` that pop this deployment's ready lists: those whose row names
    ``queue_prefix`` or no prefix at all (a worker older than the field); all of them when
    ``queue_prefix`` is None."""
    if queue_prefix is None:
        return list(workers)
    return [w for w in workers if w.redis_key_prefix in (None, queue_prefix)]


#: What a row without ``priorities`` polls.
PRIORITIES = [DEFAULT_PRIORITY]


def advertised(
    metadata: Mapping[str, Any], key: str, default: list[str] | None = None
) -> frozenset[str] | None:
    """A registry row's ``metadata[key]`` (``kinds``, ``priorities``) as a set; None means
    "everything" (absent without a default, or not a list of strings)."""
    value = metadata.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return frozenset(value)


class Fleet:
    """The live workers at one instant, as the registry advertises them.

    Args:
        workers: registry rows whose last heartbeat is within the live window.
        alive_within: the live window in seconds.
    """

    __slots__ = ("_served", "alive_within", "workers")

    def __init__(self, workers: Sequence[Worker], alive_within: float) -> None:
        self.workers = tuple(workers)
        self.alive_within = alive_within
        # per worker: (kinds, priorities) it serves; None for "every one"
        self._served = [
            (advertised(w.metadata, "kinds"), advertised(w.metadata, "priorities", PRIORITIES))
            for w in self.workers
        ]

    def missing(self, kind: str, priority: str) -> tuple[Missing, ...]:
        """What keeps ``(kind, priority)`` from being served; empty when some live worker both
        polls ``priority`` and registered ``kind``. O(workers).

        ``PRIORITY``: no live worker polls the tier. ``KIND``: no live worker polling the tier
        registered the kind (when nobody polls the tier, ``KIND`` is added only if no live
        worker at all registered the kind). With kind-aware routing (issue 15 item 2) a
        ``KIND`` task is routed away by the workers that pop it and waits ``queued`` on the
        routed list of its kind until a worker that registered the kind is live.
        """
        polled = has_kind = False
        for kinds, priorities in self._served:
            serves_kind = kinds is None or kind in kinds
            has_kind = has_kind or serves_kind
            if priorities is None or priority in priorities:
                if serves_kind:
                    return ()
                polled = True
        if polled:
            return (Missing.KIND,)
        return (Missing.PRIORITY,) if has_kind else (Missing.PRIORITY, Missing.KIND)


def describe_missing(missing: Missing, kind: str, priority: str) -> str:
    """One sentence on what is missing, for warnings and explain messages."""
    if missing is Missing.PRIORITY:
        return f"no live worker polls priority {priority!r}"
    return f"no live worker that polls priority {priority!r} registered kind {kind!r}"


class FleetService:
    """Reads the worker registry for explain (fresh) and for submit warnings (cached).

    Args:
        store: the system of record (the ``workers`` table).
        clock: host time, for the cache's age only.
        alive_within: seconds since its last registry heartbeat within which a worker is live
            (the default window of ``GET /v1/workers``).
        cache_for: seconds ``cached`` reuses a read (default ``CACHE_FOR``).
        read_timeout: seconds ``cached`` waits for a read (default ``READ_TIMEOUT``).
        queue_prefix: the hash-tagged Redis key prefix of this deployment's queue: workers
            registered with another one serve nothing here (``on_queue``); None counts all.
    """

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        alive_within: float,
        cache_for: float = CACHE_FOR,
        read_timeout: float = READ_TIMEOUT,
        queue_prefix: str | None = None,
    ) -> None:
        self._store = store
        self._queue_prefix = queue_prefix
        self._clock = clock
        self._alive_within = alive_within
        self._cache_for = timedelta(seconds=cache_for)
        self._read_timeout = read_timeout
        self._lock = asyncio.Lock()
        self._cached: tuple[datetime, Fleet | None] | None = None
        # single-task submits' warnings by (kind, priority, name), for the fleet read they
        # were computed from
        self._memo_fleet: Fleet | None = None
        self._memo: dict[tuple[str, str, str], tuple[SubmitWarning, ...]] = {}

    async def read(self, tx: Transaction) -> Fleet:
        """The live workers by ``tx``'s database clock (inside the caller's transaction)."""
        since = await tx.now() - timedelta(seconds=self._alive_within)
        workers = on_queue(await tx.workers.list_active(since=since), self._queue_prefix)
        return Fleet(workers, self._alive_within)

    async def cached(self) -> Fleet | None:
        """The fleet read at most ``cache_for`` ago; concurrent callers share one read.

        Returns:
            The fleet, or None when the last read failed or took over ``read_timeout`` (that
            outcome is cached too, so an outage costs one read per ``cache_for``). Never raises
            for a backend failure: a submit must not fail because of it.
        """
        cached = self._cached
        if cached is not None and self._clock.now() - cached[0] < self._cache_for:
            return cached[1]  # the common case, without the lock
        async with self._lock:
            now = self._clock.now()
            if self._cached is not None and now - self._cached[0] < self._cache_for:
                return self._cached[1]
            fleet: Fleet | None
            try:
                async with asyncio.timeout(self._read_timeout):
                    fleet = await self._store.run(self.read)
            except Exception:  # any failure: no warnings, never a failed submit
                fleet = None
            self._cached = (self._clock.now(), fleet)
            return fleet

    async def submit_warnings(self, tasks: Sequence[TaskSpec]) -> list[SubmitWarning]:
        """Warnings for the submitted ``tasks`` whose kind or priority no live worker serves
        (issue 14 item 7): one per distinct (code, kind or priority), naming the first task
        that has it and how many others share it, so a 10,000-task job gets a few lines.
        Empty when every task is served, or when the registry could not be read.
        """
        fleet = await self.cached()
        if fleet is None:
            return []
        if len(tasks) == 1:  # a single-task submit: the same few (kind, priority, name) repeat
            spec = tasks[0]
            key = (spec.kind, spec.priority, spec.name)
            if self._memo_fleet is not fleet or len(self._memo) >= MEMO_MAX:
                self._memo_fleet, self._memo = fleet, {}
            known = self._memo.get(key)
            if known is None:
                known = self._memo[key] = tuple(self._warnings(fleet, tasks))
            return list(known)
        return self._warnings(fleet, tasks)

    @staticmethod
    def _warnings(fleet: Fleet, tasks: Sequence[TaskSpec]) -> list[SubmitWarning]:
        groups: dict[tuple[str, str], list[Any]] = {}  # (kind, priority) -> [first name, n]
        for spec in tasks:
            group = groups.get((spec.kind, spec.priority))
            if group is None:
                groups[(spec.kind, spec.priority)] = [spec.name, 1]
            else:
                group[1] += 1
        found: dict[tuple[WarningCode, str, str], list[Any]] = {}  # -> [first name, n]
        for (kind, priority), (name, count) in groups.items():
            for missing in fleet.missing(kind, priority):
                if missing is Missing.PRIORITY:
                    key = (WarningCode.NO_WORKER_FOR_PRIORITY, priority, "")
                else:
                    key = (WarningCode.NO_WORKER_FOR_KIND, priority, kind)
                if key in found:
                    found[key][1] += count
                else:
                    found[key] = [name, count]
        warnings = []
        for (code, priority, kind), (name, count) in found.items():
            what = Missing.PRIORITY if code is WarningCode.NO_WORKER_FOR_PRIORITY else Missing.KIND
            others = count - 1
            tail = f" (and {others} more task{'s' if others > 1 else ''})" if others else ""
            message = f"{describe_missing(what, kind, priority)}: task {name!r}{tail} stays queued"
            warnings.append(SubmitWarning(code=code, task=name, message=message))
        return warnings
