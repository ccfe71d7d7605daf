"""What every peer driver shares: the task's proof of work (a Redis counter) and the timed wait
for it, with the same polling as the dtq scenarios."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import redis

from benchmarks.common import (
    ROOT,
    BenchError,
    Drain,
    Processes,
    redis_addr,
    redis_client,
    wait_drained,
)

WORKERS = 2  # worker processes per peer, as for dtq

_client: redis.Redis | None = None


def counter_key(prefix: str | None = None) -> str:
    """The key each task increments: under ``prefix``, or the worker's ``$BENCH_PEER_PREFIX``."""
    if prefix is None:
        prefix = os.environ.get("BENCH_PEER_PREFIX", "bench:peer:")
    return f"{prefix}done"


def incr() -> None:
    """The no-op task's body: count one run (a sync client, one per process)."""
    global _client  # noqa: PLW0603 - lazily built per process
    if _client is None:
        _client = redis.Redis.from_url(f"redis://{redis_addr()}/0")
    _client.incr(counter_key())


def read_counter(client: redis.Redis, key: str) -> int:
    return int(client.get(key) or 0)


def wait_all_ran(
    client: redis.Redis,
    key: str,
    n: int,
    procs: Processes,
    *,
    launched: float,
    durable_count: Callable[[], int] | None = None,
    timeout: float = 120,
) -> Drain:
    """Wait until the counter reaches ``n`` (and ``durable_count()`` too, when given: the end is
    when the peer's own record says everything is done); verify nothing ran twice."""
    drain = wait_drained(
        lambda: read_counter(client, key),
        n,
        launched=launched,
        timeout=timeout,
        check=procs.check_alive,
    )
    finished = drain.finished
    if durable_count is not None:
        finished = wait_drained(
            durable_count, n, launched=launched, timeout=120, check=procs.check_alive
        ).finished
    time.sleep(0.2)  # let a straggling duplicate show up before checking
    ran = read_counter(client, key)
    if ran != n:
        raise BenchError(f"{ran} task runs counted for {n} tasks")
    return Drain(tasks=n, started=drain.started, finished=finished, launched=launched)


def run_workers(
    logs: Path,
    prefix: str,
    n: int,
    commands: Sequence[tuple[str, list[str]]],
    *,
    env: Mapping[str, str] | None = None,
    durable_count: Callable[[], int] | None = None,
) -> Drain:
    """Start the peer's worker processes (``(name, argv)`` each, with ``$BENCH_PEER_PREFIX`` and
    the repository on ``PYTHONPATH``), time the drain with :func:`wait_all_ran`, stop them.

    Args:
        logs: where each process's output goes.
        prefix: the run's key prefix (the tasks' counter lives under it).
        n: how many tasks were queued.
        commands: the processes to start, started together just after ``launched`` is taken.
        env: more environment for every process.
        durable_count: as for :func:`wait_all_ran`.

    Raises:
        BenchError: a process died, or the tasks did not all run exactly once in time.
    """
    full_env = {**os.environ, "BENCH_PEER_PREFIX": prefix, "PYTHONPATH": str(ROOT), **(env or {})}
    client = redis_client()
    try:
        with Processes(logs) as procs:
            launched = time.monotonic()
            for name, argv in commands:
                procs.start(name, argv, full_env)
            try:
                return wait_all_ran(
                    client,
                    counter_key(prefix),
                    n,
                    procs,
                    launched=launched,
                    durable_count=durable_count,
                )
            finally:
                procs.stop()
    finally:
        client.close()
