"""Procrastinate on PostgreSQL.

2 ``procrastinate worker`` processes with ``--concurrency 8`` each (its docs: concurrency is the
number of jobs a worker runs at once on its event loop; LISTEN/NOTIFY on, the default). The task
is ``async`` like dtq's. Jobs are deferred with one ``batch_defer`` per 1,000. Done when
``procrastinate_jobs`` has every job ``succeeded`` (its durable record) and the counter agrees.
"""

from __future__ import annotations

import os
from pathlib import Path

import procrastinate
import psycopg
from redis.asyncio import Redis

from benchmarks.common import (
    BIN,
    Drain,
    redis_addr,
    temp_database,
    temp_prefix,
)
from benchmarks.peers._base import WORKERS, counter_key, run_workers

CONCURRENCY = 8
_BATCH = 1000


def _app(dsn: str) -> procrastinate.App:
    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))


app = _app(os.environ.get("BENCH_PEER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
_client: Redis | None = None


@app.task(name="bench_count")
async def count() -> None:
    global _client  # noqa: PLW0603 - lazily built per worker process
    if _client is None:
        _client = Redis.from_url(f"redis://{redis_addr()}/0")
    await _client.incr(counter_key())


def drain(n: int, logs: Path) -> Drain:
    with temp_database("procrastinate") as dsn, temp_prefix("procrastinate") as prefix:
        producer = _app(dsn)
        with producer.open():
            producer.schema_manager.apply_schema()
            task = producer.tasks.get("bench_count") or producer.task(name="bench_count")(_noop)
            for start in range(0, n, _BATCH):
                task.batch_defer(*({} for _ in range(min(_BATCH, n - start))))
        return run_workers(
            logs,
            prefix,
            n,
            [
                (
                    f"procrastinate{i}",
                    [
                        str(BIN / "procrastinate"),
                        "--app",
                        "benchmarks.peers.procrastinate_peer.app",
                        "worker",
                        "--concurrency",
                        str(CONCURRENCY),
                        "--name",
                        f"bench{i}",
                    ],
                )
                for i in range(WORKERS)
            ],
            env={"BENCH_PEER_DSN": dsn},
            durable_count=lambda: _succeeded(dsn),
        )


async def _noop() -> None:
    """Producer-side stand-in: deferring only needs the task's name."""


def _succeeded(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
    return int(row[0]) if row else 0
