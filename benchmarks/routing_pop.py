"""What popping with kinds costs Redis (kind-aware routing, issue 15 item 2; not a test).

A worker that passes its kinds to ``Queue.pop_many`` pops, per tier, the tier's ready list plus
one routed list per kind: the same one round trip (``POP_MANY``), over more keys. This times
``pop_many(timeout=0)`` with a batch of ids waiting on the tier (the drain's case) for several
numbers of kinds, the routed lists empty as in a fleet where every worker serves every kind, and
``--calls`` calls per configuration, interleaved over ``--rounds`` rounds so machine load hits all
configurations alike. Keys are under a unique prefix, deleted afterwards.

Usage::

    python -m benchmarks.routing_pop                 # kinds: none, 1, 10, 50
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid

from benchmarks.common import redis_addr, temp_prefix
from dtq.adapters.redis import RedisQueue, connect_redis

BATCH = 32  # ids per pop, the drain benchmark's claim batch at concurrency 32


async def _time_pops(queue: RedisQueue, kinds: list[str] | None, calls: int) -> float:
    """Mean seconds of one ``pop_many`` taking ``BATCH`` ids (refilled outside the timing)."""
    total = 0.0
    for _ in range(calls):
        await queue.enqueue_many([(uuid.uuid4(), "default") for _ in range(BATCH)])
        began = time.perf_counter()
        popped = await queue.pop_many(["default"], 0, BATCH, kinds=kinds)
        total += time.perf_counter() - began
        await queue.release_markers(popped)
        assert len(popped) == BATCH
    return total / calls


async def run(args: argparse.Namespace, prefix: str) -> dict[str, list[float]]:
    client = connect_redis(redis_addr())
    queue = RedisQueue(client, prefix=prefix)
    configs: dict[str, list[str] | None] = {"no kinds": None}
    for n in (1, 10, 50):
        configs[f"{n} kinds"] = [f"kind-{i}" for i in range(n)]
    means: dict[str, list[float]] = {name: [] for name in configs}
    try:
        for _ in range(args.rounds):
            for name, kinds in configs.items():
                means[name].append(await _time_pops(queue, kinds, args.calls))
    finally:
        await client.aclose()
    return means


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with temp_prefix("routing") as prefix:
        means = asyncio.run(run(args, prefix))
    for name, values in means.items():
        print(f"{name:>9}: median {statistics.median(values) * 1e6:7.0f} us per pop of {BATCH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
