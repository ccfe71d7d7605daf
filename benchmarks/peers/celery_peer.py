"""Celery on a Redis broker, with no result backend or with a PostgreSQL result backend.

Throughput configuration (Celery's "Optimizing" guide): no result storage when results are not
needed (``task_ignore_result``), a large prefetch multiplier for many short tasks, no gossip /
mingle / heartbeat / remote control / events. 2 worker instances, each with the pool that was
fastest here for this workload while keeping 2 executing processes in all: ``threads`` x 8 for
the Redis-only variant (measured: solo 1,100/s, prefork 1,550/s, threads 2,000/s on 2,000
tasks), ``prefork -c 1`` for the PostgreSQL-results variant (solo 84/s, threads 103/s, prefork
186/s). Every Celery key goes under a unique ``global_keyprefix``.

The durable variant stores each result in PostgreSQL (SQLAlchemy ``db+`` backend) and is done
when ``celery_taskmeta`` holds a SUCCESS row for every task.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from celery import Celery

from benchmarks.common import (
    BIN,
    Drain,
    redis_addr,
    temp_database,
    temp_prefix,
)
from benchmarks.peers._base import WORKERS, incr, run_workers

PREFIX = os.environ.get("BENCH_PEER_PREFIX", "bench:celery:")
RESULT_URL = os.environ.get("BENCH_PEER_RESULTS") or None  # SQLAlchemy URL, durable variant
QUEUE = "bench"
POOL_REDIS = ("--pool=threads", "--concurrency=8")
POOL_PG = ("--pool=prefork", "--concurrency=1")

app = Celery("bench_celery", broker=f"redis://{redis_addr()}/0")
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX},
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    task_ignore_result=RESULT_URL is None,
    result_backend=f"db+{RESULT_URL}" if RESULT_URL else None,
    worker_prefetch_multiplier=64,
    worker_send_task_events=False,
    worker_enable_remote_control=False,
    worker_hijack_root_logger=False,
    task_serializer="json",
    accept_content=["json"],
)


@app.task(name="bench.count")
def count() -> None:
    incr()


def _sqlalchemy_url(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    user = info.get("user", "postgres")
    host = info.get("host", "127.0.0.1")
    port = info.get("port", "5432")
    return f"postgresql+psycopg://{user}@{host}:{port}/{info['dbname']}"


def drain(n: int, logs: Path, *, pg_results: bool = False) -> Drain:
    tag = "celerypg" if pg_results else "celery"
    with temp_prefix(tag) as prefix:
        if not pg_results:
            return _drain(n, logs, prefix, None)
        with temp_database(tag) as dsn:
            return _drain(n, logs, prefix, dsn)


def _drain(n: int, logs: Path, prefix: str, dsn: str | None) -> Drain:
    env: dict[str, str] = {}
    if dsn is not None:
        env["BENCH_PEER_RESULTS"] = _sqlalchemy_url(dsn)
    # The producer side needs the same prefix (and backend) as the workers: a fresh app.
    producer_app = Celery("bench_celery_client", broker=f"redis://{redis_addr()}/0")
    producer_app.conf.update(
        broker_transport_options={"global_keyprefix": prefix},
        task_default_queue=QUEUE,
        task_ignore_result=dsn is None,
        result_backend=f"db+{env['BENCH_PEER_RESULTS']}" if dsn else None,
        task_serializer="json",
    )
    task = producer_app.signature("bench.count")
    with producer_app.producer_or_acquire() as producer:
        for _ in range(n):
            task.apply_async(producer=producer)
    producer_app.close()

    return run_workers(
        logs,
        prefix,
        n,
        [
            (
                f"celery{i}",
                [
                    str(BIN / "celery"),
                    "-A",
                    "benchmarks.peers.celery_peer",
                    "worker",
                    *(POOL_PG if dsn is not None else POOL_REDIS),
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "--loglevel=WARNING",
                    "-Q",
                    QUEUE,
                    "-n",
                    f"bench{i}-{prefix.split(':')[2]}@%h",
                ],
            )
            for i in range(WORKERS)
        ],
        env=env,
        durable_count=None if dsn is None else (lambda: _successes(dsn)),
    )


def _successes(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'"
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0]) if row else 0
