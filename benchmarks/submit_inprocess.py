"""Single-task submit throughput on the real adapters, in process (not a test; issue 17 item 3).

Creates a throwaway SERIALIZABLE PostgreSQL database and a Redis key prefix (as
``benchmarks.drain_inprocess``), then sends ``--tasks`` one-task jobs through the submit service
(what ``POST /v1/tasks`` calls, without HTTP) with ``--in-flight`` of them outstanding at once,
and prints the rate, the store transactions it took and their re-runs. ``--http`` sends them as
``POST /v1/tasks`` to the app under uvicorn in this same process through httpx instead (client
and server then share one core: a floor, not the figure of a separate client).

Usage::

    python -m benchmarks.submit_inprocess                         # 5,000 submits, 32 in flight
    python -m benchmarks.submit_inprocess --tasks 2000 --runs 3 --http

Environment: ``BENCH_DATABASE_URL`` and ``BENCH_REDIS_URL`` as for the drain benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import uvicorn

from benchmarks.common import redis_addr, temp_prefix
from benchmarks.drain_inprocess import count_calls, counting_statements, migrated_database
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.logging import configure_logging

KIND = "noop"


async def _run_in_flight(n: int, in_flight: int, send: Any) -> float:
    """Call ``send(i)`` for ``i`` in ``0..n-1``, at most ``in_flight`` at once; seconds taken."""
    next_index = 0

    async def lane() -> None:
        nonlocal next_index
        while next_index < n:
            i = next_index
            next_index += 1
            await send(i)

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return time.perf_counter() - started


async def submit_once(args: argparse.Namespace, dsn: str, prefix: str) -> dict[str, Any]:
    settings = Settings(
        crdb_dsn=dsn,
        redis_addr=redis_addr(),
        redis_key_prefix=prefix,
        api_auth="none",
        log_level=args.log_level,
    )
    retries: dict[str, int] = {}

    def on_retry(reason: str) -> None:
        retries[reason] = retries.get(reason, 0) + 1

    async with open_services(settings, backend="real", on_store_retry=on_retry) as services:
        if args.group_max is not None:  # 1: every submission in its own transaction
            services.api.submit._group_max_jobs = args.group_max
        store_calls = count_calls(services.store, ("run",))
        with counting_statements() as statements:
            cpu_before = time.process_time()
            if args.http:
                elapsed = await _over_http(services, settings, args)
            else:
                submit = services.api.submit

                async def send(i: int) -> None:
                    spec = TaskSpec(name="task", kind=KIND, payload={"i": i})
                    await submit.submit_job(SubmitJob(tasks=(spec,)))

                elapsed = await _run_in_flight(args.tasks, args.in_flight, send)
            cpu = time.process_time() - cpu_before
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tasks").fetchone()
    stored = int(row[0]) if row else 0
    if stored != args.tasks:
        raise RuntimeError(f"{stored}/{args.tasks} tasks stored")
    return {
        "elapsed": elapsed,
        "rate": args.tasks / elapsed,
        "transactions": store_calls["run"].calls,
        "retries": dict(retries),
        "statements": sum(statements.values()),
        "cpu_ms": 1000 * cpu / args.tasks,
    }


async def _over_http(services: Any, settings: Settings, args: argparse.Namespace) -> float:
    from dtq.entrypoints.api import create_app
    from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry

    metrics = OrchestratorMetrics(new_registry())
    app = create_app(services.api, settings, metrics, metrics.registry)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False)
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=args.in_flight)
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60.0
        ) as c:

            async def send(i: int) -> None:
                r = await c.post("/v1/tasks", json={"kind": KIND, "payload": {"i": i}})
                if r.status_code != 201:
                    raise RuntimeError(f"POST /v1/tasks: {r.status_code} {r.text}")

            return await _run_in_flight(args.tasks, args.in_flight, send)
    finally:
        server.should_exit = True
        await serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="each on a fresh database")
    parser.add_argument("--http", action="store_true", help="POST /v1/tasks through uvicorn")
    parser.add_argument(
        "--group-max",
        type=int,
        default=None,
        help="submissions per group transaction (1 = no group commit; default: the service's)",
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    with Path(os.devnull).open("w") as sink:
        configure_logging("json", args.log_level, stream=sink)
        import dtq

        print(f"dtq from {Path(dtq.__file__).parent}", file=sys.stderr)
        rates: list[float] = []
        for run in range(1, args.runs + 1):
            with migrated_database() as dsn, temp_prefix(f"submit-{uuid.uuid4().hex[:4]}") as p:
                result = asyncio.run(submit_once(args, dsn, p))
            rates.append(result["rate"])
            print(
                f"run {run}: {args.tasks} single submits in {result['elapsed']:.2f} s = "
                f"{result['rate']:,.0f}/s ({result['transactions']} transactions, "
                f"{result['statements']} statements, re-runs: {result['retries'] or 0}; "
                f"{result['cpu_ms']:.3f} ms of this process's CPU per submit)",
                flush=True,
            )
    mode = "POST /v1/tasks via uvicorn" if args.http else "SubmitService"
    print(
        f"single submits, {mode}, {args.in_flight} in flight: median "
        f"{statistics.median(rates):,.0f}/s (min {min(rates):,.0f}, max {max(rates):,.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
