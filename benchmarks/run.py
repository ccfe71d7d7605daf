"""The one benchmark command: ``python -m benchmarks.run [--quick] [--only ...] [--no-peers]``.

Runs the dtq scenarios and the peer drivers on the local PostgreSQL and Redis, prints one table
(markdown, on stdout) and one closing summary line, and writes everything as JSON to
``benchmarks/results/latest.json`` (``quick.json`` for ``--quick``). Progress goes to stderr.

The whole run is held to a time budget (``--budget``, default 540 s): each section gets a share
of what is left, always does one run, and repeats (up to ``--runs``) only while the next repeat
is projected to fit. Runs cut by the budget are listed in the notes. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import dtq_bench
from benchmarks.common import BenchError, check_services, say
from benchmarks.dtq_bench import More, Result, Sizes
from benchmarks.peers import PEERS, PeerResult, run_peer

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("drain", "submit", "latency", "scale", "retry", "peers")
# share of the time budget per section (of what is left when the section starts)
# (the drain's share includes the Redis-only peers, run between its runs when both are chosen)
WEIGHTS = {"drain": 45, "submit": 8, "latency": 6, "scale": 22, "retry": 5, "peers": 14}


class Budget:
    """Splits a wall-clock budget between sections by weight; ``section()`` hands out the
    ``more()`` callback a section asks before each repeat."""

    def __init__(self, seconds: float, sections: list[str]) -> None:
        self.started = time.monotonic()
        self.seconds = seconds
        self.pending = {s: WEIGHTS[s] for s in sections}

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def section(self, name: str, parts: int = 1) -> Callable[[], More]:
        """Return a factory of ``more()`` callbacks, one per part of the section (a peer)."""
        total = sum(self.pending.values()) or 1
        allowance = max(0.0, self.remaining()) * self.pending.pop(name, 0) / total
        per_part = allowance / max(parts, 1)

        def new_part() -> More:
            t0 = time.monotonic()
            asked = 0

            def more(next_cost: float | None = None) -> bool:
                nonlocal asked
                asked += 1
                spent = time.monotonic() - t0
                if next_cost is not None:
                    return spent + next_cost <= per_part
                return spent * (asked + 1) / asked <= per_part

            return more

        return new_part


# --- formatting --------------------------------------------------------------------------------


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if not ours or not theirs or math.isnan(ours) or math.isnan(theirs):
        return None
    return ours / theirs


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def _checkpoints(drain: Result) -> str:
    """PostgreSQL checkpoints during each measured drain, for the CPU row ("" if unread)."""
    runs = drain.runs.get("transactions_checkpoints")
    if not runs:
        return ""
    return "; PostgreSQL checkpoints during each drain: " + " / ".join(f"{n:.0f}" for n in runs)


def build_table(
    results: dict[str, Result], peers: list[PeerResult], sizes: Sizes
) -> tuple[str, str]:
    """The markdown table and the one-line summary."""
    rows: list[tuple[str, str, str, str, str]] = []
    ok_peers = [p for p in peers if p.status == "ok" and p.rates]
    redis_best = max(
        (p for p in ok_peers if not p.peer.durable), key=lambda p: p.rate, default=None
    )
    durable_best = max((p for p in ok_peers if p.peer.durable), key=lambda p: p.rate, default=None)
    summary: list[str] = []

    drain = results.get("drain")
    if drain is not None:
        rate = drain.figures.get("tasks_per_s")
        r_redis = _ratio(rate, redis_best.rate if redis_best else None)
        r_dur = _ratio(rate, durable_best.rate if durable_best else None)
        vs = ", ".join(
            f"{_ratio(rate, p.rate):.2f}x {p.peer.name} {p.rate:,.0f}/s"
            for p in sorted(ok_peers, key=lambda p: -p.rate)
        )
        goal = "n/a"
        if r_redis is not None:
            goal = (
                "met"
                if r_redis >= 1.5
                else ("milestone 1.0x met, 1.5x MISSED" if r_redis >= 1.0 else "MISSED")
            )
            goal += f" ({r_redis:.2f}x)"
        rows.append(
            (
                "drain",
                f"tasks/s, {sizes.drain_tasks:,} queued no-op, 2 workers, defaults at "
                f"c={int(drain.figures['concurrency'])}",
                _num(rate, "/s"),
                ">= 1.5x fastest Redis-only peer (first milestone 1.0x): " + goal,
                vs or "no peers run",
            )
        )
        split = {
            part: drain.figures.get(f"cpu_us_per_task_{part}")
            for part in ("workers", "postgres", "redis", "orchestrator")
        }
        if all(us is not None for us in split.values()):
            total = sum(us for us in split.values() if us is not None)
            rows.append(
                (
                    "drain",
                    "CPU µs per task (median of the runs): workers / PostgreSQL / Redis / "
                    "orchestrator",
                    " / ".join(f"{us:.0f}" for us in split.values() if us is not None),
                    "-",
                    f"total {total:.0f} µs per task on {os.cpu_count()} cores"
                    + _checkpoints(drain),
                )
            )
        tuned = drain.figures.get("defaults_vs_tuned")
        rows.append(
            (
                "drain",
                f"defaults / best tuned ({sizes.drain_tasks:,}-task drains: concurrency, "
                f"claim_batch; medians of {len(drain.runs.get('tasks_per_s', []))} rounds)",
                _num(tuned, "x", 2),
                "defaults within 20 % of the best: "
                + _verdict(None if tuned is None else tuned >= 0.8),
                "-",
            )
        )
        if r_dur is not None:
            rows.append(
                (
                    "drain",
                    "vs the fastest durable peer",
                    f"{r_dur:.2f}x",
                    ">= 5x: " + _verdict(r_dur >= 5.0),
                    "-",
                )
            )
        parts = [p for p in (redis_best, durable_best) if p is not None]
        inside = ", ".join(
            f"{_ratio(rate, p.rate):.2f}x {p.peer.name} {p.rate:,.0f}/s" for p in parts
        )
        summary.append(f"drain {_num(rate, '/s')}" + (f" ({inside})" if inside else ""))

    submit = results.get("submit")
    if submit is not None:
        job, single = (
            submit.figures.get("job_tasks_per_s"),
            submit.figures.get("single_tasks_per_s"),
        )
        rows.append(
            (
                "submit",
                f"tasks/s, one {sizes.submit_job_tasks:,}-task job",
                _num(job, "/s"),
                "-",
                "-",
            )
        )
        rows.append(
            (
                "submit",
                f"tasks/s, {sizes.submit_single_tasks:,} single POST /v1/tasks, "
                f"{sizes.submit_in_flight} in flight",
                _num(single, "/s"),
                ">= 2,000/s: " + _verdict(None if single is None else single >= 2000),
                "-",
            )
        )
        summary.append(f"submit job {_num(job, '/s')}, single {_num(single, '/s')}")

    latency = results.get("latency")
    if latency is not None:
        p50, p95, p99 = (latency.figures.get(k) for k in ("p50_ms", "p95_ms", "p99_ms"))
        ok = None if p50 is None or p99 is None else p50 <= 3 and p99 <= 20
        rows.append(
            (
                "latency",
                f"submit -> handler start p50 / p95 / p99, idle, {sizes.latency_tasks:,} "
                "one at a time",
                f"{_num(p50, 'ms', 1)} / {_num(p95, 'ms', 1)} / {_num(p99, 'ms', 1)}",
                "p50 <= 3ms, p99 <= 20ms: " + _verdict(ok),
                "-",
            )
        )
        summary.append(f"latency p50 {_num(p50, 'ms', 1)} p99 {_num(p99, 'ms', 1)}")

    scale = results.get("scale")
    if scale is not None:
        costs = {
            k.removeprefix("us_per_task_"): v
            for k, v in scale.figures.items()
            if k.startswith("us_per_task_")
        }
        ratio = scale.figures.get("ratio_largest_job")
        spread = _num(scale.figures.get("ratio_max_min"), "x", 2)
        small, big = sizes.scale_reference, sizes.scale_sizes[-1]
        dag = _num(_ratio(costs.get("dag"), costs.get(str(small))), "x", 2)
        rows.append(
            (
                "scale",
                "us of drain per task, by job size: "
                + ", ".join(f"{k} {v:,.0f}" for k, v in costs.items()),
                f"{_num(ratio, 'x', 2)} ({big:,} vs {small:,}); DAG vs {small} {dag}; "
                f"max/min {spread}",
                f"{big:,}-task job <= 1.2x a {small}-task job: "
                + _verdict(None if ratio is None else ratio <= 1.2),
                "-",
            )
        )
        summary.append(f"scale {_num(ratio, 'x', 2)} (DAG {dag})")

    retry = results.get("retry")
    if retry is not None:
        p50, p99 = retry.figures.get("p50_ms"), retry.figures.get("p99_ms")
        rows.append(
            (
                "retry",
                "lateness after a 1s backoff p50 / p99",
                f"{_num(p50, 'ms', 1)} / {_num(p99, 'ms', 1)}",
                "p99 <= 100ms: " + _verdict(None if p99 is None else p99 <= 100),
                "-",
            )
        )
        summary.append(f"retry p99 {_num(p99, 'ms', 0)}")

    for p in peers:
        shown = _num(p.rate, "/s") if p.rates else p.status
        note = (
            p.detail
            if p.status != "ok"
            else (p.detail or f"runs: {', '.join(f'{r:,.0f}' for r in p.rates)}")
        )
        rows.append(
            (
                "peer",
                f"{p.peer.label}: tasks/s, same {sizes.drain_tasks:,} no-op, 2 worker processes",
                shown,
                "durable" if p.peer.durable else "Redis only",
                note,
            )
        )

    header = ("scenario", "figure", "dtq / value", "target", "peers / notes")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines), "dtq bench: " + " | ".join(summary)


# --- machine -----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    def run(*argv: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(
                argv, check=False, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        return ""

    cpu = ""
    with contextlib.suppress(OSError):
        cpu = cpu_model(Path("/proc/cpuinfo").read_text())
    versions: dict[str, str] = {}
    for dist in ("dtq", "celery", "rq", "dramatiq", "huey", "procrastinate", "psycopg", "redis"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": _memory(run("free", "-h")),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgres": run("psql", "--version"),
        "redis": run("redis-server", "--version"),
        "packages": versions,
        "git": run("git", "-C", str(RESULTS.parents[1]), "rev-parse", "--short", "HEAD"),
        "src_uncommitted": run("git", "-C", str(RESULTS.parents[1]), "status", "--short", "src"),
    }


def cpu_model(cpuinfo: str) -> str:
    """The first processor's name in ``/proc/cpuinfo`` text with its family, model and stepping
    (``AMD EPYC, family 26 model 2 stepping 1``): a virtual machine often shows only a brand
    name, and machines of one brand differ by generations (README, "Benchmarks"). Empty when
    the text names no processor."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block only
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", "")
    ids = [
        f"{label} {fields[key]}"
        for key, label in (("cpu family", "family"), ("model", "model"), ("stepping", "stepping"))
        if fields.get(key)
    ]
    if not ids:
        return name
    return f"{name}, {' '.join(ids)}" if name else " ".join(ids)


def speed_probe(rounds: int = 5) -> float:
    """Milliseconds of one fixed pure-Python workload (JSON encoding and integer arithmetic,
    then a SHA-256 of 1 MB), the fastest of ``rounds``: the machine's speed at that moment.

    A VM's speed moves between phases with nothing in the guest changing (benchmarks/
    PROFILE.md, twelfth pass: its workers' CPU per task rose 60 % within an hour); the probe,
    taken when a run starts and when it ends, says whether a figure moved with the machine.
    """
    doc = {"id": "x" * 32, "n": list(range(50)), "s": {"a": 1.5, "b": None}}
    best = float("inf")
    for _ in range(rounds):
        begun = time.perf_counter()
        total = 0
        for i in range(20_000):
            total += len(json.dumps(doc)) + i * i % 7
        hashlib.sha256(b"x" * 1_000_000).digest()
        best = min(best, time.perf_counter() - begun)
    return best * 1000


def speed_note(probe: dict[str, float] | None) -> str:
    """The machine line's text for the speed probe readings ``{"start": ms, "end": ms}``:
    ``; speed probe 95 ms at the start, 121 ms at the end`` (lower is faster); empty without
    both readings."""
    if not probe or "start" not in probe or "end" not in probe:
        return ""
    return f"; speed probe {probe['start']:.0f} ms at the start, {probe['end']:.0f} ms at the end"


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far from ``/proc/stat`` (user, nice, system, idle, iowait,
    irq, softirq, steal, in clock ticks); empty where there is no ``/proc/stat``."""
    with contextlib.suppress(OSError, ValueError):
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return [int(v) for v in fields[1:9]]
    return []


def stolen_share(before: list[int], after: list[int]) -> float | None:
    """The share of the busy CPU time between two :func:`cpu_ticks` readings that the
    hypervisor gave to other guests (``steal``): what a virtual machine's neighbours took,
    which moves every figure of the run. None without both readings."""
    if len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after, strict=True)]
    busy = sum(delta) - delta[3] - delta[4]  # all but idle and iowait
    return delta[7] / busy if busy > 0 else None


def _memory(free: str) -> str:
    """``23Gi total, 21Gi available`` from ``free -h``."""
    lines = free.splitlines()
    if len(lines) < 2:
        return ""
    head, mem = lines[0].split(), lines[1].split()[1:]
    cols = dict(zip(head, mem, strict=False))
    return f"{cols.get('total', '?')} total, {cols.get('available', '?')} available"


# --- main --------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 run, smaller sizes (smoke test)")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument("--peers", dest="peers", action="store_true", default=True)
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip the peers")
    parser.add_argument(
        "--peer-list",
        default=",".join(p.name for p in PEERS),
        help="comma-separated peers to run (default: all)",
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per figure (default 3; quick 1)"
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds for everything (default 540; quick 240)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output (default results/latest.json)"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep process logs (path printed)")
    return parser.parse_args(argv)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class Outcome:
    """Everything one invocation measured."""

    results: dict[str, Result] = field(default_factory=dict)
    peers: list[PeerResult] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    #: run the Redis-only peers between the dtq drain's runs (both sections chosen)
    interleave: bool = False


def _run_section(
    section: str,
    *,
    sizes: Sizes,
    runs: int,
    logs: Path,
    budget: Budget,
    peer_names: set[str],
    outcome: Outcome,
) -> None:
    results = outcome.results
    concurrency = int(results["drain"].figures["concurrency"]) if "drain" in results else 16
    if section == "peers":
        done = {p.peer.name for p in outcome.peers}
        left = [p for p in PEERS if p.name in peer_names and p.name not in done]
        part = budget.section(section, parts=max(len(left), 1))
        for peer in left:
            outcome.peers.append(
                run_peer(peer, sizes.drain_tasks, runs, logs / "peers", keep_going=part())
            )
        return
    more = budget.section(section)()
    if section == "drain":
        between = None
        if outcome.interleave:
            between = _interleaved_peers(sizes, logs, peer_names, outcome)
        results["drain"] = dtq_bench.bench_drain(sizes, runs, logs, more, between)
    elif section == "submit":
        results["submit"] = dtq_bench.bench_submit(sizes, runs, logs, more)
    elif section == "latency":
        results["latency"] = dtq_bench.bench_latency(sizes, runs, logs, more, concurrency)
    elif section == "scale":
        reuse = {}
        if "drain" in results and "tasks_per_s" in results["drain"].runs:
            reuse[sizes.scale_sizes[-1]] = results["drain"].runs["tasks_per_s"]
        results["scale"] = dtq_bench.bench_scale(sizes, runs, logs, more, concurrency, reuse)
    elif section == "retry":
        results["retry"] = dtq_bench.bench_retry(sizes, runs, logs, more, concurrency)


def _interleaved_peers(
    sizes: Sizes, logs: Path, peer_names: set[str], outcome: Outcome
) -> Callable[[int], float]:
    """The drain's ``between`` callback: runs of the chosen Redis-only peers after each dtq
    drain run, so that the machine's drift hits dtq and its fastest rivals alike (issue 17:
    ratios in one run, interleaved). Every peer runs after the first drain; after the later
    ones only those within ``REPEAT_SHARE`` of the fastest peer's first rate (a slower one
    cannot be the fastest, and RQ's one run takes ~20 times the drain's on a slow machine).
    Returns the seconds the next call is expected to take. Their results join
    ``outcome.peers``; the peers section then runs only the others (the durable peers, slower
    by an order of magnitude)."""
    chosen = [p for p in PEERS if p.name in peer_names and not p.durable]
    by_name: dict[str, PeerResult] = {}
    seconds: dict[str, float] = {}

    def between(run: int) -> float:
        peers = chosen if run == 0 else [p for p in chosen if p.name in seconds]
        for peer in peers:
            started = time.monotonic()
            one = run_peer(peer, sizes.drain_tasks, 1, logs / "peers")
            took = time.monotonic() - started
            known = by_name.get(peer.name)
            if known is None:
                by_name[peer.name] = one
                outcome.peers.append(one)
                if one.status == "ok":
                    seconds[peer.name] = took
            elif one.status == "ok":
                known.rates.extend(one.rates)
                seconds[peer.name] = took
            elif not known.detail:
                known.detail = f"run {run + 1}: {one.status} {one.detail}"
        if run == 0:
            fastest = max((r.rate for r in by_name.values() if r.rates), default=0.0)
            for name, result in by_name.items():
                if result.rates and result.rate < REPEAT_SHARE * fastest:
                    del seconds[name]
                    result.detail = (
                        f"runs: {result.rate:,.0f} (not repeated: under {REPEAT_SHARE:.0%} of"
                        f" the fastest Redis-only peer's {fastest:,.0f}/s)"
                    )
        return sum(seconds.values())

    return between


#: A Redis-only peer runs again after dtq's later drain runs only when its first rate is at
#: least this share of the fastest peer's.
REPEAT_SHARE = 0.5


def _report(outcome: Outcome, sizes: Sizes, meta: dict[str, Any], out: Path) -> None:
    table, summary = build_table(outcome.results, outcome.peers, sizes)
    info = machine()
    print(f"\n{table}\n")
    for name, result in outcome.results.items():
        for note in result.notes:
            print(f"- {name}: {note}")
    for section, error in outcome.errors.items():
        print(f"- {section}: FAILED {error}")
    stolen = meta.get("stolen")
    print(
        f"\n{meta['date']}; {info['nproc']} cores ({info['cpu']}); memory {info['memory']}; "
        f"{meta['elapsed_s']:.0f}s"
        + ("" if stolen is None else f"; CPU stolen by the hypervisor {100 * stolen:.1f} %")
        + speed_note(meta.get("speed_probe_ms"))
    )
    print(summary)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        **meta,
        "machine": info,
        "scenarios": {
            name: {"figures": r.figures, "runs": r.runs, "notes": r.notes}
            for name, r in outcome.results.items()
        },
        "peers": [p.as_json() for p in outcome.peers],
        "errors": outcome.errors,
        "table": table,
        "summary": summary,
    }
    out.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    say(f"results written to {out}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # so every cleanup block still runs
    sizes = Sizes.quick() if args.quick else Sizes()
    runs = args.runs or (1 if args.quick else 3)
    budget_s = args.budget or (240.0 if args.quick else 540.0)
    out = args.out or RESULTS / ("quick.json" if args.quick else "latest.json")
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    if set(chosen) - set(SECTIONS):
        say(f"unknown section in --only {args.only!r}; choose from {', '.join(SECTIONS)}")
        return 2
    if not args.peers and "peers" in chosen:
        chosen.remove("peers")
    peer_names = {p.strip() for p in args.peer_list.split(",") if p.strip()}
    try:
        check_services()
    except BenchError as exc:
        say(f"benchmarks: {exc}")
        return 1

    logs = Path(tempfile.mkdtemp(prefix="dtq-bench-logs-"))
    budget = Budget(budget_s, [s for s in SECTIONS if s in chosen])
    outcome = Outcome(interleave="drain" in chosen and "peers" in chosen)
    probe_start = speed_probe()
    started, ticks = time.monotonic(), cpu_ticks()
    say(f"dtq bench: {', '.join(chosen)}; {runs} run(s); budget {budget_s:.0f}s; logs {logs}")
    try:
        for section in (s for s in SECTIONS if s in chosen):
            say(f"[{section}] ({budget.remaining():.0f}s of budget left)")
            try:
                _run_section(
                    section,
                    sizes=sizes,
                    runs=runs,
                    logs=logs,
                    budget=budget,
                    peer_names=peer_names,
                    outcome=outcome,
                )
            except (BenchError, OSError, RuntimeError, ValueError) as exc:
                outcome.errors[section] = f"{type(exc).__name__}: {exc}"
                say(f"  {section} FAILED: {exc}\n{traceback.format_exc(limit=4)}")
    except KeyboardInterrupt:
        say("interrupted: cleaned up; partial results follow")
        outcome.errors["interrupted"] = "yes"

    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": round(time.monotonic() - started, 1),
        "stolen": stolen_share(ticks, cpu_ticks()),
        "speed_probe_ms": {"start": round(probe_start, 1), "end": round(speed_probe(), 1)},
        "args": {"quick": args.quick, "runs": runs, "budget_s": budget_s, "sections": chosen},
    }
    _report(outcome, sizes, meta, out)
    if args.keep_logs or outcome.errors:
        say(f"logs kept in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 1 if outcome.errors else 0


if __name__ == "__main__":
    sys.exit(main())
