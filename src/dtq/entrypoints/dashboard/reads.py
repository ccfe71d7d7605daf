"""The overview's bounded reads (issue 16 item 3): recent tasks per status, the ready lists'
depths, live workers and recent throughput, all through the application's services.

Nothing here counts a whole table. Tasks per status walks the listing's
``idx_tasks_status_created`` ranges for the tasks created in the last ``WINDOW`` (keysets only,
at most ``COUNT_CAP`` per status); throughput buckets the ``finished_at`` of at most
``THROUGHPUT_SAMPLE`` completed tasks of that window by minute; the ready depth is one
``QueueInspector`` round trip per priority (``default`` and every priority a live worker
advertises).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from dtq.application.filters import MAX_LIST_LIMIT, TaskFilter, TaskKeyset
from dtq.application.ports import QueueInspector
from dtq.application.queries import QueryService
from dtq.domain.entities import DEFAULT_PRIORITY, Worker
from dtq.domain.errors import BackendUnavailable
from dtq.domain.status import TaskStatus

#: The overview looks at the tasks created within this window.
WINDOW = timedelta(minutes=15)
#: Most tasks counted per status (the overview shows "1000+" beyond it).
COUNT_CAP = 1000
#: Most completed tasks read for the throughput chart.
THROUGHPUT_SAMPLE = 500
#: Minutes the throughput chart shows, newest last.
THROUGHPUT_MINUTES = 10
#: A worker is live when its registry row is at most this many seconds old (the default
#: ``active_since`` of ``GET /v1/workers``).
LIVE_WITHIN = 120.0
#: An id no task has: ``inspect`` of it answers only the list's depth.
_NO_TASK = UUID(int=0)


@dataclass(frozen=True, slots=True)
class StatusCount:
    """Tasks of one status in the window; ``capped`` when there are at least ``count``."""

    status: TaskStatus
    count: int
    capped: bool


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview page shows.

    Attributes:
        counts: tasks created within ``WINDOW``, per status, in the status order.
        depths: ``(priority, ids waiting)`` per ready list; depth None when the queue could
            not be read.
        workers: live workers, most recent heartbeat first.
        throughput: ``(minute "HH:MM" UTC, tasks completed in it)``, oldest first.
        sampled: True when the throughput read hit ``THROUGHPUT_SAMPLE`` (the chart is then a
            lower bound).
        at: when the overview was read (aware UTC, host clock).
    """

    counts: list[StatusCount]
    depths: list[tuple[str, int | None]]
    workers: list[Worker]
    throughput: list[tuple[str, int]]
    sampled: bool
    at: datetime


def advertised_priorities(workers: list[Worker]) -> list[str]:
    """``default`` plus every priority a worker lists in ``metadata["priorities"]``, sorted."""
    found = {DEFAULT_PRIORITY}
    for worker in workers:
        value = worker.metadata.get("priorities")
        if isinstance(value, list):
            found.update(v for v in value if isinstance(v, str))
    return sorted(found)


async def count_recent(queries: QueryService, status: TaskStatus, since: datetime) -> StatusCount:
    """Tasks of ``status`` created at or after ``since``, counted up to ``COUNT_CAP`` by
    walking keyset pages of the listing's status index."""
    where = TaskFilter(statuses=frozenset({status}), since=since)
    total = 0
    after: TaskKeyset | None = None
    while total < COUNT_CAP:
        batch = await queries.matching_task_ids(
            where, limit=min(MAX_LIST_LIMIT, COUNT_CAP - total), after=after
        )
        total += len(batch)
        if not batch:
            return StatusCount(status, total, capped=False)
        after = batch[-1]
    return StatusCount(status, total, capped=True)


async def throughput(queries: QueryService, now: datetime) -> tuple[list[tuple[str, int]], bool]:
    """Completions per minute over the last ``THROUGHPUT_MINUTES`` (by ``finished_at``), from
    the newest ``THROUGHPUT_SAMPLE`` completed tasks created within ``WINDOW``."""
    where = TaskFilter(statuses=frozenset({TaskStatus.COMPLETED}), since=now - WINDOW)
    page = await queries.list_tasks(where, limit=THROUGHPUT_SAMPLE)
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=THROUGHPUT_MINUTES)
    buckets = [0] * THROUGHPUT_MINUTES
    for task in page.tasks:
        done = task.finished_at
        if done is not None and start <= done < end:
            buckets[int((done - start) // timedelta(minutes=1))] += 1
    labels = [(start + timedelta(minutes=i)).strftime("%H:%M") for i in range(THROUGHPUT_MINUTES)]
    return list(zip(labels, buckets, strict=True)), page.next_after is not None


async def ready_depths(
    inspector: QueueInspector, priorities: list[str]
) -> list[tuple[str, int | None]]:
    """Each priority's ready-list depth; None for all when the queue server is unreachable
    (the overview still renders: the store is the system of record)."""
    try:
        return [(p, (await inspector.inspect(_NO_TASK, p)).ready_depth) for p in priorities]
    except BackendUnavailable:
        return [(p, None) for p in priorities]


async def read_overview(
    queries: QueryService, inspector: QueueInspector, *, now: datetime | None = None
) -> Overview:
    """The overview at ``now`` (default: the host clock, UTC).

    Raises:
        BackendUnavailable: the database failed (the queue failing only blanks the depths).
    """
    at = now or datetime.now(UTC)
    counts = [await count_recent(queries, s, at - WINDOW) for s in TaskStatus]
    workers = await queries.list_workers(LIVE_WITHIN)
    depths = await ready_depths(inspector, advertised_priorities(workers))
    chart, sampled = await throughput(queries, at)
    return Overview(counts, depths, workers, chart, sampled, at)


class OverviewReader:
    """:func:`read_overview` bound to its services: what the overview handlers are given (a
    concrete class, so Litestar can inject it by name; the inspector is a Protocol).

    Args:
        queries: the read side.
        inspector: the read-only queue view.
    """

    def __init__(self, *, queries: QueryService, inspector: QueueInspector) -> None:
        self._queries = queries
        self._inspector = inspector

    async def read(self) -> Overview:
        """The overview now (see :func:`read_overview`)."""
        return await read_overview(self._queries, self._inspector)
