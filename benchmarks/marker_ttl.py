"""What a short pending-marker TTL costs the reconciler on real Redis (issue 12 bug 4).

A marker that expires while its id still waits in a long ready list makes the next reconcile
pass run the backlog guard (``Queue.enqueue_unlisted``) for that id: SET NX the marker, then ask
the list's books whether the id still waits (one ZSCORE, issue 17 item 5; the guard used to
read the list's oldest entries, up to 100,000 of them). A shorter TTL makes that happen more
often. This script fills a ready list with a backlog of N ids (``enqueue_many``) whose markers
have expired, then times one reconcile pass's pushes (pages of 500 ids, at most 10 pages),
twice: first with every marker expired (the guard runs for every id), then again at once (every
marker live: SET NX fails). Then it sweeps whole backlogs with every marker expired and counts
the duplicates pushed and the cost of a page holding an id that is on no list.

Run: ``PYTHONPATH=src python -m benchmarks.marker_ttl`` (Redis at ``BENCH_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from uuid import UUID

from redis.asyncio import Redis

from benchmarks.common import REDIS_URL
from dtq.adapters.redis import KeyLayout, RedisQueue, connect_redis, tagged_prefix

PAGE = 500  # RECONCILE_BATCH default
PAGES = 10  # reconcile_once's max_pages
BACKLOGS = (1_000, 10_000, 50_000)


async def _fill(client: Redis, queue: RedisQueue, prefix: str, ids: list[UUID]) -> None:
    """Push ``ids`` (with their books), then drop their markers: expired while they waited."""
    layout = KeyLayout(prefix)
    for start in range(0, len(ids), 5_000):
        chunk = ids[start : start + 5_000]
        await queue.enqueue_many([(task_id, "default") for task_id in chunk])
        await client.delete(*(layout.marker(task_id) for task_id in chunk))


async def _pass(queue: RedisQueue, ids: list[UUID]) -> tuple[float, float, int]:
    """One reconcile pass over the oldest ids: total and worst page seconds, ids pushed."""
    total = worst = 0.0
    pushed = 0
    for page in range(PAGES):
        chunk = ids[page * PAGE : (page + 1) * PAGE]
        if not chunk:
            break
        started = time.perf_counter()
        pushed += await queue.enqueue_unlisted([(task_id, "default", "k") for task_id in chunk])
        took = time.perf_counter() - started
        total, worst = total + took, max(worst, took)
    return total, worst, pushed


async def _delete(client: Redis, prefix: str) -> None:
    match = f"{tagged_prefix(prefix)}*"
    keys = [key async for key in client.scan_iter(match=match, count=5_000)]
    for start in range(0, len(keys), 5_000):
        await client.delete(*keys[start : start + 5_000])


async def _one_pass(client: Redis, guard: str, backlog: int) -> str:
    """One reconcile pass over the oldest ids of a backlog, markers expired, then live."""
    prefix = f"dtqbench:marker:{uuid.uuid4().hex}:"
    queue = RedisQueue(client, prefix=prefix, marker_ttl=15.0)
    ids = [uuid.uuid4() for _ in range(backlog)]
    try:
        await _fill(client, queue, prefix, ids)
        expired, worst, pushed = await _pass(queue, ids[: PAGE * PAGES])
        live, _, _ = await _pass(queue, ids[: PAGE * PAGES])
    finally:
        await _delete(client, prefix)
    return (
        f"{guard:<13}{backlog:>8}{expired * 1e3:>12.1f}{worst * 1e3:>12.1f}"
        f"{live * 1e3:>10.1f}{pushed:>8}"
    )


async def _sweep(client: Redis, backlog: int) -> str:
    """Every id of the backlog once (markers expired), pages of 500, plus one page holding an
    id that is on no list (a stranded delivery): total and worst page time, duplicates."""
    prefix = f"dtqbench:marker:{uuid.uuid4().hex}:"
    queue = RedisQueue(client, prefix=prefix, marker_ttl=15.0)
    ids = [uuid.uuid4() for _ in range(backlog)]
    try:
        await _fill(client, queue, prefix, ids)
        total = worst = 0.0
        pushed = 0
        for start in range(0, backlog, PAGE):
            page_s, page_worst, page_pushed = await _pass(queue, ids[start : start + PAGE])
            total, worst, pushed = total + page_s, max(worst, page_worst), pushed + page_pushed
        started = time.perf_counter()
        await queue.enqueue_unlisted([(uuid.uuid4(), "default", "k")])
        absent = time.perf_counter() - started
    finally:
        await _delete(client, prefix)
    return f"{backlog:>8}{total * 1e3:>11.0f}{worst * 1e3:>12.1f}{pushed:>12}{absent * 1e3:>12.1f}"


async def main() -> None:
    client = connect_redis(REDIS_URL)
    try:
        print("One reconcile pass (10 pages of 500, oldest ids first), ms:")
        print(
            f"{'guard':<13}{'backlog':>8}{'expired':>12}{'worst page':>12}{'live':>10}{'pushed':>8}"
        )
        for backlog in BACKLOGS:
            print(await _one_pass(client, "books", backlog))
        print("\nA full sweep of the backlog with every marker expired, ms:")
        print(f"{'backlog':>8}{'total':>11}{'worst page':>12}{'duplicates':>12}{'absent id':>12}")
        for backlog in (10_000, 50_000, 100_000):
            print(await _sweep(client, backlog))
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
