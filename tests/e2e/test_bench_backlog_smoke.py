"""``make bench-backlog`` (``benchmarks.backlog``) runs to its table on a small backlog.

The scenario is opt-in and slow at its default million tasks, so only this smoke run keeps it
working: it broke unnoticed once when a statement it explains (``sql.DUE_QUEUED_AFTER``) lost
a parameter. Real orchestrator, workers, PostgreSQL and Redis, as the scenario uses them: the
servers of the e2e suite (``DTQ_TEST_DATABASE_URL``, ``DTQ_TEST_REDIS_URL``), where the
scenario creates and drops its own database and key prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from tests.e2e.conftest import ADMIN_DSN, REDIS_URL, ROOT, _unavailable

pytestmark = pytest.mark.e2e


def _servers_or_skip() -> None:
    """Skip (fail under ``CI``) without the servers; skip on CockroachDB (the scenario reads
    PostgreSQL's ``EXPLAIN`` and per-backend CPU)."""
    try:
        with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            row = admin.execute("SELECT version()").fetchone()
    except psycopg.Error as exc:
        _unavailable("PostgreSQL", exc)
        return
    if row is not None and "CockroachDB" in str(row[0]):
        pytest.skip("the backlog scenario measures PostgreSQL (EXPLAIN, backend CPU)")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable("Redis", exc)
    finally:
        client.close()


def test_the_backlog_scenario_runs_to_its_figures(tmp_path: Path) -> None:
    """A 3,000-task backlog in jobs of 1,000: every section runs and writes its figures."""
    _servers_or_skip()
    out = tmp_path / "backlog.json"
    sizes = ["--tasks", "3000", "--job-size", "1000", "--window", "1000", "--concurrency", "32"]
    env = {
        **os.environ,
        "BENCH_DATABASE_URL": ADMIN_DSN,
        "BENCH_REDIS_URL": REDIS_URL,
        "TMPDIR": str(tmp_path),  # the scenario's process logs
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.backlog", *sizes, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    figures = json.loads(out.read_text())
    assert figures["backlog"]["tasks"] == 3000
    assert figures["backlog"]["explain_ms"], figures["backlog"]
