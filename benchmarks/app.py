"""The handler app the dtq scenarios run in real ``dtq-worker`` processes.

Run with ``dtq-worker --app benchmarks.app:runtime``. Handlers that record something write to
Redis under ``$BENCH_APP_PREFIX`` (a key under the scenario's dtq prefix, so cleaning the prefix
cleans them too), at ``$REDIS_ADDR``:

* ``noop`` - does nothing.
* ``count`` - one ``INCR {prefix}done``: the same proof of work every peer's no-op task does.
* ``stamp`` - ``LPUSH {prefix}started "<task_id> <time.time()>"`` as its first action, so the
  client can BRPOP it and compute submit -> handler start.
* ``fail_once`` - attempt 1 records ``HSET {prefix}failed <task_id> <time.time()>`` just before
  raising; later attempts record ``HSET {prefix}retried <task_id> <time.time()>`` at start.
"""

from __future__ import annotations

import os
import time

from redis.asyncio import ConnectionPool, Redis

from benchmarks.resp import IncrClient
from dtq.worker import Options, Runtime, Task


def _options() -> Options:
    """The Runtime's documented defaults, except a shorter shutdown grace; ``BENCH_CLAIM_BATCH``
    overrides ``claim_batch`` (the tuned figure ``make bench`` reports beside the default's)."""
    batch = os.environ.get("BENCH_CLAIM_BATCH")
    if batch:
        return Options(shutdown_grace=1.0, claim_batch=int(batch))
    return Options(shutdown_grace=1.0)


runtime = Runtime(_options())

_client: Redis | None = None


def _prefix() -> str:
    return os.environ.get("BENCH_APP_PREFIX", "bench:app:")


def _redis() -> Redis:
    """One client per worker process (handlers all run on the worker's event loop).

    Its pool is not capped at redis-py's default of 100 connections, which refused the 101st
    with ``MaxConnectionsError`` and failed tasks at WORKER_CONCURRENCY >= 128; a plain pool
    rather than a ``BlockingConnectionPool`` (about 6 % faster here), like the peers' clients.
    """
    global _client  # noqa: PLW0603 - a lazily built per-process client
    if _client is None:
        url = f"redis://{os.environ.get('REDIS_ADDR', '127.0.0.1:6379')}/0"
        pool = ConnectionPool.from_url(url, max_connections=65_536)
        _client = Redis(connection_pool=pool)
    return _client


@runtime.handler("noop")
async def noop(task: Task) -> None:
    """Do nothing."""


_incr: IncrClient | None = None


def _incr_client() -> IncrClient:
    """The ``count`` handler's client (benchmarks/resp.py says why), one per process."""
    global _incr  # noqa: PLW0603 - a lazily built per-process client
    if _incr is None:
        host, _, port = os.environ.get("REDIS_ADDR", "127.0.0.1:6379").rpartition(":")
        _incr = IncrClient(host or "127.0.0.1", int(port))
    return _incr


@runtime.handler("count")
async def count(task: Task) -> None:
    """Count this run in Redis (what each peer's benchmark task does too): one ``INCR``
    acknowledged before the handler returns; ``BENCH_COUNT_CLIENT=redis-py`` sends it through
    redis-py's asyncio client instead of the minimal one."""
    if os.environ.get("BENCH_COUNT_CLIENT") == "redis-py":
        await _redis().incr(f"{_prefix()}done")
        return
    await _incr_client().incr(f"{_prefix()}done")


@runtime.handler("stamp")
async def stamp(task: Task) -> None:
    """Record the wall-clock time the handler started."""
    started = time.time()
    await _redis().lpush(f"{_prefix()}started", f"{task.id} {started!r}")


class PlannedFailure(Exception):
    """The first attempt of a ``fail_once`` task."""


@runtime.handler("fail_once")
async def fail_once(task: Task) -> None:
    """Fail the first attempt (recording when), succeed later ones (recording the start)."""
    now = time.time()
    if task.attempt <= 1:
        await _redis().hset(f"{_prefix()}failed", str(task.id), repr(time.time()))
        raise PlannedFailure("planned first-attempt failure")
    await _redis().hset(f"{_prefix()}retried", str(task.id), repr(now))
