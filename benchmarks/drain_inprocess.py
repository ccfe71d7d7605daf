"""Drain throughput of ONE in-process worker Runtime on the real adapters (not a test).

Creates a throwaway PostgreSQL database (serializable by default, migrated with
``apply_migrations``) and a unique Redis key prefix, submits ``--tasks`` no-op tasks with no
worker running, then starts one ``Runtime`` at ``--concurrency`` in this process and times how
long it takes until every task's success is committed (``worker_tasks_succeeded_total``, which
counts only committed successes). The database is dropped and every key under the prefix is
deleted afterwards, also when a run fails.

Logging is configured as a deployment would (JSON at ``--log-level``), written to /dev/null so
the rendering cost is measured without flooding the terminal.

Usage::

    python -m benchmarks.drain_inprocess                    # 5,000 tasks, concurrency 32, 3 runs
    python -m benchmarks.drain_inprocess --tasks 2000 --runs 1

Each run also prints the hot-path store transactions (``claim_many`` / ``complete_many`` calls
and their mean duration; ``claim`` / ``complete`` on code without the batch methods) and the
store's transaction re-runs by reason (``40001`` = serialization failure); ``--statements`` adds
the SQL statements the drain sent, by text, and ``--redis-calls`` the Redis round trips (commands
and pipelines, scripts by name), both deterministic up to batching, so they compare revisions on
a busy machine where the timings cannot. To measure another
revision, put its ``src`` first on ``PYTHONPATH`` (with ``migrations/`` next to it); the script
uses only APIs that older revisions have too.

Environment: ``BENCH_DATABASE_URL`` (admin DSN, default ``postgresql://postgres@127.0.0.1:5432/
postgres``) and ``BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry

from benchmarks.common import redis_addr, temp_database, temp_prefix
from dtq.adapters.cockroach import apply_migrations
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.logging import configure_logging
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.worker import Options, Runtime, Task

KIND = "noop"
OTHER_KIND = "noop.other"  # --fleet pair/mixed: half the tasks are of this kind
#: --fleet: the kinds each in-process runtime serves
FLEETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "one": ((KIND,),),
    "pair": ((KIND, OTHER_KIND), (KIND, OTHER_KIND)),  # two runtimes serving every kind
    "mixed": ((KIND,), (OTHER_KIND,)),  # a mixed fleet: kind-aware routing at work
}


@contextlib.contextmanager
def migrated_database() -> Iterator[str]:
    """A migrated throwaway SERIALIZABLE database (``benchmarks.common.temp_database``)."""
    with temp_database("drain", serializable=True) as dsn:
        apply_migrations(dsn)
        yield dsn


class CallStats:
    """Calls and total seconds of one wrapped service method."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def __str__(self) -> str:
        mean = 1000 * self.seconds / self.calls if self.calls else 0.0
        return f"{self.calls} calls, {mean:.1f} ms each"


def count_calls(target: Any, names: tuple[str, ...]) -> dict[str, CallStats]:
    """Wrap the async methods ``names`` of ``target`` that exist; count and time their calls."""
    stats: dict[str, CallStats] = {}
    for name in names:
        method = getattr(target, name, None)
        if method is None:
            continue
        stats[name] = CallStats()

        def wrap(fn: Callable[..., Awaitable[Any]], key: str) -> Callable[..., Awaitable[Any]]:
            async def counted(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    stats[key].calls += 1
                    stats[key].seconds += time.perf_counter() - began

            return counted

        setattr(target, name, wrap(method, name))
    return stats


#: Wall seconds per statement text, summed by ``counting_statements`` (cleared after each run).
STATEMENT_SECONDS: dict[str, float] = {}
#: serialization failures (40001) raised by each statement text while counting
STATEMENT_CONFLICTS: dict[str, int] = {}


@contextlib.contextmanager
def counting_statements() -> Iterator[dict[str, int]]:
    """Count the statements sent through ``psycopg.AsyncConnection.execute`` while open, keyed
    by their first 60 characters: a per-batch cost that, unlike the timings, does not move
    with the load other processes put on the machine. The wall time of each call (send to
    result, so it includes waits for the event loop) is summed in ``STATEMENT_SECONDS``."""
    counts: dict[str, int] = {}
    real = psycopg.AsyncConnection.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        key = " ".join(str(query).split())[:60]
        counts[key] = counts.get(key, 0) + 1
        t0 = time.perf_counter()
        try:
            return await real(self, query, *args, **kwargs)
        except psycopg.errors.SerializationFailure:
            STATEMENT_CONFLICTS[key] = STATEMENT_CONFLICTS.get(key, 0) + 1
            raise
        finally:
            STATEMENT_SECONDS[key] = STATEMENT_SECONDS.get(key, 0.0) + time.perf_counter() - t0

    psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        psycopg.AsyncConnection.execute = real  # type: ignore[method-assign]


def _script_names() -> dict[str, str]:
    """SHA1 -> name of the Lua scripts in ``dtq.adapters.redis.scripts`` (EVALSHA's argument)."""
    import hashlib

    from dtq.adapters.redis import scripts

    return {
        hashlib.sha1(value.encode()).hexdigest(): name  # Redis's script id
        for name, value in vars(scripts).items()
        if name.isupper() and isinstance(value, str)
    }


@contextlib.contextmanager
def counting_redis_calls() -> Iterator[dict[str, int]]:
    """Count the Redis round trips while open: each command sent on its own (``EVALSHA`` keyed
    by the script's name) and each pipeline (keyed ``pipeline``)."""
    from redis.asyncio.client import Pipeline, Redis

    counts: dict[str, int] = {}
    names = _script_names()
    real_command, real_pipeline = Redis.execute_command, Pipeline.execute

    async def execute_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(args[0]).upper() if args else "?"
        if name == "EVALSHA" and len(args) > 1:
            name = f"EVALSHA {names.get(str(args[1]), args[1])}"
        counts[name] = counts.get(name, 0) + 1
        return await real_command(self, *args, **kwargs)

    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["pipeline"] = counts.get("pipeline", 0) + 1
        return await real_pipeline(self, *args, **kwargs)

    Redis.execute_command = execute_command  # type: ignore[method-assign]
    Pipeline.execute = execute  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        Redis.execute_command = real_command  # type: ignore[method-assign]
        Pipeline.execute = real_pipeline  # type: ignore[method-assign]


def make_runtime(args: argparse.Namespace, kinds: tuple[str, ...] = (KIND,)) -> Runtime:
    """A Runtime with the no-op handler, at ``--concurrency`` (and the batch sizes if given)."""
    option_args: dict[str, Any] = {"concurrency": args.concurrency}
    fields = inspect.signature(Options).parameters
    for name in ("claim_batch", "complete_batch"):
        value = getattr(args, name)
        if value is not None:
            if name not in fields:
                raise SystemExit(f"this Options has no {name}")
            option_args[name] = value
    runtime = Runtime(Options(**option_args))

    returned: Any = {"ok": True, "n": 1} if getattr(args, "result", False) else None

    async def noop(task: Task) -> Any:
        return returned  # --result: a small JSON value, stored as the task's result

    for kind in kinds:
        runtime.register(kind, noop)

    return runtime


def _part(services: Any, bundle: str) -> Any:
    """The per-process bundle ``bundle`` of ``services`` (older trees: one flat bag)."""
    return getattr(services, bundle, services)


async def submit(services: Any, args: argparse.Namespace) -> float:
    """Submit ``--tasks`` no-op tasks split over ``--jobs`` jobs; return the seconds it took."""
    per_job = args.tasks // args.jobs
    started = time.perf_counter()
    for j in range(args.jobs):
        n = per_job if j < args.jobs - 1 else args.tasks - per_job * (args.jobs - 1)
        kinds = (KIND,) if getattr(args, "fleet", "one") == "one" else (KIND, OTHER_KIND)
        specs = tuple(TaskSpec(name=f"t{i}", kind=kinds[i % len(kinds)]) for i in range(n))
        await _part(services, "api").submit.submit_job(SubmitJob(tasks=specs))
    return time.perf_counter() - started


async def run_until_drained(
    runtime: Runtime, services: Any, metrics: WorkerMetrics, args: argparse.Namespace
) -> float:
    """Run the runtime until ``--tasks`` successes are committed; return the seconds it took.
    With ``--fleet pair`` or ``mixed`` a second runtime (``FLEETS``) runs beside it, with its
    own worker id and the same services and metrics."""

    def succeeded() -> float:
        total = 0.0
        for kind in (KIND, OTHER_KIND):
            value = metrics.registry.get_sample_value(
                "worker_tasks_succeeded_total", {"kind": kind}
            )
            total += 0.0 if value is None else value
        return total

    fleet = FLEETS[getattr(args, "fleet", "one")]
    if len(fleet) > 1:
        other = make_runtime(args, fleet[1])
        config = dataclasses.replace(
            other.configure(services.settings), worker_id=f"{services.settings.worker_id}-other"
        )
        stop_other = asyncio.Event()
        running_other = asyncio.create_task(
            other.run(_part(services, "worker"), config, stop=stop_other, metrics=metrics)
        )
        try:
            return await _drain_one(runtime, services, metrics, args, succeeded)
        finally:
            stop_other.set()
            await asyncio.wait_for(running_other, 30)
    return await _drain_one(runtime, services, metrics, args, succeeded)


async def _drain_one(
    runtime: Runtime,
    services: Any,
    metrics: WorkerMetrics,
    args: argparse.Namespace,
    succeeded: Callable[[], float],
) -> float:

    stop = asyncio.Event()
    started = time.perf_counter()
    if hasattr(runtime, "configure"):  # a WorkerConfig resolved once (the worker wing)
        running = runtime.run(
            _part(services, "worker"),
            runtime.configure(services.settings),
            stop=stop,
            metrics=metrics,
        )
    else:  # older trees: the runtime read the settings from the services
        running = runtime.run(services, stop=stop, metrics=metrics)
    worker = asyncio.create_task(running)
    deadline = started + args.timeout
    while succeeded() < args.tasks:
        if worker.done():
            worker.result()
            raise RuntimeError("the runtime stopped before the drain finished")
        if time.perf_counter() > deadline:
            stop.set()
            await worker
            raise RuntimeError(
                f"only {succeeded():.0f}/{args.tasks} tasks done after {args.timeout} s"
            )
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.wait_for(worker, 30)
    return elapsed


#: --tables: row writes per table since the database was created (submit included)
TABLE_STATS = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
    " WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname"
)


def _backend_cpu(dsn: str) -> dict[int, float]:
    """CPU seconds (user + system, from /proc) of every PostgreSQL backend connected to the
    drain's database, by pid; empty where /proc cannot be read (the server is elsewhere)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [
            int(row[0])
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    return cpu


async def drain_once(args: argparse.Namespace, dsn: str, prefix: str) -> dict[str, Any]:
    """Submit, then run one Runtime until every success is committed; return the figures."""
    settings = Settings(
        crdb_dsn=dsn,
        redis_addr=redis_addr(),
        redis_key_prefix=prefix,
        worker_id=f"drain-{uuid.uuid4().hex[:6]}",
        worker_concurrency=args.concurrency,
        log_level=args.log_level,
    )
    runtime = make_runtime(args, FLEETS[args.fleet][0])
    metrics = WorkerMetrics(CollectorRegistry())
    retries: dict[str, int] = {}

    def on_retry(reason: str) -> None:
        retries[reason] = retries.get(reason, 0) + 1

    async with open_services(settings, backend="real", on_store_retry=on_retry) as services:
        submitted_in = await submit(services, args)
        retries.clear()
        # One call = one store transaction: claim/complete delegate to the batch methods when
        # the service has them (older code has only the single ones).
        execution = _part(services, "worker").execution
        batch = hasattr(execution, "claim_many")
        names = ("claim_many", "complete_many") if batch else ("claim", "complete")
        calls = count_calls(execution, names)
        with contextlib.ExitStack() as stack:
            statements = stack.enter_context(counting_statements()) if args.statements else {}
            redis_calls = stack.enter_context(counting_redis_calls()) if args.redis_calls else {}
            db_before = _backend_cpu(dsn)
            cpu_before = time.process_time()
            elapsed = await run_until_drained(runtime, services, metrics, args)
            worker_cpu = time.process_time() - cpu_before
            db_after = _backend_cpu(dsn)
    db_cpu = sum(cpu - db_before.get(pid, 0.0) for pid, cpu in db_after.items())

    tables: list[tuple[Any, ...]] = []
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tasks WHERE status = 'completed'").fetchone()
        if args.tables:
            await asyncio.sleep(1.2)  # the backends flush their table counters within 1 s
            tables = conn.execute(TABLE_STATS).fetchall()
    completed = int(row[0]) if row else 0
    if completed != args.tasks:
        raise RuntimeError(f"{completed}/{args.tasks} tasks completed in the database")
    return {
        "elapsed": elapsed,
        "rate": args.tasks / elapsed,
        "submitted_in": submitted_in,
        "calls": calls,
        "retries": dict(retries),
        "statements": dict(statements),
        "redis_calls": dict(redis_calls),
        "worker_cpu_us": worker_cpu / args.tasks * 1e6,
        "db_cpu_us": db_cpu / args.tasks * 1e6,
        "tables": tables,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=1, help="split the tasks over this many jobs")
    parser.add_argument("--runs", type=int, default=3, help="each on a fresh database")
    parser.add_argument("--claim-batch", type=int, default=None)
    parser.add_argument("--complete-batch", type=int, default=None)
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--result", action="store_true", help="handlers return a small JSON value (a result)"
    )
    parser.add_argument(
        "--statements", action="store_true", help="count the SQL statements the drain sends"
    )
    parser.add_argument(
        "--redis-calls", action="store_true", help="count the Redis round trips of the drain"
    )
    parser.add_argument(
        "--tables",
        action="store_true",
        help="print rows inserted / updated (HOT of them) / deleted per table",
    )
    parser.add_argument(
        "--fleet",
        choices=sorted(FLEETS),
        default="one",
        help="one runtime; two serving both kinds (pair); two of one kind each (mixed)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain")
    args = parser.parse_args(argv)

    with Path(os.devnull).open("w") as sink:
        configure_logging("json", args.log_level, stream=sink)
        import dtq

        print(f"dtq from {Path(dtq.__file__).parent}", file=sys.stderr)
        rates: list[float] = []
        for run in range(1, args.runs + 1):
            with migrated_database() as dsn, temp_prefix("drain") as prefix:
                result = asyncio.run(drain_once(args, dsn, prefix))
            rates.append(result["rate"])
            calls = "; ".join(f"{k}: {v}" for k, v in result["calls"].items())
            print(
                f"run {run}: {args.tasks} tasks in {result['elapsed']:.2f} s = "
                f"{result['rate']:,.0f} tasks/s (submit {result['submitted_in']:.2f} s; "
                f"calls: {calls}; store re-runs: {result['retries'] or 0}; CPU per task: "
                f"worker {result['worker_cpu_us']:.0f} us, "
                f"PostgreSQL {result['db_cpu_us']:.0f} us)",
                flush=True,
            )
            for text, count in sorted(result["statements"].items(), key=lambda kv: -kv[1]):
                each = STATEMENT_SECONDS.get(text, 0.0) / count * 1000
                print(f"  {count:6d}  {each:6.2f} ms  {text}")
            STATEMENT_SECONDS.clear()
            for text, count in sorted(STATEMENT_CONFLICTS.items(), key=lambda kv: -kv[1]):
                print(f"  40001 x{count:4d} at  {text}")
            STATEMENT_CONFLICTS.clear()
            redis_calls = result["redis_calls"]
            if redis_calls:
                total = sum(redis_calls.values())
                print(f"  redis round trips: {total} ({total / args.tasks:.3f} per task)")
            for text, count in sorted(redis_calls.items(), key=lambda kv: -kv[1]):
                print(f"  {count:6d}  {text}")
            for name, ins, upd, hot, dele in result["tables"]:
                print(f"  table {name}: {ins} inserted, {upd} updated ({hot} HOT), {dele} deleted")
    print(
        f"drain, fleet {args.fleet}, concurrency {args.concurrency}: "
        f"median {statistics.median(rates):,.0f} tasks/s "
        f"(min {min(rates):,.0f}, max {max(rates):,.0f}, {len(rates)} runs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
