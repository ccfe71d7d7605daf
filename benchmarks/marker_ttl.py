"""What a short pending-marker TTL costs the reconciler on real Redis (issue 12 bug 4).

A marker that expires while its id still waits in a long ready list makes the next reconcile
pass run the backlog guard (``Queue.enqueue_unlisted``) for that id: SET NX the marker, then look
for the id among the oldest ``listed_scan_limit`` list entries before pushing. A shorter TTL makes
that happen more often. This script fills a ready list with a backlog of N ids whose markers have
expired, then times one reconcile pass's pushes (pages of 500 ids, at most 10 pages), twice:
first with every marker expired (the guard runs for every id), then again at once (every marker
live: SET NX fails, nothing is scanned). It times the current script (chunked LRANGE into a Lua set)
and, for comparison, the former one (one LPOS per id). Then it sweeps whole backlogs with every
marker expired, for two scan limits, and counts the duplicates pushed (ids deeper than the
limit) and the cost of a page holding an id that is on no list.

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

# The guard before this change: one LPOS over the oldest ``limit`` entries per id.
_LPOS_PER_ID = """
local pushed = 0
local limit = tonumber(ARGV[2])
for i = 1, #ARGV - 2 do
  local id = ARGV[i + 2]
  if redis.call('SET', KEYS[3 * i - 2], '1', 'NX', 'PX', ARGV[1]) then
    if not redis.call('LPOS', KEYS[3 * i - 1], id, 'RANK', -1, 'MAXLEN', limit) then
      redis.call('LPUSH', KEYS[3 * i - 1], id)
      pushed = pushed + 1
    end
  end
end
return pushed
"""


async def _fill(client: Redis, prefix: str, ids: list[UUID]) -> None:
    ready = KeyLayout(prefix).ready("default")
    for start in range(0, len(ids), 5_000):
        await client.lpush(ready, *(str(task_id) for task_id in ids[start : start + 5_000]))


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
    if guard == "LPOS per id":
        queue._enqueue_unlisted = client.register_script(_LPOS_PER_ID)
    ids = [uuid.uuid4() for _ in range(backlog)]
    try:
        await _fill(client, prefix, ids)
        expired, worst, pushed = await _pass(queue, ids[: PAGE * PAGES])
        live, _, _ = await _pass(queue, ids[: PAGE * PAGES])
    finally:
        await _delete(client, prefix)
    return (
        f"{guard:<13}{backlog:>8}{expired * 1e3:>12.1f}{worst * 1e3:>12.1f}"
        f"{live * 1e3:>10.1f}{pushed:>8}"
    )


async def _sweep(client: Redis, backlog: int, limit: int) -> str:
    """Every id of the backlog once (markers expired), pages of 500, plus one page holding an
    id that is on no list (a stranded delivery): total and worst page time, duplicates."""
    prefix = f"dtqbench:marker:{uuid.uuid4().hex}:"
    queue = RedisQueue(client, prefix=prefix, marker_ttl=15.0, listed_scan_limit=limit)
    ids = [uuid.uuid4() for _ in range(backlog)]
    try:
        await _fill(client, prefix, ids)
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
    return (
        f"{backlog:>8}{limit:>8}{total * 1e3:>11.0f}{worst * 1e3:>12.1f}{pushed:>12}"
        f"{absent * 1e3:>12.1f}"
    )


async def main() -> None:
    client = connect_redis(REDIS_URL)
    try:
        print("One reconcile pass (10 pages of 500, oldest ids first), ms:")
        print(
            f"{'guard':<13}{'backlog':>8}{'expired':>12}{'worst page':>12}{'live':>10}{'pushed':>8}"
        )
        for guard in ("chunked", "LPOS per id"):
            for backlog in BACKLOGS:
                print(await _one_pass(client, guard, backlog))
        print("\nA full sweep of the backlog with every marker expired (chunked guard), ms:")
        print(
            f"{'backlog':>8}{'limit':>8}{'total':>11}{'worst page':>12}{'duplicates':>12}"
            f"{'absent id':>12}"
        )
        for backlog in (10_000, 50_000, 100_000):
            for limit in (10_000, 100_000):
                print(await _sweep(client, backlog, limit))
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
