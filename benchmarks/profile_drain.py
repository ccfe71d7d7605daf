"""Profile one dtq drain: ``python -m benchmarks.profile_drain [--tasks N] [--concurrency C]``.

Queues N no-op (``count``) tasks, then starts two workers as in the drain benchmark: one is
``benchmarks.profile_worker`` (dtq-worker with round-trip counters) sampled by ``py-spy`` (CPU
time, no idle), the other a plain ``dtq-worker``. Prints, per task the profiled worker ran: SQL
statements by name, store transactions and failed tries, Redis commands; then where the
profiled worker's CPU went (by library, inclusive, and the top functions by self time). The raw
numbers go to ``benchmarks/results/profile.json`` (the raw py-spy stacks to ``--stacks``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BIN, BenchError, say, wait_drained
from benchmarks.dtq_bench import cluster, flat_job, post_json

RESULTS = Path(__file__).resolve().parent / "results"

# library -> substrings of a py-spy frame that belong to it (first match wins for self time)
LIBRARIES: dict[str, tuple[str, ...]] = {
    "psycopg / psycopg_pool (SQL client)": ("psycopg",),
    "redis-py (Redis client)": ("/redis/", "hiredis"),
    "structlog + logging (log lines)": ("structlog", "/logging/"),
    "prometheus_client (metrics)": ("prometheus_client",),
    "json / msgspec": ("/json/", "msgspec"),
    "uuid": ("/uuid.py",),
    "dtq domain": ("dtq/domain/",),
    "dtq application (services)": ("dtq/application/",),
    "dtq adapters": ("dtq/adapters/",),
    "dtq entrypoints (runtime)": ("dtq/entrypoints/",),
    "asyncio event loop": ("/asyncio/",),
}


def _library(frame: str) -> str | None:
    for name, needles in LIBRARIES.items():
        if any(n in frame for n in needles):
            return name
    return None


def analyse_stacks(path: Path, top: int = 20) -> dict[str, Any]:
    """Inclusive share per library and the top self-time functions from py-spy raw output."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    self_lib: collections.Counter[str] = collections.Counter()
    self_fn: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        for lib in {lib for f in frames if (lib := _library(f))}:
            inclusive[lib] += count
        leaf = frames[-1]
        self_fn[leaf] += count
        self_lib[_library(leaf) or "other (interpreter, stdlib)"] += count

    def pct(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in c.most_common()] if total else []

    return {
        "samples": total,
        "inclusive_pct": pct(inclusive),
        "self_pct_by_library": pct(self_lib),
        "top_self_pct": pct(self_fn)[:top],
    }


def per_task(counts: dict[str, dict[str, int]], tasks: int) -> dict[str, dict[str, float]]:
    return {
        group: {k: round(v / tasks, 3) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}
        for group, values in counts.items()
    }


def _print(report: dict[str, Any]) -> None:
    print(
        f"drain {report['drain_tasks_per_s']:,.0f} tasks/s; the profiled worker ran "
        f"{report['profiled_worker_tasks']} of {report['tasks']} tasks (c={report['concurrency']})"
    )
    for group, values in report["per_task"].items():
        print(f"\nper task: {group}")
        for name, value in values.items():
            print(f"  {value:8.3f}  {name}")
    available = 2000 / report["drain_tasks_per_s"]
    print(
        f"\nCPU ms per task on the whole machine (2 cores = {available:.2f} ms of CPU per task "
        "available at this rate), from worker start to done "
        f"({report['machine_wall_s_from_worker_start']}s):"
    )
    for name, value in report["machine_cpu_ms_per_task"].items():
        print(f"  {value:8.3f}  {name}")
    cpu = report.get("cpu") or {}
    if cpu:
        print(f"\nCPU samples of the profiled worker: {cpu['samples']}")
        for title in ("inclusive_pct", "self_pct_by_library", "top_self_pct"):
            print(f"\n{title}:")
            for name, value in cpu[title]:
                print(f"  {value:5.1f}%  {name}")


def cpu_by_process() -> collections.Counter[str]:
    """CPU seconds (user + system) used so far by every process, grouped by program."""
    tick = os.sysconf("SC_CLK_TCK")
    used: collections.Counter[str] = collections.Counter()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        used[_program(cmdline, stat)] += (int(fields[11]) + int(fields[12])) / tick
    return used


def _program(cmdline: str, stat: str) -> str:
    if "profile_worker" in cmdline:
        return "dtq-worker (profiled)"
    for name in ("dtq-worker", "dtq orchestrator", "redis-server", "py-spy"):
        if name in cmdline:
            return name
    if cmdline.startswith("postgres") or "(postgres)" in stat:
        return "postgres"
    if "benchmarks.profile_drain" in cmdline:
        return "bench client (polling)"
    return "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_drain")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=RESULTS / "profile.json")
    parser.add_argument("--stacks", type=Path, default=None, help="keep py-spy's raw stacks here")
    args = parser.parse_args(argv)
    if shutil.which("py-spy", path=str(BIN)) is None:
        say("py-spy is not installed (pip install -e '.[bench]')")
        return 1
    logs = Path(tempfile.mkdtemp(prefix="dtq-profile-"))
    counts_path = logs / "counts.json"
    stacks = args.stacks or logs / "pyspy.txt"
    with cluster("profile", logs) as c:
        post_json(f"{c.url}/v1/jobs", flat_job(args.tasks))
        env = c.env(WORKER_CONCURRENCY=str(args.concurrency), PROFILE_COUNTS=str(counts_path))
        launched = time.monotonic()
        cpu_before = cpu_by_process()
        c.procs.start(
            "profiled",
            [
                sys.executable,
                "-m",
                "benchmarks.profile_worker",
                "--app",
                "benchmarks.app:runtime",
            ],
            env,
        )
        c.workers.append("profiled")
        c.procs.start(
            "plain",
            [str(BIN / "dtq-worker"), "--app", "benchmarks.app:runtime"],
            c.env(WORKER_CONCURRENCY=str(args.concurrency)),
        )
        c.workers.append("plain")
        spy = subprocess.Popen(
            [
                str(BIN / "py-spy"),
                "record",
                "--pid",
                str(c.procs.procs["profiled"].pid),
                "--format",
                "raw",
                "--rate",
                str(args.rate),
                "--nonblocking",
                "--output",
                str(stacks),
            ],
            stdout=subprocess.DEVNULL,
            stderr=(logs / "py-spy.log").open("wb"),
        )
        try:
            drain = wait_drained(
                c.counter, args.tasks, launched=launched, timeout=600, check=c.check_workers
            )
            wait_drained(
                lambda: c.count_status("completed"),
                args.tasks,
                launched=launched,
                timeout=120,
            )
            cpu_after = cpu_by_process()
            wall = time.monotonic() - launched
        finally:
            c.stop_workers()
            try:
                spy.wait(timeout=20)
            except subprocess.TimeoutExpired:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=20)
    if not counts_path.exists():
        raise BenchError(f"no counts written; logs in {logs}")
    counts = json.loads(counts_path.read_text())
    ran = counts["redis"].get("INCRBY", 0)  # the count handler: one INCR(BY) per task run
    report = {
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "drain_tasks_per_s": round(drain.rate, 1),
        "profiled_worker_tasks": ran,
        "per_task": per_task(counts, max(ran, 1)),
        "totals": counts,
        "cpu": analyse_stacks(stacks) if stacks.exists() else {},
        "machine_cpu_ms_per_task": {
            k: round(1000 * (cpu_after[k] - cpu_before[k]) / args.tasks, 3)
            for k in sorted(cpu_after, key=lambda k: cpu_before[k] - cpu_after[k])
            if cpu_after[k] - cpu_before[k] > 0.05
        },
        "machine_wall_s_from_worker_start": round(wall, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
