"""A million-task backlog (issue 17 item 5): ``make bench-backlog``, or
``python -m benchmarks.backlog [--tasks N]``.

Two fresh clusters (database, Redis prefix, a real ``dtq orchestrator``; 2 ``dtq-worker``
processes for the drains, as ``benchmarks.dtq_bench``), the small one before the large one:

* **baseline**: one job of ``--job-size`` (10,000) ``count`` tasks submitted with
  ``POST /v1/jobs``, then drained whole.
* **backlog**: ``--tasks`` (1,000,000) tasks submitted as jobs of ``--job-size``, one
  ``POST /v1/jobs`` after the other, with no worker running; then two reconcile passes measured
  in this process on the same database and prefix (the oldest 5,000 due tasks, then 5,000 at
  90 % depth, every one of their markers deleted first so the backlog guard runs for each id),
  an ``EXPLAIN ANALYZE`` of the reconciler's due listing at that depth, and a drain of the first
  ``--window`` (50,000) tasks with the rest of the backlog behind them.

Reported: submit µs per task (the baseline's job; the backlog's first and last 10 jobs and all
of them), drain µs per task over the window (first handler run to the ``window``-th, by the
``count`` handler's Redis counter) and CPU µs per task in that window (the workers, the
orchestrator, this database's PostgreSQL backends, and the Redis server, which other clients
share), the reconcile passes' duration and ids pushed, Redis blocking (the SLOWLOG entries of this
run's keys, threshold 1 ms while the run lasts; the old setting is put back), the ready list's
length against the queued tasks (duplicates), and the RSS of every dtq process and Redis's
memory at the start, middle and end of the submit and of the drain. Nothing is asserted: the
figures are printed (a markdown table on stdout, progress on stderr) and written to
``benchmarks/results/backlog.json``. The whole run at 1,000,000 tasks takes several minutes on
2 cores; develop with ``--tasks 100000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

from benchmarks.common import (
    BenchError,
    backend_pids,
    check_services,
    cpu_seconds,
    median,
    probe_connect,
    redis_addr,
    redis_client,
    redis_cpu,
    say,
)
from benchmarks.dtq_bench import Cluster, cluster, flat_job, post_json
from benchmarks.run import machine
from dtq.adapters.cockroach import sql
from dtq.adapters.redis import KeyLayout, scripts
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services

RESULTS = Path(__file__).resolve().parent / "results"
SLOWLOG_US = 1_000  # log every command of 1 ms or more while the run lasts
PASS_IDS = 5_000  # one reconcile pass: max_pages (10) x RECONCILE_BATCH (500)


# --- process probes ----------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (0 when it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Memory:
    """RSS (MiB) of each dtq process and Redis's memory at one moment of the run."""

    moment: str
    rss: dict[str, float]
    redis_used_mib: float
    ready_len: int


def memory(c: Cluster, moment: str, client: redis.Redis) -> Memory:
    rss = {name: round(rss_mib(proc.pid), 1) for name, proc in c.procs.procs.items()}
    rss["bench driver"] = round(rss_mib(os.getpid()), 1)
    used = int(client.info("memory")["used_memory"]) / 2**20
    ready_len = int(client.llen(KeyLayout(c.prefix).ready("default")))
    return Memory(moment, rss, round(used, 1), ready_len)


# --- SLOWLOG -----------------------------------------------------------------------------------


@contextlib.contextmanager
def slowlog(client: redis.Redis) -> Iterator[None]:
    """Log commands of ``SLOWLOG_US`` or more (and keep 1,024 of them) while the block runs;
    the server's own settings are put back afterwards."""
    old = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", SLOWLOG_US)
    client.config_set("slowlog-max-len", 1024)
    client.slowlog_reset()
    try:
        yield
    finally:
        for name, value in old.items():
            client.config_set(name, value)


#: EVALSHA digest -> the name of the dtq script it runs
_SCRIPTS = {
    hashlib.sha1(text.encode()).hexdigest(): name  # Redis names scripts by SHA-1
    for name, text in vars(scripts).items()
    if name.isupper() and isinstance(text, str)
}


def slowest(client: redis.Redis, tag: str) -> tuple[float, str]:
    """The longest logged command that names a key of this run (ms; its name, a script's by
    its digest, and how many of this run's entries took 10 ms or more), then reset."""
    worst, name, over = 0.0, "", 0
    for entry in client.slowlog_get(1024):
        command = entry["command"]
        text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        if tag not in text:
            continue
        ms = entry["duration"] / 1000
        over += ms >= 10
        if ms > worst:
            words = text.split(" ", 2)
            worst = ms
            name = _SCRIPTS.get(words[1], words[0]) if words[0].upper() == "EVALSHA" else words[0]
    client.slowlog_reset()
    return worst, f"{name} ({over} ≥ 10 ms)" if over else name


# --- the scenario ------------------------------------------------------------------------------


@dataclass
class Figures:
    """One cluster's figures (see the module docstring)."""

    tasks: int
    submit_us: list[float] = field(default_factory=list)  # per job, µs per task
    # per job, CPU µs per task: orchestrator, this database's backends, Redis (shared)
    submit_cpu_us: list[list[float]] = field(default_factory=list)
    submit_blocks: list[list[float]] = field(default_factory=list)  # per job: reads, hits / task
    drain_tasks: int = 0
    drain_us: float = 0.0
    drain_cpu_us: dict[str, float] = field(default_factory=dict)
    reconcile: list[dict[str, Any]] = field(default_factory=list)
    explain_ms: list[float] = field(default_factory=list)  # the due listing page, cold + warm
    explain_plan: str = ""
    explain: dict[str, Any] = field(default_factory=dict)  # GET /v1/tasks/{id}/explain, 90 %
    explain_target: str = ""  # the task at 90 % depth of the due listing
    slowlog: dict[str, tuple[float, str]] = field(default_factory=dict)
    memory: list[Memory] = field(default_factory=list)
    queued_after: int = 0
    ready_after: int = 0


def _blocks(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """This database's (blocks read, buffer hits) so far (``pg_stat_database``)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _submit(c: Cluster, f: Figures, jobs: int, job_size: int, client: redis.Redis) -> None:
    post_json(f"{c.url}/v1/jobs", flat_job(10))  # warm-up (not counted, not drained)
    pid = c.procs.procs["orchestrator"].pid
    with probe_connect(c.dsn) as probe:
        for job in range(jobs):
            body = flat_job(job_size)
            backends = backend_pids(c.dsn)
            cpu0 = cpu_seconds(pid), sum(map(cpu_seconds, backends)), redis_cpu(client)
            reads0, hits0 = _blocks(probe)
            started = time.perf_counter()
            post_json(f"{c.url}/v1/jobs", body)
            f.submit_us.append((time.perf_counter() - started) * 1e6 / job_size)
            cpu1 = cpu_seconds(pid), sum(map(cpu_seconds, backends)), redis_cpu(client)
            reads1, hits1 = _blocks(probe)
            f.submit_cpu_us.append(
                [round((b - a) * 1e6 / job_size, 1) for a, b in zip(cpu0, cpu1, strict=True)]
            )
            f.submit_blocks.append([(reads1 - reads0) / job_size, (hits1 - hits0) / job_size])
            if jobs > 1 and job + 1 == jobs // 2:
                f.memory.append(memory(c, f"submit: {(job + 1) * job_size:,} queued", client))
            if (job + 1) % 10 == 0 or job + 1 == jobs:
                say(f"  submitted {(job + 1) * job_size:,} ({f.submit_us[-1]:.0f} µs/task)")


async def _reconcile(c: Cluster, f: Figures, client: redis.Redis) -> None:
    """Two reconcile passes (the oldest ``PASS_IDS`` due tasks, then as many at 90 % depth),
    their markers deleted first, in this process on the cluster's database and prefix."""
    settings = Settings(
        crdb_dsn=c.dsn, redis_addr=redis_addr(), redis_key_prefix=c.prefix, api_auth="none"
    )
    layout = KeyLayout(c.prefix)
    with psycopg.connect(c.dsn, autocommit=True) as conn:
        queued = int(
            conn.execute("SELECT count(*) FROM tasks WHERE status = 'queued'").fetchone()[0]
        )
        place = (
            "SELECT scheduled_at, id FROM tasks WHERE status = 'queued'"
            " ORDER BY scheduled_at, id OFFSET %s LIMIT 1"
        )
        row = conn.execute(place, (max(0, int(queued * 0.9) - 1),)).fetchone()
        warm = conn.execute(place, (queued // 2,)).fetchone()
        cursors: list[tuple[str, Any]] = [("oldest 5,000", None), ("at 90 % depth", row)]
        conn.execute("SET enable_seqscan = off")  # the pool's session settings (pool.py)
        conn.execute("SET enable_bitmapscan = off")
        for _ in range(2):  # cold, then warm
            plan = (
                psycopg.ClientCursor(conn)
                .execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.DUE_QUEUED_AFTER,
                    (dt.datetime.now(dt.UTC), row[0], row[1], 500),
                )
                .fetchone()[0][0]
            )
            f.explain_ms.append(float(plan["Execution Time"]))
        f.explain_plan = _plan(plan["Plan"])
        for _, after in cursors:
            ids = conn.execute(
                "SELECT id FROM tasks WHERE status = 'queued'"
                + (" AND (scheduled_at, id) > (%s, %s)" if after else "")
                + " ORDER BY scheduled_at, id LIMIT %s",
                (*after, PASS_IDS) if after else (PASS_IDS,),
            ).fetchall()
            for start in range(0, len(ids), 1_000):
                client.delete(*(layout.marker(r[0]) for r in ids[start : start + 1_000]))
    f.explain_target = str(row[1])
    async with open_services(settings, backend="real") as services:
        reconcile = services.reconciler.reconcile
        reconcile._due_cursor = warm  # a first pass elsewhere: pools, scripts, epoch (bench only)
        await reconcile.reconcile_once()
        for label, after in cursors:
            reconcile._due_cursor = after  # where a later pass would stand
            slowest(client, layout.prefix)
            started = time.perf_counter()
            report = await reconcile.reconcile_once()
            took = time.perf_counter() - started
            worst, _ = slowest(client, layout.prefix)
            f.reconcile.append(
                {"pass": label, "seconds": took, "pushed": report.enqueued, "redis_ms": worst}
            )
            say(f"  reconcile {label}: {took:.2f}s, pushed {report.enqueued}, Redis {worst:.2f} ms")


def _plan(node: dict[str, Any]) -> str:
    """``Limit > Index Scan using idx (shared hit N, read M)`` of an EXPLAIN JSON plan."""
    parts = []
    last = node
    while node:
        label = node["Node Type"] + (f" using {node['Index Name']}" if "Index Name" in node else "")
        parts.append(label)
        last = node
        node = (node.get("Plans") or [{}])[0]
    hit, read = last.get("Shared Hit Blocks", 0), last.get("Shared Read Blocks", 0)
    return " > ".join(parts) + f" (shared hit {hit}, read {read})"


def _drain(c: Cluster, f: Figures, window: int, concurrency: int, client: redis.Redis) -> None:
    """Start the workers and time the first ``window`` handler runs (the ``count`` counter)."""
    c.reset_counter()
    c.start_workers(concurrency)
    pids = {name: c.procs.procs[name].pid for name in ("orchestrator", *c.workers)}
    started: float | None = None
    cpu0: dict[str, float] = {}
    half = False
    deadline = time.monotonic() + 600
    try:
        while True:
            done = c.counter()
            now = time.monotonic()
            if done > 0 and started is None:
                started = now
                cpu0 = _cpu(c, pids, client)
                f.memory.append(memory(c, "drain: start", client))
            if done >= window // 2 and not half:
                half = True
                f.memory.append(memory(c, f"drain: {done:,} done", client))
            if done >= window:
                cpu1 = _cpu(c, pids, client)
                break
            if now > deadline:
                raise BenchError(f"drain: only {done}/{window} done after 600 s")
            c.check_workers()
            time.sleep(0.02)
        f.memory.append(memory(c, f"drain: {done:,} done", client))
        if f.explain_target:
            _explain(c, f, client)
    finally:
        c.stop_workers()
    assert started is not None
    f.drain_tasks = done
    f.drain_us = (now - started) * 1e6 / done
    f.drain_cpu_us = {k: round((cpu1[k] - cpu0.get(k, 0.0)) * 1e6 / done, 1) for k in cpu1}
    f.drain_cpu_us["dtq + PostgreSQL"] = round(
        sum(v for k, v in f.drain_cpu_us.items() if k != "redis (shared)"), 1
    )


def _explain(c: Cluster, f: Figures, client: redis.Redis) -> None:
    """Time ``GET /v1/tasks/{id}/explain`` of the task at 90 % depth, workers live."""
    url = f"{c.url}/v1/tasks/{f.explain_target}/explain"
    httpx.get(url, timeout=30)  # warm-up
    slowest(client, KeyLayout(c.prefix).prefix)
    started = time.perf_counter()
    answer = httpx.get(url, timeout=30).json()
    details = answer.get("details", {})
    f.explain = {
        "ms": (time.perf_counter() - started) * 1e3,
        "reason": answer.get("reason"),
        "position": details.get("position"),
        "ready_depth": details.get("ready_depth"),
        "redis_ms": slowest(client, KeyLayout(c.prefix).prefix)[0],
    }


def _cpu(c: Cluster, pids: dict[str, int], client: redis.Redis) -> dict[str, float]:
    """CPU seconds so far: workers, orchestrator, this database's backends, Redis."""
    workers = sum(cpu_seconds(pid) for name, pid in pids.items() if name != "orchestrator")
    return {
        "workers": workers,
        "orchestrator": cpu_seconds(pids["orchestrator"]),
        "postgres": sum(cpu_seconds(pid) for pid in backend_pids(c.dsn)),
        "redis (shared)": redis_cpu(client),
    }


def run_one(
    tag: str, tasks: int, job_size: int, window: int, args: argparse.Namespace, logs: Path
) -> Figures:
    """One cluster: submit ``tasks`` in jobs of ``job_size``; reconcile passes when the backlog
    is larger than one job; drain the first ``window``."""
    f = Figures(tasks=tasks)
    client = redis_client()
    try:
        with cluster(tag, logs) as c, slowlog(client):
            tagged = KeyLayout(c.prefix).prefix
            f.memory.append(memory(c, "start", client))
            _submit(c, f, tasks // job_size, job_size, client)
            f.slowlog["submit"] = slowest(client, tagged)
            f.memory.append(memory(c, f"submit: {tasks:,} queued", client))
            if tasks > job_size:
                asyncio.run(_reconcile(c, f, client))
            _drain(c, f, window, args.concurrency, client)
            f.slowlog["drain"] = slowest(client, tagged)
            f.queued_after = c.count_status("queued")
            f.ready_after = int(client.llen(KeyLayout(c.prefix).ready("default")))
    finally:
        client.close()
    return f


# --- report ------------------------------------------------------------------------------------


def _ratio(big: float, small: float) -> str:
    return f"{big / small:.2f}x" if small else "n/a"


def table(base: Figures, big: Figures, info: dict[str, Any], load: str) -> str:
    first = median(big.submit_us[:10])
    last = median(big.submit_us[-10:])
    overall = sum(big.submit_us) / len(big.submit_us)
    base_submit = median(base.submit_us)

    def cpu(fig: Figures, part: int, jobs: slice) -> float:
        return median([job[part] for job in fig.submit_cpu_us[jobs]])

    def blocks(fig: Figures, part: int, jobs: slice) -> float:
        return median([job[part] for job in fig.submit_blocks[jobs]])

    every, last10 = slice(None), slice(-10, None)
    rows = [
        f"**Backlog** ({big.tasks:,} tasks in jobs of {base.tasks:,}) vs **baseline** "
        f"({base.tasks:,}); {info['nproc']} cores ({info['cpu']}); {info['redis']}; "
        f"{info['postgres']}; load before: {load}",
        "",
        "| figure | baseline | backlog | ratio (target ≤ 1.3x) |",
        "| --- | ---: | ---: | ---: |",
        f"| submit µs/task (median per job) | {base_submit:.1f} | first 10 jobs {first:.1f}, "
        f"last 10 {last:.1f}, all {overall:.1f} | {_ratio(last, base_submit)} (last 10) |",
    ]
    for part, name in enumerate(("orchestrator", "postgres", "redis (shared)")):
        b, g = cpu(base, part, every), cpu(big, part, last10)
        rows.append(
            f"| submit CPU µs/task: {name} (last 10 jobs) | {b:.0f} | "
            f"first 10 {cpu(big, part, slice(10)):.0f}, last 10 {g:.0f} | {_ratio(g, b)} |"
        )
    for part, name in enumerate(("blocks read", "buffer hits")):
        b, g = blocks(base, part, every), blocks(big, part, last10)
        rows.append(
            f"| submit PostgreSQL {name} per task (last 10 jobs) | {b:.1f} | "
            f"first 10 {blocks(big, part, slice(10)):.1f}, last 10 {g:.1f} | |"
        )
    rows += [
        f"| drain µs/task (wall, {base.drain_tasks:,} vs first {big.drain_tasks:,}) | "
        f"{base.drain_us:.0f} | {big.drain_us:.0f} | {_ratio(big.drain_us, base.drain_us)} |",
    ]
    for part in ("workers", "orchestrator", "postgres", "dtq + PostgreSQL", "redis (shared)"):
        b, g = base.drain_cpu_us.get(part, 0.0), big.drain_cpu_us.get(part, 0.0)
        rows.append(f"| drain CPU µs/task: {part} | {b:.0f} | {g:.0f} | {_ratio(g, b)} |")
    for name in ("submit", "drain"):
        b_ms, b_cmd = base.slowlog.get(name, (0.0, ""))
        g_ms, g_cmd = big.slowlog.get(name, (0.0, ""))
        rows.append(
            f"| Redis max blocking, {name} (SLOWLOG ≥ 1 ms, this run's keys) | "
            f"{b_ms:.1f} ms {b_cmd} | {g_ms:.1f} ms {g_cmd} | |"
        )
    for p in big.reconcile:
        rows.append(
            f"| reconcile pass, {p['pass']} ({PASS_IDS:,} due ids, markers expired) | | "
            f"{p['seconds'] * 1e3:.0f} ms, {p['pushed']} pushed, "
            f"Redis max {p['redis_ms']:.1f} ms | |"
        )
    cold, warm = big.explain_ms or [0.0, 0.0]
    rows.append(
        f"| due listing page of 500 at 90 % depth (EXPLAIN ANALYZE) | | cold {cold:.1f} ms, "
        f"warm {warm:.1f} ms: {big.explain_plan} | |"
    )
    if big.explain:
        e = big.explain
        rows.append(
            f"| GET /v1/tasks/{{id}}/explain at 90 % depth | | {e['ms']:.1f} ms: {e['reason']}, "
            f"position {e['position']} of {e['ready_depth']}, Redis max {e['redis_ms']:.1f} ms | |"
        )
    rows.append(
        "| ready list after the drain / queued tasks (the excess: entries of tasks no longer "
        "queued, refused at claim) | "
        f"{base.ready_after:,} / {base.queued_after:,} | "
        f"{big.ready_after:,} / {big.queued_after:,} | |"
    )
    rows += [
        "",
        "| moment | " + " | ".join(_names(base, big)) + " | Redis used MiB | ready list |",
        "| --- |" + " ---: |" * (len(_names(base, big)) + 2),
    ]
    for label, fig in (("baseline", base), ("backlog", big)):
        for m in fig.memory:
            cells = [f"{m.rss.get(n, 0):.0f}" if m.rss.get(n) else "" for n in _names(base, big)]
            rows.append(
                f"| {label} {m.moment} | "
                + " | ".join(cells)
                + f" | {m.redis_used_mib:.0f} | {m.ready_len:,} |"
            )
    return "\n".join(rows)


def _names(*figs: Figures) -> list[str]:
    names: dict[str, None] = {}
    for fig in figs:
        for m in fig.memory:
            names.update(dict.fromkeys(m.rss))
    return list(names)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000, help="backlog size (tasks)")
    parser.add_argument("--job-size", type=int, default=10_000, help="tasks per job (and baseline)")
    parser.add_argument("--window", type=int, default=50_000, help="tasks drained from the backlog")
    parser.add_argument("--concurrency", type=int, default=256, help="WORKER_CONCURRENCY")
    parser.add_argument("--out", type=Path, default=RESULTS / "backlog.json")
    args = parser.parse_args(argv)
    if args.job_size < 1 or args.tasks < args.job_size or args.tasks % args.job_size:
        parser.error("--tasks must be a positive multiple of --job-size")
    window = min(args.window, args.tasks)
    # The orchestrators listen on loopback only; ``Cluster.env`` passes this environment on.
    os.environ["API_AUTH"] = "none"
    check_services()
    info = machine()
    load = Path("/proc/loadavg").read_text().split()[:3]
    logs = Path(tempfile.mkdtemp(prefix="dtq-bench-backlog-"))
    say(f"backlog bench: {args.tasks:,} tasks, logs in {logs}")
    say("baseline:")
    base = run_one("baseline", args.job_size, args.job_size, args.job_size, args, logs)
    say("backlog:")
    big = run_one("backlog", args.tasks, args.job_size, window, args, logs)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    text = table(base, big, info, " ".join(load))
    print(text)
    print(f"\nload average after: {' '.join(load_after)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "args": {k: str(v) for k, v in vars(args).items()},
                "machine": info,
                "load": {"before": load, "after": load_after},
                "baseline": _plain(base),
                "backlog": _plain(big),
                "id": uuid.uuid4().hex,
            },
            indent=2,
            default=str,
        )
    )


def _plain(f: Figures) -> dict[str, Any]:
    out = {k: v for k, v in vars(f).items() if k != "memory"}
    out["memory"] = [vars(m) for m in f.memory]
    return out


if __name__ == "__main__":
    main()
