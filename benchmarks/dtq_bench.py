"""The dtq scenarios: drain, submit, latency, scale and retry precision (issue 7).

Each scenario runs against its own throwaway PostgreSQL database and Redis prefix, with real
``dtq migrate``, ``dtq orchestrator`` and ``dtq-worker --app benchmarks.app:runtime`` processes
configured through the environment exactly as a deployment would be (documented defaults, except
the addresses, the key prefix, ``RETRY_BACKOFF=1s``, ``API_AUTH=none`` and the worker concurrency
under test). The processes import dtq from this checkout's ``src``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import psycopg

from benchmarks.common import (
    BIN,
    ROOT,
    BenchError,
    CpuSplit,
    Drain,
    KeepAliveClient,
    Processes,
    free_port,
    median,
    percentile,
    post_same,
    probe_connect,
    redis_addr,
    redis_client,
    say,
    temp_database,
    temp_prefix,
    wait_drained,
)

WORKERS = 2  # worker processes in every scenario (the setup)
RETRY_BACKOFF = 1.0  # seconds, the retry scenario's backoff


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario does; ``quick()`` is the smoke-test variant."""

    drain_tasks: int = 10_000
    concurrencies: tuple[int, ...] = (64, 256, 512)
    submit_job_tasks: int = 10_000
    submit_single_tasks: int = 10_000
    submit_in_flight: int = 32
    latency_tasks: int = 1_000
    scale_total: int = 2_000  # tasks per small-job configuration (jobs of 1, 10, 1,000)
    # one-task jobs are what single POST /v1/tasks make; the target compares to scale_reference
    scale_sizes: tuple[int, ...] = (1, 10, 1_000, 10_000)
    scale_reference: int = 10
    dag_tasks: int = 10_000
    dag_layers: int = 10
    drain_timeout: float = 120.0  # seconds one drain may take before it counts as incomplete
    retry_tasks: int = 200
    retry_pace: float = 0.02  # seconds between two retry-scenario submits

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            drain_tasks=2_000,
            concurrencies=(32, 256),
            submit_job_tasks=2_000,
            submit_single_tasks=1_000,
            latency_tasks=200,
            scale_total=1_000,
            scale_sizes=(1, 10, 1_000, 2_000),
            dag_tasks=2_000,
            dag_layers=4,
            drain_timeout=60.0,
            retry_tasks=50,
        )


# --- one cluster: database + prefix + orchestrator + workers -----------------------------------


@dataclass
class Cluster:
    """A migrated database, a Redis prefix, an orchestrator, and workers started on demand."""

    dsn: str
    prefix: str
    procs: Processes
    port: int = field(default_factory=free_port)
    workers: list[str] = field(default_factory=list)
    _worker_seq: int = 0
    # One client and one connection for all the polls of a run (a drain polls every 10 ms; a
    # new connection per poll cost the machine more CPU than the peers' polling does).
    _redis: Any = None
    _conn: Any = None

    def close(self) -> None:
        """Close the polling client and connection."""
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def app_prefix(self) -> str:
        """Where the bench handlers write (under the dtq prefix, so it is cleaned with it)."""
        return f"{self.prefix}app:"

    def env(self, **extra: str) -> dict[str, str]:
        import os

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CRDB_", "REDIS_", "WORKER_", "DTQ_", "LOG_"))
        }
        env.update(
            CRDB_DSN=self.dsn,
            REDIS_ADDR=redis_addr(),
            REDIS_KEY_PREFIX=self.prefix,
            ORCHESTRATOR_LISTEN=f"127.0.0.1:{self.port}",
            RETRY_BACKOFF=f"{RETRY_BACKOFF:g}s",
            API_AUTH="none",  # the API is on loopback; tokens are the default since issue 15
            LOG_FORMAT="json",
            BENCH_APP_PREFIX=self.app_prefix,
            # this checkout's dtq, not the one the venv has installed (editable from elsewhere);
            # the caller's own PYTHONPATH after it
            PYTHONPATH=os.pathsep.join(
                p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        )
        env.update(extra)
        return env

    def migrate(self) -> None:
        import subprocess

        done = subprocess.run(
            [str(BIN / "dtq"), "migrate"],
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise BenchError(f"dtq migrate failed: {done.stderr.decode()[-2000:]}")

    def start_orchestrator(self) -> None:
        self.procs.start("orchestrator", [str(BIN / "dtq"), "orchestrator"], self.env())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.procs.check_alive("orchestrator")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise BenchError(f"orchestrator not healthy:\n{self.procs.tail('orchestrator')}")

    def start_workers(
        self,
        concurrency: int,
        *,
        wait_ready: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``WORKERS`` dtq-worker processes with ``WORKER_CONCURRENCY=concurrency`` and
        the ``extra`` environment."""
        extra = extra or {}
        names = []
        for _ in range(WORKERS):
            self._worker_seq += 1
            name = f"worker{self._worker_seq}"
            argv = [str(BIN / "dtq-worker"), "--app", "benchmarks.app:runtime"]
            self.procs.start(name, argv, self.env(WORKER_CONCURRENCY=str(concurrency), **extra))
            names.append(name)
        self.workers.extend(names)
        if wait_ready:
            self._wait_registered(len(names))

    def _wait_registered(self, count: int, timeout: float = 30) -> None:
        """Wait until ``count`` workers have upserted their registry row (they are polling)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.procs.check_alive(*self.workers)
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM workers").fetchone()
            if row is not None and row[0] >= count:
                time.sleep(0.3)  # the registry row comes just before the first pop
                return
            time.sleep(0.1)
        raise BenchError("workers did not register in time")

    def stop_workers(self) -> None:
        self.procs.stop(*self.workers)
        self.workers.clear()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM workers")

    def check_workers(self) -> None:
        self.procs.check_alive("orchestrator", *self.workers)

    def cpu_split(self, client: Any) -> CpuSplit:
        """CPU seconds of the workers, the orchestrator, this database's backends and Redis."""
        procs = self.procs.procs
        orchestrator = procs["orchestrator"].pid if "orchestrator" in procs else None
        return CpuSplit.take(
            [procs[name].pid for name in self.workers], orchestrator, self.dsn, client
        )

    # -- database probes ---------------------------------------------------------------------

    def transactions(self) -> dict[str, int]:
        """This database's committed and rolled-back transactions so far (pg_stat_database;
        a SERIALIZABLE conflict re-run is one rollback), and the server's checkpoints so far
        (timed and requested: a checkpoint during a drain makes the first write of every page
        after it a full-page image, so PostgreSQL's CPU per task moves with them)."""
        if self._conn is None:
            self._conn = probe_connect(self.dsn)
        self._conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self._conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
        counts = {"commits": int(row[0]), "rollbacks": int(row[1])} if row else {}
        checkpoints = self._checkpoints()
        if checkpoints is not None:
            counts["checkpoints"] = checkpoints
        return counts

    def _checkpoints(self) -> int | None:
        """The server's checkpoints so far: pg_stat_bgwriter up to PostgreSQL 16,
        pg_stat_checkpointer from 17; None where neither answers."""
        assert self._conn is not None
        for query in (
            "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter",
            "SELECT num_timed + num_requested FROM pg_stat_checkpointer",
        ):
            try:
                row = self._conn.execute(query).fetchone()
            except psycopg.Error:
                continue
            if row is not None:
                return int(row[0])
        return None

    def count_status(self, status: str) -> int:
        if self._conn is None:
            self._conn = probe_connect(self.dsn)
        row = self._conn.execute(
            "SELECT count(*) FROM tasks WHERE status = %s", (status,)
        ).fetchone()
        return int(row[0]) if row else 0

    def counter(self) -> int:
        """The ``count`` handler's Redis counter."""
        if self._redis is None:
            self._redis = redis_client()
        return int(self._redis.get(f"{self.app_prefix}done") or 0)

    def reset_counter(self) -> None:
        client = redis_client()
        try:
            client.delete(f"{self.app_prefix}done")
        finally:
            client.close()


@contextlib.contextmanager
def cluster(tag: str, logs: Path) -> Iterator[Cluster]:
    """A running orchestrator on a fresh database and prefix; everything removed afterwards."""
    with (
        temp_database(f"dtq_{tag}", serializable=True) as dsn,
        temp_prefix(f"dtq-{tag}") as prefix,
        Processes(logs / tag) as procs,
    ):
        c = Cluster(dsn=dsn, prefix=prefix, procs=procs)
        try:
            c.migrate()
            c.start_orchestrator()
            yield c
        finally:
            c.close()  # before the database is dropped


# --- submitting --------------------------------------------------------------------------------


def flat_job(n: int, kind: str = "count") -> dict[str, Any]:
    return {"name": f"bench-{n}", "tasks": [{"name": f"t{i}", "kind": kind} for i in range(n)]}


def dag_job(total: int, layers: int, kind: str = "count") -> dict[str, Any]:
    """``layers`` times: one hub task, then ``total/layers - 1`` tasks fanning out of it; each
    hub after the first fans in (depends on every task of the previous layer)."""
    width = total // layers - 1
    tasks: list[dict[str, Any]] = []
    previous: list[str] = []
    for layer in range(layers):
        hub = f"h{layer}"
        tasks.append({"name": hub, "kind": kind, "depends_on": previous})
        wide = [f"w{layer}_{i}" for i in range(width)]
        tasks.extend({"name": name, "kind": kind, "depends_on": [hub]} for name in wide)
        previous = wide
    return {"name": f"bench-dag-{total}", "tasks": tasks}


def post_json(url: str, body: Any, *, timeout: float = 300) -> dict[str, Any]:
    response = httpx.post(url, json=body, timeout=timeout)
    if response.status_code not in (200, 201):
        raise BenchError(f"POST {url} -> {response.status_code}: {response.text[:500]}")
    result: dict[str, Any] = response.json()
    return result


async def _post_many(
    url: str, bodies: list[dict[str, Any]], in_flight: int
) -> tuple[float, list[dict[str, Any]]]:
    """POST every body with at most ``in_flight`` requests outstanding; return elapsed seconds
    and the responses in order."""
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    results: list[dict[str, Any]] = [{} for _ in bodies]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)

    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def loop() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                response = await client.post(url, json=bodies[i])
                if response.status_code not in (200, 201):
                    raise BenchError(f"POST {url} -> {response.status_code}: {response.text}")
                results[i] = response.json()

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
    return elapsed, results


def post_many(
    url: str, bodies: list[dict[str, Any]], in_flight: int
) -> tuple[float, list[dict[str, Any]]]:
    return asyncio.run(_post_many(url, bodies, in_flight))


# --- scenario results --------------------------------------------------------------------------


@dataclass
class Result:
    """One scenario's figures (medians over runs) and the raw per-run numbers."""

    scenario: str
    figures: dict[str, float] = field(default_factory=dict)
    runs: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add_run(self, name: str, value: float) -> None:
        self.runs.setdefault(name, []).append(value)

    def settle(self) -> Result:
        for name, values in self.runs.items():
            self.figures[name] = median(values)
        return self


def _drain(
    c: Cluster,
    body: dict[str, Any] | list[dict[str, Any]],
    concurrency: int,
    timeout: float,
    **worker_env: str,
) -> Drain:
    """Submit with no worker running, then start the workers and time the drain: the ``count``
    handler's Redis counter shows progress, the database the final ``completed`` count. A drain
    still unfinished after ``timeout`` s is returned with ``complete=False``."""
    bodies = body if isinstance(body, list) else [body]
    total = sum(len(b["tasks"]) for b in bodies)
    c.reset_counter()
    before = c.count_status("completed")
    if len(bodies) == 1:
        post_json(f"{c.url}/v1/jobs", bodies[0])
    else:
        post_many(f"{c.url}/v1/jobs", bodies, 16)
    xacts = c.transactions()
    launched = time.monotonic()
    c.start_workers(concurrency, extra=worker_env)
    client = redis_client()
    first: list[tuple[int, CpuSplit]] = []

    def on_start(done: int) -> None:
        first.append((done, c.cpu_split(client)))

    try:
        ran = wait_drained(
            c.counter,
            total,
            launched=launched,
            timeout=timeout,
            check=c.check_workers,
            partial=True,
            on_start=on_start,
        )
        if not ran.complete:
            return ran
        # every handler ran; the end is when every completion is committed
        committed = wait_drained(
            lambda: c.count_status("completed") - before,
            total,
            launched=launched,
            timeout=max(10.0, timeout - (time.monotonic() - launched)),
            check=c.check_workers,
            partial=True,
        )
        cpu: dict[str, float] = {}
        if first:
            done, at_start = first[0]
            cpu = at_start.per_task(c.cpu_split(client), total - done)
    finally:
        c.stop_workers()
        client.close()
    after = c.transactions()  # the workers' backends flushed their counters as they exited
    return Drain(
        total,
        ran.started,
        committed.finished,
        launched,
        complete=committed.complete,
        cpu=cpu,
        transactions={k: after[k] - xacts[k] for k in after},
    )


def _incomplete(d: Drain, what: str) -> str:
    return f"{what} INCOMPLETE: {d.tasks} done in {d.finished - d.started:.0f}s (rate is partial)"


class More(Protocol):
    """Asked before each repeat of a scenario: may it run once more within its time budget?
    ``next_cost``: the seconds the repeat is expected to take, when the caller knows better
    than the average of what it has spent (the drain's rounds are followed by the peers' runs)."""

    def __call__(self, next_cost: float | None = None) -> bool: ...


# --- 1. drain ----------------------------------------------------------------------------------


#: ``WORKER_CONCURRENCY`` the README recommends for many short tasks: the drain's figure is
#: measured there with every other setting at its default (issue 17 item 2).
RECOMMENDED_CONCURRENCY = 256
#: Tuned variants each drain round also tries (worker environment on top of the defaults).
TUNED: dict[str, dict[str, str]] = {"claim_batch=128": {"BENCH_CLAIM_BATCH": "128"}}


def _variants(sizes: Sizes) -> list[tuple[str, int, dict[str, str]]]:
    """The drain's variants: label, ``WORKER_CONCURRENCY`` and worker environment of each of
    ``sizes.concurrencies``, of the recommended one if not among them, and of each ``TUNED``
    variant at the recommended concurrency."""
    variants: list[tuple[str, int, dict[str, str]]] = [
        (f"c{conc}", conc, {}) for conc in sizes.concurrencies
    ]
    if RECOMMENDED_CONCURRENCY not in sizes.concurrencies:
        variants.append((f"c{RECOMMENDED_CONCURRENCY}", RECOMMENDED_CONCURRENCY, {}))
    variants += [
        (f"c{RECOMMENDED_CONCURRENCY} {name}", RECOMMENDED_CONCURRENCY, env)
        for name, env in TUNED.items()
    ]
    return variants


def bench_drain(
    sizes: Sizes,
    runs: int,
    logs: Path,
    more: More,
    between: Callable[[int], float] | None = None,
) -> Result:
    """``drain_tasks`` queued no-op tasks, 2 workers, drained in rounds: each round drains
    every variant of :func:`_variants` once, in that order, then calls ``between(round)`` (the
    peers' runs, so that drift hits dtq and the peers alike). The recommended defaults' drain
    of each round is the measured run: ``tasks_per_s``, the CPU split and the transactions are
    medians over the rounds, and ``defaults_vs_tuned`` is its median rate over the best
    variant's (target: >= 0.8). Up to ``runs`` rounds; one more only while ``more`` says it
    fits (a round is expected to take as long as the last one plus what ``between`` said its
    next call takes). A drain that does not finish within ``drain_timeout`` ends the rounds."""
    result = Result("drain")
    n = sizes.drain_tasks
    recommended = f"c{RECOMMENDED_CONCURRENCY}"
    variants = _variants(sizes)
    samples: dict[str, list[float]] = {}
    with cluster("drain", logs) as c:
        next_cost: float | None = None
        for run in range(runs):
            if run > 0 and not more(next_cost):
                result.notes.append(f"{run} of {runs} rounds (time budget)")
                break
            started = time.monotonic()
            complete = True
            for label, conc, env in variants:
                d = _drain(c, flat_job(n), conc, sizes.drain_timeout, **env)
                samples.setdefault(label, []).append(d.rate)
                if label != recommended:
                    result.add_run(f"sweep {label}", d.rate)
                    say(f"  drain {label}: {d.rate:,.0f} tasks/s ({d.window:.2f}s)")
                else:
                    result.add_run("tasks_per_s", d.rate)
                    for part, us in d.cpu.items():
                        result.add_run(f"cpu_us_per_task_{part}", us)
                    for name, count in d.transactions.items():
                        result.add_run(f"transactions_{name}", count)
                    split = ", ".join(f"{part} {us:.0f}" for part, us in d.cpu.items())
                    xacts = ", ".join(f"{k:,} {name}" for name, k in d.transactions.items())
                    say(
                        f"  drain {label} defaults: {d.rate:,.0f} tasks/s ({d.window:.2f}s, "
                        f"wall {d.wall:.2f}s; CPU µs/task: {split or 'n/a'}; "
                        f"transactions: {xacts})"
                    )
                if not d.complete:
                    result.notes.append(_incomplete(d, f"drain {label}"))
                    complete = False
                    break
            if not complete:
                break
            next_cost = time.monotonic() - started
            if between is not None:
                next_cost += between(run)
    result.settle()
    medians = {label: median(rates) for label, rates in samples.items() if rates}
    result.figures["concurrency"] = RECOMMENDED_CONCURRENCY
    if medians:
        best = max(medians, key=lambda k: medians[k])
        if recommended in medians and medians[best]:
            result.figures["defaults_vs_tuned"] = medians[recommended] / medians[best]
        rounds = len(samples[variants[0][0]])
        result.notes.insert(
            0,
            f"{n} tasks, {WORKERS} workers, WORKER_CONCURRENCY={RECOMMENDED_CONCURRENCY}, every "
            f"other setting at its default; {rounds} round(s) of every variant, the defaults' "
            "drain of each round measured (medians: "
            + ", ".join(f"{k} {v:,.0f}/s" for k, v in medians.items())
            + f"; best {best})",
        )
    return result


# --- 2. submit ---------------------------------------------------------------------------------


def bench_submit(sizes: Sizes, runs: int, logs: Path, more: More) -> Result:
    """One job of 10,000 tasks, and 10,000 single-task POSTs ~32 in flight (no workers)."""
    result = Result("submit")
    with cluster("submit", logs) as c:
        # warm up the API (first-request costs: imports, pool connections, plan caches)
        post_many(f"{c.url}/v1/tasks", [{"kind": "noop"}] * 64, 16)
        for run in range(runs):
            if run > 0 and not more():
                result.notes.append(f"{run} of {runs} runs (time budget)")
                break
            body = flat_job(sizes.submit_job_tasks, kind="noop")
            started = time.perf_counter()
            post_json(f"{c.url}/v1/jobs", body)
            elapsed = time.perf_counter() - started
            result.add_run("job_tasks_per_s", sizes.submit_job_tasks / elapsed)
            elapsed = post_same(
                f"{c.url}/v1/tasks",
                {"kind": "noop"},
                sizes.submit_single_tasks,
                sizes.submit_in_flight,
            )
            result.add_run("single_tasks_per_s", sizes.submit_single_tasks / elapsed)
            say(
                f"  submit: job {result.runs['job_tasks_per_s'][-1]:,.0f}/s, single "
                f"{result.runs['single_tasks_per_s'][-1]:,.0f}/s"
            )
    result.notes.insert(
        0,
        f"job of {sizes.submit_job_tasks}; {sizes.submit_single_tasks} single POST /v1/tasks "
        f"with {sizes.submit_in_flight} in flight (keep-alive connections; a light client: "
        "httpx's own CPU, 1-3 ms per request, would be taken from the server's 2 cores)",
    )
    return result.settle()


# --- 3. latency --------------------------------------------------------------------------------


def bench_latency(sizes: Sizes, runs: int, logs: Path, more: More, concurrency: int) -> Result:
    """Idle system: submit one ``stamp`` task, wait for its handler to start, repeat.

    The measured runs post through ``KeepAliveClient`` (the request built before the clock
    starts); one more run, if the budget allows, posts through httpx's sync client and is
    reported beside them, so the figure can be set against those of earlier passes."""
    result = Result("latency")
    with cluster("latency", logs) as c:
        c.start_workers(concurrency, wait_ready=True)
        key = f"{c.app_prefix}started"
        client = redis_client()
        try:
            light = KeepAliveClient(c.url)
            request = light.prepare("/v1/tasks", {"kind": "stamp"})
            cut = False
            try:
                for run in range(runs):
                    if run > 0 and not more():
                        result.notes.append(f"{run} of {runs} runs (time budget)")
                        cut = True
                        break
                    samples = _latency_run(lambda: light.send(request), client, c, key, sizes)
                    for q in (50, 95, 99):
                        result.add_run(f"p{q}_ms", percentile(samples, q))
                    say(
                        f"  latency: p50 {percentile(samples, 50):.1f} ms, "
                        f"p99 {percentile(samples, 99):.1f} ms"
                    )
            finally:
                light.close()
            if not cut and more():  # the reference run only after every measured one
                with httpx.Client(timeout=30) as http:

                    def post() -> tuple[int, bytes]:
                        answer = http.post(f"{c.url}/v1/tasks", json={"kind": "stamp"})
                        return answer.status_code, answer.content

                    samples = _latency_run(post, client, c, key, sizes)
                p50, p99 = percentile(samples, 50), percentile(samples, 99)
                result.figures["httpx_p50_ms"], result.figures["httpx_p99_ms"] = p50, p99
                result.notes.append(
                    f"one run through httpx's sync client instead: p50 {p50:.1f} ms, "
                    f"p99 {p99:.1f} ms (the client's own CPU, ~1.8 ms per request here)"
                )
                say(f"  latency (httpx client): p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        finally:
            client.close()
            c.stop_workers()
    result.notes.insert(
        0,
        f"{sizes.latency_tasks} tasks one at a time, WORKER_CONCURRENCY={concurrency}; a "
        "keep-alive HTTP/1.1 client whose request is built before the clock starts",
    )
    return result.settle()


def _latency_run(
    post: Callable[[], tuple[int, bytes]], client: Any, c: Cluster, key: str, sizes: Sizes
) -> list[float]:
    """``sizes.latency_tasks`` samples (ms) after 20 warm-up tasks: ``post`` submits one
    ``stamp`` task; the handler's first action pushes its task id and ``time.time()``."""
    samples: list[float] = []
    warmup = 20
    for i in range(sizes.latency_tasks + warmup):
        sent = time.time()
        status, body = post()
        if status != 201:
            raise BenchError(f"submit failed: {status} {body!r}")
        task_id = json.loads(body)["task_id"]
        reply = client.brpop([key], timeout=10)
        if reply is None:
            c.check_workers()
            raise BenchError("a stamp task did not start within 10 s")
        got_id, started = reply[1].split()
        if got_id != task_id:
            raise BenchError(f"expected the start of {task_id}, got {got_id}")
        if i >= warmup:
            samples.append((float(started) - sent) * 1000)
    return samples


# --- 4. scale ----------------------------------------------------------------------------------


def bench_scale(
    sizes: Sizes,
    runs: int,
    logs: Path,
    more: More,
    concurrency: int,
    reuse: dict[int, list[float]] | None = None,
) -> Result:
    """Per-task drain cost (µs of drain window per task) for jobs of 1, 10, 1,000 and 10,000
    tasks and a 10,000-task layered DAG. Jobs smaller than ``scale_total`` are drained
    ``scale_total // size`` at a time. ``reuse`` maps a job size to drain rates already measured
    at this concurrency (the drain scenario's 10,000-task job), which are not run again."""
    result = Result("scale")
    reuse = reuse or {}
    with cluster("scale", logs) as c:
        for run in range(runs):
            if run > 0 and not more():
                result.notes.append(f"{run} of {runs} runs (time budget)")
                break
            incomplete = False
            for size in sizes.scale_sizes:
                key = f"us_per_task_{size}"
                done = len(result.runs.get(key, []))
                if size in reuse:
                    if done < len(reuse[size]):
                        result.add_run(key, 1e6 / reuse[size][done])
                    continue
                jobs = [flat_job(size) for _ in range(max(1, sizes.scale_total // size))]
                d = _drain(c, jobs, concurrency, sizes.drain_timeout)
                result.add_run(key, 1e6 * d.window / max(d.tasks, 1))
                if not d.complete:
                    result.notes.append(_incomplete(d, f"jobs of {size}"))
                    incomplete = True
                    break
            if incomplete:
                break
            d = _drain(
                c, dag_job(sizes.dag_tasks, sizes.dag_layers), concurrency, sizes.drain_timeout
            )
            result.add_run("us_per_task_dag", 1e6 * d.window / max(d.tasks, 1))
            say(
                "  scale: "
                + ", ".join(
                    f"{k.removeprefix('us_per_task_')} {v[-1]:,.0f}us"
                    for k, v in result.runs.items()
                )
            )
            if not d.complete:
                result.notes.append(_incomplete(d, "DAG"))
                break
    result.settle()
    costs = {k: v for k, v in result.figures.items() if k.startswith("us_per_task_")}
    reference = f"us_per_task_{sizes.scale_reference}"
    largest = f"us_per_task_{sizes.scale_sizes[-1]}"
    if reference in costs and largest in costs:
        result.figures["ratio_largest_job"] = costs[largest] / costs[reference]
    if costs:
        result.figures["ratio_max_min"] = max(costs.values()) / min(costs.values())
    result.notes.insert(
        0,
        f"jobs of {'/'.join(map(str, sizes.scale_sizes))} ({sizes.scale_total} tasks per small-"
        f"job configuration) and a {sizes.dag_tasks}-task {sizes.dag_layers}-layer fan-out/"
        f"fan-in DAG; WORKER_CONCURRENCY={concurrency}",
    )
    return result


# --- 5. retry precision ------------------------------------------------------------------------


def bench_retry(sizes: Sizes, runs: int, logs: Path, more: More, concurrency: int) -> Result:
    """``fail_once`` tasks submitted one by one at a steady pace; lateness of each retry =
    second-attempt start - first-attempt failure - RETRY_BACKOFF."""
    result = Result("retry")
    with cluster("retry", logs) as c:
        c.start_workers(concurrency, wait_ready=True)
        client = redis_client()
        try:
            for run in range(runs):
                if run > 0 and not more():
                    result.notes.append(f"{run} of {runs} runs (time budget)")
                    break
                client.delete(f"{c.app_prefix}failed", f"{c.app_prefix}retried")
                samples = _retry_run(c, client, sizes)
                for q in (50, 99):
                    result.add_run(f"p{q}_ms", percentile(samples, q))
                result.add_run("max_ms", max(samples))
                say(
                    f"  retry: lateness p50 {percentile(samples, 50):.1f} ms, "
                    f"p99 {percentile(samples, 99):.1f} ms"
                )
        finally:
            client.close()
            c.stop_workers()
    result.notes.insert(
        0,
        f"{sizes.retry_tasks} tasks, RETRY_BACKOFF={RETRY_BACKOFF:g}s, default PROMOTE_INTERVAL, "
        f"WORKER_CONCURRENCY={concurrency}",
    )
    return result.settle()


def _retry_run(c: Cluster, client: Any, sizes: Sizes) -> list[float]:
    with httpx.Client(timeout=30) as http:
        for _ in range(sizes.retry_tasks):
            response = http.post(f"{c.url}/v1/tasks", json={"kind": "fail_once"})
            if response.status_code != 201:
                raise BenchError(f"submit failed: {response.status_code} {response.text}")
            time.sleep(sizes.retry_pace)
    deadline = time.monotonic() + 60
    while client.hlen(f"{c.app_prefix}retried") < sizes.retry_tasks:
        if time.monotonic() > deadline:
            raise BenchError("not every fail_once task was retried within 60 s")
        c.check_workers()
        time.sleep(0.05)
    failed = client.hgetall(f"{c.app_prefix}failed")
    retried = client.hgetall(f"{c.app_prefix}retried")
    return [(float(retried[k]) - float(failed[k]) - RETRY_BACKOFF) * 1000 for k in retried]
