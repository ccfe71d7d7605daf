"""Drain throughput of ONE worker Runtime over HTTP (issue 15 item 1), beside the native one.

Like :mod:`benchmarks.drain_inprocess` (same throwaway database and Redis prefix, same no-op
tasks submitted before any worker runs, same window: until every success is committed), but
the Runtime holds no database or Redis connection: it runs on the HTTP backend
(``dtq-worker --orchestrator``) against the orchestrator's API served by uvicorn on a loopback
port in the same process. Server and worker share this process's one event loop (and core), so
the figure is a floor of what a separate orchestrator would give; ``--native`` runs the native
drain in the same way first, for the ratio.

Usage::

    python -m benchmarks.drain_http                      # 2,000 tasks, concurrency 32, 3 runs
    python -m benchmarks.drain_http --tasks 1000 --runs 1 --native

Environment: as :mod:`benchmarks.drain_inprocess`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import uvicorn
from prometheus_client import CollectorRegistry

from benchmarks.common import redis_addr, temp_prefix
from benchmarks.drain_inprocess import (
    drain_once,
    make_runtime,
    migrated_database,
    submit,
)
from dtq.entrypoints.api import create_app
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.logging import configure_logging
from dtq.entrypoints.metrics import OrchestratorMetrics, WorkerMetrics, new_registry
from dtq.entrypoints.worker.http import open_http_worker_services

KIND = "noop"


def _no_auth() -> dict[str, Any]:
    """``API_AUTH=none`` where the tree has tokens (issue 15 item 3): the API is on loopback."""
    return {"api_auth": "none"} if "api_auth" in Settings.__dataclass_fields__ else {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def drain_http_once(args: argparse.Namespace, dsn: str, prefix: str) -> dict[str, Any]:
    """Submit, serve the API, run one HTTP-backed Runtime until every success is committed."""
    settings = Settings(
        crdb_dsn=dsn,
        redis_addr=redis_addr(),
        redis_key_prefix=prefix,
        worker_id=f"drain-http-{uuid.uuid4().hex[:6]}",
        worker_concurrency=args.concurrency,
        log_level=args.log_level,
        **_no_auth(),
    )
    runtime = make_runtime(args)
    metrics = WorkerMetrics(CollectorRegistry())
    async with open_services(settings, backend="real") as services:
        submitted_in = await submit(services, args)
        registry = new_registry()
        app = create_app(services.api, settings, OrchestratorMetrics(registry), registry)
        port = _free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
        )
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            async with open_http_worker_services(
                f"http://127.0.0.1:{port}",
                worker_id=settings.worker_id,
                kinds=runtime.kinds,
                lease_duration=settings.lease_duration,
                max_result_bytes=settings.api_max_result_bytes,
            ) as backend:
                elapsed = await _run(runtime, backend, settings, metrics, args)
        finally:
            server.should_exit = True
            await serving
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tasks WHERE status = 'completed'").fetchone()
    completed = int(row[0]) if row else 0
    if completed != args.tasks:
        raise RuntimeError(f"{completed}/{args.tasks} tasks completed in the database")
    return {"elapsed": elapsed, "rate": args.tasks / elapsed, "submitted_in": submitted_in}


async def _run(
    runtime: Any, backend: Any, settings: Settings, metrics: WorkerMetrics, args: Any
) -> float:
    def succeeded() -> float:
        value = metrics.registry.get_sample_value("worker_tasks_succeeded_total", {"kind": KIND})
        return 0.0 if value is None else value

    stop = asyncio.Event()
    started = time.perf_counter()
    worker = asyncio.create_task(
        runtime.run(backend, runtime.configure(settings), stop=stop, metrics=metrics)
    )
    deadline = started + args.timeout
    while succeeded() < args.tasks:
        if worker.done():
            worker.result()
            raise RuntimeError("the runtime stopped before the drain finished")
        if time.perf_counter() > deadline:
            stop.set()
            await worker
            raise RuntimeError(f"only {succeeded():.0f}/{args.tasks} done after {args.timeout} s")
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.wait_for(worker, 30)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3, help="each on a fresh database")
    parser.add_argument("--native", action="store_true", help="also run the native drain")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain")
    args = parser.parse_args(argv)
    # what benchmarks.drain_inprocess's helpers read
    args.claim_batch = args.complete_batch = None
    args.result = args.statements = False

    with Path(os.devnull).open("w") as sink:
        configure_logging("json", args.log_level, stream=sink)
        modes = (("native", drain_once), ("http", drain_http_once))
        rates: dict[str, list[float]] = {}
        for run in range(1, args.runs + 1):
            for mode, drain in modes:
                if mode == "native" and not args.native:
                    continue
                with migrated_database() as dsn, temp_prefix("drain") as prefix:
                    result = asyncio.run(drain(args, dsn, prefix))
                rates.setdefault(mode, []).append(result["rate"])
                print(
                    f"run {run} {mode}: {args.tasks} tasks in {result['elapsed']:.2f} s = "
                    f"{result['rate']:,.0f} tasks/s",
                    flush=True,
                )
    for mode, values in rates.items():
        print(
            f"drain, 1 runtime ({mode}), concurrency {args.concurrency}: median "
            f"{statistics.median(values):,.0f} tasks/s (min {min(values):,.0f}, "
            f"max {max(values):,.0f}, {len(values)} runs)"
        )
    if "native" in rates and "http" in rates:
        ratio = statistics.median(rates["http"]) / statistics.median(rates["native"])
        print(f"http / native: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
