"""Real processes against real PostgreSQL and Redis: ``dtq migrate``, ``dtq orchestrator`` and
``dtq-worker`` started as subprocesses with short timings, driven through the HTTP API.

Each test gets its own database (serializable by default) and Redis key prefix, both removed
afterwards. Without PostgreSQL or Redis the drills skip on a laptop and fail under ``CI``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from dtq.adapters.redis import tagged_prefix
from tests.tcp_proxy import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN_DSN = os.environ.get("DTQ_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("DTQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BIN = Path(sys.executable).parent


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} unreachable for the e2e drills: {exc}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    return free_port()


@pytest.fixture
def database() -> Iterator[str]:
    """A throwaway database with the migrations applied by ``dtq migrate`` later; yields its DSN."""
    name = f"dtq_e2e_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        _unavailable("PostgreSQL", exc)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(
            f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'serializable'"
        )
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_DSN)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo("", **info)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique key prefix; every key under it is deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable("Redis", exc)
    prefix = f"dtqe2e:{uuid.uuid4().hex[:8]}:"
    yield prefix
    delete_prefix(client, prefix)
    client.close()


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` and its hash-tagged form (``tagged_prefix``, where the
    queue's keys live): our FLUSHALL, it spares other users of the server."""
    keys = [
        key
        for start in dict.fromkeys((prefix, tagged_prefix(prefix)))
        for key in client.scan_iter(match=f"{start}*", count=1000)
    ]
    if keys:
        client.delete(*keys)
    return len(keys)


@dataclass
class Cluster:
    """The processes of one drill and the HTTP client to their orchestrator."""

    env: dict[str, str]
    logs: Path
    records: Path
    port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, *args: str) -> str:
        """Run a dtq command to completion; return its stdout."""
        done = subprocess.run(
            [str(BIN / "dtq"), *args], env=self.env, capture_output=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    def start(self, name: str, *args: str, command: str = "dtq", **env: str) -> None:
        """Start ``command args`` in the background, logging to ``logs/<name>.log``."""
        with (self.logs / f"{name}.log").open("ab") as log:  # the child keeps its own fd
            self.procs[name] = subprocess.Popen(
                [str(BIN / command), *args],
                env={**self.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_orchestrator(self) -> None:
        self.start("orchestrator", "orchestrator")
        self.wait_healthy()

    def start_worker(self, name: str, **env: str) -> None:
        self.start(name, "--app", "tests.e2e.app:runtime", command="dtq-worker", **env)

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)

    def wait_exit(self, name: str, timeout: float = 20) -> int:
        return self.procs[name].wait(timeout=timeout)

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"orchestrator not healthy; log:\n{self.log('orchestrator')}")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def post(self, path: str, body: Any) -> dict[str, Any]:
        response = httpx.post(f"{self.url}{path}", json=body, timeout=30)
        assert response.status_code in (200, 201), response.text
        result: dict[str, Any] = response.json()
        return result

    def get(self, path: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}{path}", timeout=30)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def wait_job(
        self, job_id: str, *, timeout: float = 60, until: str = "terminal"
    ) -> dict[str, Any]:
        """Poll the job until it is terminal (or has status ``until``)."""
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.get(f"/v1/jobs/{job_id}")
            status = job["status"]
            if status == until or (
                until == "terminal" and status in ("completed", "failed", "cancelled")
            ):
                return job
            time.sleep(0.1)
        counts: dict[str, int] = {}
        for task in job.get("tasks", []):
            counts[task["status"]] = counts.get(task["status"], 0) + 1
        raise AssertionError(
            f"job {job_id} still {job.get('status')} after {timeout}s: {counts}\n"
            + "\n".join(f"--- {n}\n{self.log(n)}" for n in self.procs)
        )

    def read_records(self) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for path in self.records.glob("*.jsonl"):
            lines.extend(json.loads(line) for line in path.read_text().splitlines() if line)
        return lines

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster(database: str, redis_prefix: str, tmp_path: Path) -> Iterator[Cluster]:
    """Migrated database + env for processes; every process is stopped afterwards."""
    records = tmp_path / "records"
    records.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    port = _free_port()
    redis_addr = REDIS_URL.removeprefix("redis://").split("/")[0]
    env = {
        **os.environ,
        "CRDB_DSN": database,
        "REDIS_ADDR": redis_addr,
        "REDIS_KEY_PREFIX": redis_prefix,
        "ORCHESTRATOR_LISTEN": f"127.0.0.1:{port}",
        "LEASE_DURATION": "2s",
        "STALE_RUNNING_AFTER": "2s",
        "RECONCILE_INTERVAL": "500ms",
        "RETRY_BACKOFF": "200ms",
        "PENDING_MARKER_TTL": "5s",
        "WORKER_CONCURRENCY": "8",
        "WORKER_HEARTBEAT_INTERVAL": "1s",
        "LOG_FORMAT": "json",
        # explicitly off (the orchestrator's default is tokens); test_tokens_e2e turns it on
        "API_AUTH": "none",
        "E2E_RECORD_DIR": str(records),
        # this tree's src first, so a git worktree's processes run its own code, not the
        # editable install's
        "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("src", "")),
    }
    env.pop("WORKER_ID", None)
    c = Cluster(env=env, logs=logs, records=records, port=port)
    c.run("migrate")
    try:
        yield c
    finally:
        c.stop_all()
