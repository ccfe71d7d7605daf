"""Where an idle submit -> handler start goes: ``python -m benchmarks.profile_latency``.

The latency scenario of ``make bench`` (one ``stamp`` task at a time, real orchestrator and two
workers), with each sample split by the database's own clock (issue 17 item 4):

* ``submit``: the client's send -> the submit transaction's ``now()`` (HTTP, Litestar, the
  group-commit lane, ``BEGIN``);
* ``to_claim``: submit transaction ``now()`` -> claim transaction ``now()`` (the submit's
  statements and COMMIT, the Redis push, the worker's pop, ``BEGIN`` of the claim);
* ``to_handler``: claim ``now()`` -> the handler's first line (the claim's statements and
  COMMIT, the lease script, the dispatch to a slot).

A claim from the snapshot its pop brought (ARCHITECTURE.md, "The carried claim") is dated by
the worker connection's estimate, taken before its one request is bound and sent, so its
``to_claim`` ends earlier and its ``to_handler`` holds the binding and the whole request.

``now()`` is the transaction's start, read once per transaction; the submit's is the job's
``created_at``, which a submission on a connection that has read the clock already dates by
an estimate that lags ``now()`` by about one request (``Transaction.write_time``), so the
``submit`` split can be negative and ``to_claim`` longer by as much. The database, the client
and the workers share this machine's clock. ``--variant`` as in ``benchmarks.profile_submit``
(the order reversed every other round: whichever variant runs first in a round reads slower).
``--pause-ms`` waits after each sample, so the previous task's completion no longer overlaps
the next submit and claim. ``--client httpx`` posts through httpx's sync client instead of the
scenario's ``KeepAliveClient``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import (
    ROOT,
    BenchError,
    KeepAliveClient,
    Processes,
    percentile,
    probe_connect,
    redis_client,
    say,
    temp_database,
    temp_prefix,
)
from benchmarks.dtq_bench import Cluster
from benchmarks.profile_submit import Variant, _store_retries, run_order, wait_healthy

SPLIT_SQL = (
    "SELECT extract(epoch FROM j.created_at), extract(epoch FROM r.started_at)"
    " FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN task_runs r ON r.task_id = t.id"
    " WHERE t.id = %s"
)


def one_run(args: argparse.Namespace, variant: Variant, logs: Path) -> dict[str, list[float]]:
    """One fresh cluster of ``variant``: ``--tasks`` samples after 20 warm-up tasks (ms)."""
    with (
        temp_database("plat", serializable=True) as dsn,
        temp_prefix("plat") as prefix,
        Processes(logs / variant.name) as procs,
    ):
        c = Cluster(dsn=dsn, prefix=prefix, procs=procs)
        c.migrate()
        env = c.env(**variant.env)
        extra = variant.env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(variant.src), str(ROOT), extra)))
        procs.start(
            "orchestrator", [sys.executable, "-m", "dtq.entrypoints.cli", "orchestrator"], env
        )
        wait_healthy(c)
        counts = [logs / f"counts-{variant.name}-{time.monotonic_ns()}-{w}.json" for w in (1, 2)]
        for w, path in enumerate(counts, 1):
            worker_env = {**env, "WORKER_CONCURRENCY": str(args.concurrency)}
            worker_env["PROFILE_COUNTS"] = str(path)
            argv = [sys.executable, "-m", "benchmarks.profile_worker"]
            procs.start(f"worker{w}", [*argv, "--app", "benchmarks.app:runtime"], worker_env)
            c.workers.append(f"worker{w}")
        c._wait_registered(len(counts))
        key = f"{c.app_prefix}started"
        split: dict[str, list[float]] = {
            "total": [],
            "submit": [],
            "to_claim": [],
            "to_handler": [],
        }
        client = redis_client()
        try:
            with httpx.Client(timeout=30) as http, probe_connect(dsn) as db:
                light = KeepAliveClient(c.url)
                request = light.prepare("/v1/tasks", {"kind": "stamp"})
                for i in range(args.tasks + 20):
                    sent = time.time()
                    if args.client == "httpx":
                        answer = http.post(f"{c.url}/v1/tasks", json={"kind": "stamp"})
                        status, body = answer.status_code, answer.content
                    else:
                        status, body = light.send(request)
                    if status != 201:
                        raise BenchError(f"submit: {status} {body!r}")
                    task_id = json.loads(body)["task_id"]
                    reply = client.brpop([key], timeout=10)
                    if reply is None:
                        c.check_workers()
                        raise BenchError("a stamp task did not start within 10 s")
                    got, started = reply[1].split()
                    if got != task_id:
                        raise BenchError(f"expected the start of {task_id}, got {got}")
                    if args.pause_ms:  # let the task's completion end before the next submit
                        time.sleep(args.pause_ms / 1000)
                    if i < 20:
                        continue
                    row = db.execute(SPLIT_SQL, (task_id,)).fetchone()
                    assert row is not None
                    submit_now, claim_now = float(row[0]), float(row[1])
                    split["total"].append(1000 * (float(started) - sent))
                    split["submit"].append(1000 * (submit_now - sent))
                    split["to_claim"].append(1000 * (claim_now - submit_now))
                    split["to_handler"].append(1000 * (float(started) - claim_now))
                light.close()
            retries = _store_retries(c.url)
        finally:
            client.close()
            c.stop_workers()
            c.close()
    totals: dict[str, int] = {}
    for path in counts:
        data = json.loads(path.read_text())
        for section in ("sql", "sql_errors", "store", "redis"):
            for name, value in data[section].items():
                totals[f"{section}: {name}"] = totals.get(f"{section}: {name}", 0) + value
    split["worker_counts_per_task"] = [  # type: ignore[list-item]
        f"{name} {value / (args.tasks + 20):.2f}" for name, value in sorted(totals.items())
    ] + [f"orchestrator re-runs {retries}"]
    return split


def _line(name: str, split: dict[str, list[float]]) -> str:
    parts = [
        f"{k} p50 {percentile(v, 50):.2f} p99 {percentile(v, 99):.2f}"
        for k, v in split.items()
        if k != "worker_counts_per_task"
    ]
    return f"{name:>8}: " + " | ".join(parts) + f"  (load {os.getloadavg()[0]:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_latency")
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--counts", action="store_true", help="the workers' round trips")
    parser.add_argument("--client", choices=("light", "httpx"), default="light")
    parser.add_argument(
        "--pause-ms", type=float, default=0.0, help="pause after each sample (no overlap)"
    )
    parser.add_argument("--variant", action="append", type=Variant.parse, default=None)
    args = parser.parse_args(argv)
    variants = args.variant or [Variant("here", (ROOT / "src").resolve())]
    logs = Path(tempfile.mkdtemp(prefix="dtq-plat-"))
    results: dict[str, dict[str, list[float]]] = {}
    for run in range(args.runs):
        for variant in run_order(variants, run):
            split = one_run(args, variant, logs)
            say(f"run {run + 1} " + _line(variant.name, split))
            if args.counts:
                say("  worker, per task: " + ", ".join(map(str, split["worker_counts_per_task"])))
            merged = results.setdefault(variant.name, {k: [] for k in split})
            for k, v in split.items():
                if k != "worker_counts_per_task":
                    merged[k].extend(v)
    for name, split in results.items():
        say("all     " + _line(name, split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
