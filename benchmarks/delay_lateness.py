"""Lateness of delayed tasks on the real services (issue 14 item 2; not a test).

Creates a throwaway PostgreSQL database and a Redis key prefix, submits ``--tasks`` no-op tasks
(one job) due at staggered times (``--lead`` seconds after the submit, then one every
``--step`` seconds), runs the promoter loop (``Reconciler`` at ``PROMOTE_INTERVAL``) and one
worker ``Runtime`` in this process until all completed, and prints the lateness of each task's
first claim (``task_runs.started_at - tasks.scheduled_at``, both the database clock): p50, p99,
max, in milliseconds.

Usage::

    python -m benchmarks.delay_lateness                     # 200 tasks, 20 ms apart
    python -m benchmarks.delay_lateness --tasks 500 --step 0.005

Environment: ``BENCH_DATABASE_URL`` and ``BENCH_REDIS_URL`` as for ``benchmarks.drain_inprocess``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
from prometheus_client import CollectorRegistry

from benchmarks.common import redis_addr, temp_database, temp_prefix
from dtq.adapters.cockroach import apply_migrations
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.logging import configure_logging
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.reconciler import Reconciler
from dtq.worker import Options, Runtime, Task

KIND = "noop"


async def measure(args: argparse.Namespace, dsn: str, prefix: str) -> list[float]:
    settings = Settings(
        crdb_dsn=dsn,
        redis_addr=redis_addr(),
        redis_key_prefix=prefix,
        worker_id=f"lateness-{uuid.uuid4().hex[:6]}",
    )
    runtime = Runtime(Options(concurrency=args.concurrency))

    @runtime.handler(KIND)
    async def noop(task: Task) -> None:
        return None

    metrics = WorkerMetrics(CollectorRegistry())
    stop = asyncio.Event()
    async with open_services(settings, backend="real") as services:
        reconciler = Reconciler(
            services.reconciler.reconcile,
            interval=settings.reconcile_interval,
            promote_interval=settings.promote_interval,
            batch=settings.reconcile_batch,
        )
        loops = [
            asyncio.create_task(reconciler.run(stop)),
            asyncio.create_task(
                runtime.run(
                    services.worker, runtime.configure(settings), stop=stop, metrics=metrics
                )
            ),
        ]
        specs = tuple(
            TaskSpec(f"t{i}", KIND, delay=timedelta(seconds=args.lead + i * args.step))
            for i in range(args.tasks)
        )
        await services.api.submit.submit_job(SubmitJob(tasks=specs))
        deadline = time.monotonic() + args.lead + args.tasks * args.step + 30
        while True:
            done = metrics.registry.get_sample_value("worker_tasks_succeeded_total", {"kind": KIND})
            if (done or 0) >= args.tasks or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*loops)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM min(r.started_at) - t.scheduled_at)"
            " FROM tasks t JOIN task_runs r ON r.task_id = t.id GROUP BY t.id, t.scheduled_at"
        ).fetchall()
    return sorted(1000 * float(row[0]) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--lead", type=float, default=1.0, help="seconds to the first due time")
    parser.add_argument("--step", type=float, default=0.02, help="seconds between due times")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with (
        Path(os.devnull).open("w") as sink,
        temp_database("lateness", serializable=True) as dsn,
        temp_prefix("lateness") as prefix,
    ):
        configure_logging("json", "warning", stream=sink)
        apply_migrations(dsn)
        lateness = asyncio.run(measure(args, dsn, prefix))
    if len(lateness) < args.tasks:
        raise SystemExit(f"only {len(lateness)}/{args.tasks} tasks ran")
    p99 = lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))]
    print(
        f"{len(lateness)} delayed tasks, PROMOTE_INTERVAL default: lateness"
        f" p50 {statistics.median(lateness):.1f} ms, p99 {p99:.1f} ms, max {lateness[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
