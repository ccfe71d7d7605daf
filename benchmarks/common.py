"""Shared plumbing of the benchmarks: throwaway databases and Redis prefixes, child processes,
polling until work is done, and the statistics every scenario reports.

Every resource is created through a context manager that removes it again (the database is
dropped WITH (FORCE), every key under the prefix is deleted), also when a run fails or is
interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import redis

from dtq.adapters.redis.keys import tagged_prefix

#: The sync Redis client (an alias: ``CpuSplit``'s ``redis`` field shadows the module).
RedisClient = redis.Redis

ADMIN_DSN = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class BenchError(Exception):
    """A scenario could not produce a figure (a service is down, work did not finish...)."""


# --- services ----------------------------------------------------------------------------------


def redis_addr() -> str:
    """``host:port`` of the bench Redis (dtq's ``REDIS_ADDR``)."""
    return REDIS_URL.removeprefix("redis://").split("/")[0]


def redis_client() -> redis.Redis:
    """A synchronous client of the bench Redis (decoded responses)."""
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


def check_services() -> None:
    """Fail early, with one line, when PostgreSQL or Redis cannot be reached."""
    try:
        with psycopg.connect(ADMIN_DSN, connect_timeout=5):
            pass
    except psycopg.Error as exc:
        raise BenchError(f"PostgreSQL unreachable at {ADMIN_DSN}: {exc}") from None
    client = redis_client()
    try:
        client.ping()
    except redis.RedisError as exc:
        raise BenchError(f"Redis unreachable at {REDIS_URL}: {exc}") from None
    finally:
        client.close()


def probe_connect(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection for the harness's own probes (counting done tasks while a drain
    runs, reading CPU or block counters) at READ COMMITTED.

    The bench databases default to SERIALIZABLE, as dtq's own transactions need. A probe that
    counts ``tasks`` every 10 ms at that level takes SIRead locks on the table and joins the
    workers' read/write dependency graph: PostgreSQL then cancels workers' transactions (which
    dtq re-runs, slower) and the probe itself ("canceled on conflict out to pivot"). The harness
    only observes; it must not take part.
    """
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET default_transaction_isolation = 'read committed'")
    return conn


def dsn_for(database: str) -> str:
    """The admin DSN pointed at ``database``."""
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_DSN)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo("", **info)


@contextlib.contextmanager
def temp_database(tag: str, *, serializable: bool = False) -> Iterator[str]:
    """Create ``bench_<tag>_<hex>``; yield its DSN; drop it (WITH FORCE) afterwards."""
    name = f"bench_{tag}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        if serializable:
            admin.execute(
                f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'serializable'"
            )
    try:
        yield dsn_for(name)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` and under its hash-tagged form (``tagged_prefix``: dtq's
    queue keys; peers use ``prefix`` as given); return how many there were."""
    deleted = 0
    for start in dict.fromkeys((prefix, tagged_prefix(prefix))):
        batch: list[str] = []
        for key in client.scan_iter(match=f"{start}*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += int(client.delete(*batch))
                batch.clear()
        if batch:
            deleted += int(client.delete(*batch))
    return deleted


@contextlib.contextmanager
def temp_prefix(tag: str) -> Iterator[str]:
    """A unique Redis key prefix ``bench:<tag>:<hex>:``; every key under it is deleted after."""
    prefix = f"bench:{tag}:{uuid.uuid4().hex[:8]}:"
    try:
        yield prefix
    finally:
        client = redis_client()
        try:
            delete_prefix(client, prefix)
        finally:
            client.close()


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- child processes ---------------------------------------------------------------------------


@dataclass
class Processes:
    """Child processes started in their own sessions, each logging to a file under ``logs``."""

    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        """Start ``argv`` in the background; stdout and stderr go to ``logs/<name>.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                list(argv),
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def check_alive(self, *names: str) -> None:
        """Raise ``BenchError`` with the log tail when one of ``names`` has exited."""
        for name in names or tuple(self.procs):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self, *names: str, timeout: float = 15.0) -> None:
        """SIGTERM the named processes (all when none named) as a group; SIGKILL stragglers."""
        chosen = [n for n in (names or tuple(self.procs)) if n in self.procs]
        for name in chosen:
            _signal_group(self.procs[name], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in chosen:
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# --- waiting for work --------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    """When a drain was first seen to make progress and when it was seen complete.

    ``window`` runs from the first poll that saw at least one task done to the first poll that
    saw all of them done, so worker start-up time is left out for every system alike.
    """

    tasks: int  # tasks done (all of them unless ``complete`` is False)
    started: float  # time.monotonic() of the first poll seeing progress
    finished: float  # time.monotonic() of the first poll seeing everything done
    launched: float  # time.monotonic() just before the workers were started
    complete: bool = True  # False: the wait timed out with ``tasks`` done out of more
    #: µs of CPU per task by part (workers, postgres, redis, orchestrator) over the window, where
    #: the harness measured it (``CpuSplit``); empty otherwise
    cpu: dict[str, float] = field(default_factory=dict)
    #: transactions of the drain's database (``commits``, ``rollbacks``), where measured
    transactions: dict[str, int] = field(default_factory=dict)

    @property
    def window(self) -> float:
        return max(self.finished - self.started, 1e-6)

    @property
    def rate(self) -> float:
        """Tasks per second over the window."""
        return self.tasks / self.window

    @property
    def wall(self) -> float:
        """Seconds from starting the workers to all done (start-up included)."""
        return self.finished - self.launched


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (all its threads; 0 when it is gone)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def backend_pids(dsn: str) -> list[int]:
    """The PostgreSQL backends connected to the database of ``dsn`` (not this probe's own)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(row[0]) for row in rows]


def redis_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (shared with every other client of it)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class CpuSplit:
    """CPU seconds of each part of a dtq cluster at one moment (``take``); the difference of
    two, over the tasks done between them, is the per-task split (``per_task``)."""

    workers: float
    postgres: float
    redis: float
    orchestrator: float

    @classmethod
    def take(
        cls, workers: Sequence[int], orchestrator: int | None, dsn: str, client: RedisClient
    ) -> CpuSplit:
        """Read ``/proc`` for the worker and orchestrator pids and every PostgreSQL backend of
        ``dsn``'s database (the server must run on this machine), and Redis's INFO."""
        return cls(
            workers=sum(map(cpu_seconds, workers)),
            postgres=sum(map(cpu_seconds, backend_pids(dsn))),
            redis=redis_cpu(client),
            orchestrator=0.0 if orchestrator is None else cpu_seconds(orchestrator),
        )

    def per_task(self, later: CpuSplit, tasks: int) -> dict[str, float]:
        """µs of CPU per task of each part from this moment to ``later``. PostgreSQL counts the
        backends connected at both moments; Redis is the whole server (the bench's only
        client while a drain runs)."""
        n = max(tasks, 1)
        return {
            part: round((getattr(later, part) - getattr(self, part)) * 1e6 / n, 1)
            for part in ("workers", "postgres", "redis", "orchestrator")
        }


def wait_drained(
    count: Callable[[], int],
    total: int,
    *,
    launched: float,
    timeout: float,
    interval: float = 0.01,
    check: Callable[[], None] | None = None,
    partial: bool = False,
    on_start: Callable[[int], None] | None = None,
) -> Drain:
    """Poll ``count()`` until it reaches ``total``.

    Args:
        count: how many tasks are done now.
        total: how many must be done.
        launched: ``time.monotonic()`` taken just before the workers started.
        timeout: seconds from now before giving up.
        interval: seconds between polls.
        check: called every few polls (e.g. to fail fast when a worker died).
        partial: on timeout return what was done (``complete=False``) instead of raising.
        on_start: called once, with the count, at the first poll that sees progress.

    Raises:
        BenchError: ``total`` was not reached within ``timeout`` (and ``partial`` is False).
    """
    deadline = time.monotonic() + timeout
    started: float | None = None
    polls = 0
    done = 0
    while True:
        done = count()
        now = time.monotonic()
        if done > 0 and started is None:
            started = now
            if on_start is not None:
                on_start(done)
        if done >= total:
            return Drain(tasks=total, started=started or now, finished=now, launched=launched)
        if now > deadline:
            if partial:
                return Drain(done, started or now, now, launched, complete=False)
            raise BenchError(f"only {done}/{total} tasks done after {timeout:.0f}s")
        polls += 1
        if check is not None and polls % 50 == 0:
            check()
        time.sleep(interval)


# --- a light HTTP client -----------------------------------------------------------------------


def post_same(url: str, body: dict[str, Any], n: int, in_flight: int) -> float:
    """POST ``body`` as JSON to ``url`` ``n`` times, ``in_flight`` at once, each on its own
    keep-alive HTTP/1.1 connection; return the seconds taken. Every answer must be a 201.

    A minimal client (``Content-Length`` bodies only) for the single-submit figures: httpx's
    connection pool costs 1-3 ms of CPU per request at 32 connections, which on a 2-core
    machine is taken from the server under test; this one costs ~0.04 ms.

    Raises:
        BenchError: an answer other than 201.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    data = json.dumps(body).encode()
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    request = head + data
    left = n

    async def lane() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while left > 0:
                left -= 1
                writer.write(request)
                status = await _read_response(reader)
                if status != 201:
                    raise BenchError(f"POST {url} -> {status}")
        finally:
            writer.close()

    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(in_flight)))
        return time.perf_counter() - started

    return asyncio.run(run())


class KeepAliveClient:
    """One blocking keep-alive HTTP/1.1 connection that POSTs a JSON body and reads the answer
    (``Content-Length`` bodies only): the latency scenario's client.

    The request's bytes are built before the caller's clock starts (:meth:`prepare`), so a
    sample times dtq, not the client: httpx's sync client spends ~1.8 ms of CPU per request on
    the 2-core machines (benchmarks/PROFILE.md, seventh pass), before its first byte is sent
    and while the worker claims, on the cores the system under test runs on.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._sock = socket.create_connection((self._host, self._port), timeout=30)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")

    def prepare(self, path: str, body: dict[str, Any]) -> bytes:
        """The bytes of ``POST path`` with ``body`` as JSON."""
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        return head.encode() + data

    def send(self, request: bytes) -> tuple[int, bytes]:
        """Send a prepared request; the answer's status and body.

        Raises:
            BenchError: the server closed the connection.
        """
        self._sock.sendall(request)
        line = self._file.readline()
        if not line:
            raise BenchError("the server closed the connection")
        status, length = int(line.split()[1]), 0
        while (header := self._file.readline()) not in (b"\r\n", b""):
            name, _, value = header.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, self._file.read(length)

    def close(self) -> None:
        """Close the connection."""
        self._file.close()
        self._sock.close()


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one response (status line, headers, ``Content-Length`` body); return its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


# --- statistics --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    """Median of the runs (NaN when there are none)."""
    return statistics.median(values) if values else math.nan


def say(line: str) -> None:
    """Progress output (stderr, so the table on stdout stays clean)."""
    print(line, file=sys.stderr, flush=True)
