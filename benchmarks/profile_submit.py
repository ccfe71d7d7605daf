"""Where single submits spend their time: ``python -m benchmarks.profile_submit`` (issue 17 item 3).

Starts a real orchestrator (``benchmarks.profile_orchestrator``: ``dtq orchestrator`` with
round-trip counters) on a fresh database and prefix, warms it up, then sends ``--tasks`` single
``POST /v1/tasks`` with ``--in-flight`` outstanding, as ``make bench``'s submit scenario does.
Prints, per request: the rate, the CPU used by the orchestrator, the client, the PostgreSQL
backends serving this database and the Redis server (milliseconds per request, from
``/proc/<pid>/stat``), the store transactions, failed tries (40001 re-runs), SQL statements and
Redis round trips, and how large the group transactions were.

``--client raw`` sends the requests through a minimal keep-alive HTTP/1.1 client instead of
httpx (whose connection pool costs ~1 ms of CPU per request at 32 connections), so the client
takes less of the two cores from the server. ``--variant NAME=SRC[,KEY=VALUE...]`` runs the
orchestrator from another source tree (e.g. a ``git archive`` of the base revision) and/or
with extra environment; variants are interleaved run by run, in the given order in odd runs and
reversed in even ones (``run_order``), so a cost that falls on whichever runs first in a round
is shared alike. ``--spy FILE`` records the
orchestrator with py-spy (raw stacks; the last run's).

Usage::

    python -m benchmarks.profile_submit --runs 3 --client raw \\
        --variant base=/tmp/base/src --variant new=src
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from benchmarks.common import (
    ADMIN_DSN,
    BIN,
    ROOT,
    BenchError,
    Processes,
    post_same,
    say,
    temp_database,
    temp_prefix,
)
from benchmarks.dtq_bench import Cluster, post_many

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Variant:
    """An orchestrator build: its source tree and extra environment."""

    name: str
    src: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        name, _, rest = text.partition("=")
        src, *pairs = rest.split(",")
        env = dict(p.split("=", 1) for p in pairs if p)
        return cls(name, Path(src or ROOT / "src").resolve(), env)


def run_order(variants: Sequence[Variant], run: int) -> list[Variant]:
    """The variants of round ``run`` (0-based): as given in even rounds, reversed in odd ones
    (A B, B A, A B, ...), so over an even number of rounds each variant runs first as often."""
    return list(variants) if run % 2 == 0 else list(reversed(variants))


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _backends(database: str) -> list[int]:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _redis_pid() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "redis-server":
                    return int(entry.name)
            except OSError:
                continue
    return None


def one_run(
    args: argparse.Namespace, variant: Variant, logs: Path, spy: Path | None
) -> dict[str, Any]:
    """One fresh cluster of ``variant``: warm up, then the measured single submits."""
    counts_path = logs / f"counts-{variant.name}-{time.monotonic_ns()}.json"
    with (
        temp_database("psubmit", serializable=True) as dsn,
        temp_prefix("psubmit") as prefix,
        Processes(logs / variant.name) as procs,
    ):
        c = Cluster(dsn=dsn, prefix=prefix, procs=procs)
        c.migrate()
        env = c.env(PROFILE_COUNTS=str(counts_path), **variant.env)
        extra = variant.env.get("PYTHONPATH")  # e.g. a --target install of an optional package
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(variant.src), str(ROOT), extra)))
        argv = [sys.executable, "-m", "benchmarks.profile_orchestrator"]
        procs.start("orchestrator", argv, env)
        wait_healthy(c)
        pid = procs.procs["orchestrator"].pid
        post_many(f"{c.url}/v1/tasks", [{"kind": "noop"}] * 64, 16)  # warm-up
        database = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
        redis_pid = _redis_pid()
        pg_before = {p: _cpu(p) for p in _backends(database)}
        orch_before, redis_before = _cpu(pid), _cpu(redis_pid) if redis_pid else 0.0
        client_before = time.process_time()
        load = os.getloadavg()[0]
        spying = None
        if spy is not None:
            mode = os.environ.get("SPY_ARGS", "--nonblocking").split()  # e.g. "--native"
            spying = subprocess.Popen(
                [str(BIN / "py-spy"), "record", "--pid", str(pid), "--format", "raw",
                 "--rate", "250", *mode, "--output", str(spy)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(0.5)
        if args.client == "raw":
            elapsed = post_same(f"{c.url}/v1/tasks", {"kind": "noop"}, args.tasks, args.in_flight)
        elif args.client == "httpx-lanes":
            elapsed = asyncio.run(_httpx_lanes(c.url, args.tasks, args.in_flight))
        else:
            bodies = [{"kind": "noop"}] * args.tasks
            elapsed, _ = post_many(f"{c.url}/v1/tasks", bodies, args.in_flight)
        client_cpu = time.process_time() - client_before
        orch_cpu = _cpu(pid) - orch_before
        redis_cpu = (_cpu(redis_pid) - redis_before) if redis_pid else 0.0
        pg_cpu = sum(_cpu(p) - pg_before.get(p, 0.0) for p in _backends(database))
        retries = _store_retries(c.url)
        procs.stop("orchestrator")
        if spying is not None:
            spying.wait(timeout=30)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM tasks").fetchone()
        stored = int(row[0]) if row else 0
        c.close()
    if stored != args.tasks + 64:
        raise BenchError(f"{stored} tasks stored, expected {args.tasks + 64}")
    counts = json.loads(counts_path.read_text())
    store = counts["store"]
    n = args.tasks + 64  # the counters include the warm-up
    ms = 1000 / args.tasks
    return {
        "variant": variant.name,
        "rate": args.tasks / elapsed,
        "load1": load,
        "cpu_ms": {
            "orchestrator": orch_cpu * ms,
            "client": client_cpu * ms,
            "postgres": pg_cpu * ms,
            "redis": redis_cpu * ms,
        },
        "per_request": {
            "transactions": store.get("transactions", 0) / n,
            "failed_tries": (store.get("tries", 0) - store.get("transactions", 0)) / n,
            "statements": sum(counts["sql"].values()) / n,
            "redis_round_trips": _redis_round_trips(counts["redis"]) / n,
        },
        "store_retries": retries,
        "groups": counts["groups"],
        "gc": counts.get("gc", {"collections": [0, 0, 0], "seconds": 0.0}),
        "sql": counts["sql"],
        "redis": counts["redis"],
    }


async def _httpx_lanes(url: str, n: int, in_flight: int) -> float:
    """``n`` POSTs through ``in_flight`` httpx clients of one connection each."""
    left = n

    async def lane(client: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            r = await client.post("/v1/tasks", json={"kind": "noop"})
            if r.status_code != 201:
                raise BenchError(f"POST /v1/tasks -> {r.status_code}")

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(base_url=url, limits=limits, timeout=60) for _ in range(in_flight)]
    try:
        started = time.perf_counter()
        await asyncio.gather(*(lane(c) for c in clients))
        return time.perf_counter() - started
    finally:
        for c in clients:
            await c.aclose()


def _redis_round_trips(redis: dict[str, int]) -> int:
    return sum(v for k, v in redis.items() if not k.endswith(" commands"))


def _store_retries(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("orchestrator_store_retries_total{"):
            label, _, value = line.rpartition(" ")
            out[label.split('"')[1]] = float(value)
    return out


def wait_healthy(c: Cluster) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        c.procs.check_alive("orchestrator")
        try:
            if httpx.get(f"{c.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise BenchError(f"orchestrator not healthy:\n{c.procs.tail('orchestrator')}")


def _line(r: dict[str, Any]) -> str:
    cpu, per = r["cpu_ms"], r["per_request"]
    groups = {int(k): v for k, v in r["groups"].items()}
    written = sum(k * v for k, v in groups.items())
    mean_group = written / max(1, sum(groups.values()))
    passes = "/".join(map(str, r["gc"]["collections"]))  # per generation, warm-up included
    gc_ms = 1000 * r["gc"]["seconds"] / max(1, written)
    return (
        f"{r['variant']:>8}: {r['rate']:7,.0f}/s  cpu ms/req orch {cpu['orchestrator']:.3f} "
        f"client {cpu['client']:.3f} pg {cpu['postgres']:.3f} redis {cpu['redis']:.3f}  "
        f"tx/req {per['transactions']:.3f} failed {per['failed_tries']:.3f} "
        f"stmts/req {per['statements']:.2f} redis rt/req {per['redis_round_trips']:.3f} "
        f"group mean {mean_group:.1f}  gc {gc_ms:.3f} ms/req ({passes})  "
        f"load {r['load1']:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_submit")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--client", choices=("httpx", "httpx-lanes", "raw"), default="httpx")
    parser.add_argument("--variant", action="append", type=Variant.parse, default=None)
    parser.add_argument("--spy", type=Path, default=None, help="py-spy stacks of the orchestrator")
    parser.add_argument("--out", type=Path, default=None, help="every run's figures as JSON")
    args = parser.parse_args(argv)
    variants = args.variant or [Variant("here", (ROOT / "src").resolve())]
    logs = Path(tempfile.mkdtemp(prefix="dtq-psubmit-"))
    results: list[dict[str, Any]] = []
    for run in range(args.runs):
        for variant in run_order(variants, run):
            spy = args.spy.with_suffix(f".{variant.name}.txt") if args.spy else None
            r = one_run(args, variant, logs, spy if run == args.runs - 1 else None)
            results.append(r)
            say(f"run {run + 1} " + _line(r))
    by: dict[str, list[float]] = collections.defaultdict(list)
    for r in results:
        by[r["variant"]].append(r["rate"])
    for name, rates in by.items():
        say(f"{name}: median {statistics.median(rates):,.0f}/s over {len(rates)} runs")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
