"""The sequential floor of an idle task's path, in process: ``python -m benchmarks.latency_floor``.

One process, the real adapters (a throwaway SERIALIZABLE PostgreSQL database and a Redis
prefix, as ``benchmarks.drain_inprocess``), no HTTP and no second process: per iteration one
``submit_job`` of a one-task job, the ``pop_many`` that finds it, its ``claim_many`` and its
``complete_many``, each timed (wall and this process's CPU). With ``--ab`` the iterations
alternate between two variants of the claim's read, in opposite order every other iteration,
so the load other processes put on the machine falls on both alike (issue 17 item 4):

* ``old``: a lone claim reads ``GET_TASKS`` then ``GET_JOBS`` (the base before
  ``TaskRepository.get_many_with_jobs``), patched in here;
* ``new``: the code as it is.

Usage::

    python -m benchmarks.latency_floor --tasks 800          # this code only
    python -m benchmarks.latency_floor --tasks 800 --ab     # old and new interleaved
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from benchmarks.common import redis_addr, temp_prefix
from benchmarks.drain_inprocess import migrated_database
from dtq.adapters.cockroach import repositories, sql
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.domain.entities import DEFAULT_PRIORITY, Job, Task
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services

WARMUP = 20
STAGES = ("submit", "pop", "claim", "complete")

_old_read = [False]
_joined = repositories.PgTaskRepository.get_many_with_jobs


async def _claim_read(
    self: repositories.PgTaskRepository, task_ids: Sequence[UUID]
) -> tuple[list[Task], list[Job]]:
    if not _old_read[0]:
        return await _joined(self, task_ids)
    tasks = await self.get_many(task_ids)
    job_ids = list(dict.fromkeys(t.job_id for t in tasks))
    cur = await self._conn.execute(sql.GET_JOBS, (job_ids,))
    return tasks, [repositories.job_from_row(row) for row in await cur.fetchall()]


async def run(args: argparse.Namespace, dsn: str, prefix: str) -> dict[str, dict[str, list[float]]]:
    settings = Settings(
        crdb_dsn=dsn,
        redis_addr=redis_addr(),
        redis_key_prefix=prefix,
        api_auth="none",
        log_level="warning",
    )
    variants = ["old", "new"] if args.ab else ["new"]
    if args.ab:
        repositories.PgTaskRepository.get_many_with_jobs = _claim_read  # type: ignore[method-assign]
    out: dict[str, dict[str, list[float]]] = {
        v: {f"{kind}{s}": [] for s in STAGES for kind in ("", "cpu ")} for v in variants
    }
    async with open_services(settings, backend="real") as services:
        submit, execution, queue = services.api.submit, services.worker.execution, services.queue
        spec = TaskSpec(name="t", kind="noop", payload={})
        for i in range(args.tasks + WARMUP):
            for variant in variants if i % 2 == 0 else variants[::-1]:
                _old_read[0] = variant == "old"
                marks = [(time.perf_counter(), time.process_time())]
                await submit.submit_job(SubmitJob(tasks=(spec,)))
                marks.append((time.perf_counter(), time.process_time()))
                ids = await queue.pop_many([DEFAULT_PRIORITY], timeout=1.0, max_count=32)
                marks.append((time.perf_counter(), time.process_time()))
                claims = await execution.claim_many(ids, "floor")
                marks.append((time.perf_counter(), time.process_time()))
                await execution.complete_many(claims)
                marks.append((time.perf_counter(), time.process_time()))
                if len(claims) != 1:
                    raise RuntimeError(f"popped {ids}, claimed {len(claims)}")
                if i < WARMUP:
                    continue
                for k, stage in enumerate(STAGES):
                    out[variant][stage].append(1000 * (marks[k + 1][0] - marks[k][0]))
                    out[variant][f"cpu {stage}"].append(1000 * (marks[k + 1][1] - marks[k][1]))
    return out


def _line(name: str, figures: dict[str, list[float]]) -> str:
    parts = []
    for key, values in figures.items():
        p50 = statistics.median(values)
        if key.startswith("cpu"):
            parts.append(f"{key} {p50:.3f}")
        else:
            p90 = sorted(values)[int(0.9 * len(values))]
            parts.append(f"{key} p50 {p50:.3f} p90 {p90:.3f}")
    return f"{name}: " + " | ".join(parts) + f" ms  (load {os.getloadavg()[0]:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency_floor")
    parser.add_argument("--tasks", type=int, default=300, help="iterations per variant")
    parser.add_argument("--ab", action="store_true", help="interleave the old claim read")
    args = parser.parse_args(argv)
    with migrated_database() as dsn, temp_prefix("floor") as prefix:
        results: Any = asyncio.run(run(args, dsn, prefix))
    for name, figures in results.items():
        print(_line(name, figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
