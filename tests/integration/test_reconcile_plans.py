"""The reconciler's two scans on PostgreSQL read the partial indexes of migrations 0055/0056
(issue 17 item 1: a claim or completion no longer writes an entry into a whole-table status
index for them), with the planner's defaults on ANALYZE'd data where almost every task is
``completed``, as in a long-running deployment.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from dtq.adapters.cockroach import apply_migrations, sql

pytestmark = pytest.mark.integration

SEED = (
    "INSERT INTO jobs (id, name, status, created_at, updated_at)"
    " VALUES ('00000000-0000-4000-8000-0000000000a1', 'j', 'running', now(), now())",
    "INSERT INTO tasks (id, job_id, name, kind, status, created_at, updated_at, job_position,"
    " scheduled_at, started_at, current_run_id)"
    " SELECT gen_random_uuid(), '00000000-0000-4000-8000-0000000000a1', 't' || p, 'k',"
    " CASE WHEN p % 97 = 0 THEN 'queued' WHEN p % 89 = 0 THEN 'running' ELSE 'completed' END,"
    " now(), now(), p, now() - interval '1 hour', now() - interval '1 hour', gen_random_uuid()"
    " FROM generate_series(0, 19999) AS p",
    "ANALYZE",
)


@pytest.fixture
def analyzed(pg_empty_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    apply_migrations(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement)
        yield conn


def _plan(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...]) -> str:
    rows = conn.execute("EXPLAIN (COSTS OFF) " + query, params).fetchall()
    return "\n".join(row[0] for row in rows)


def test_due_queued_and_stale_running_read_the_partial_indexes(
    analyzed: psycopg.Connection[Any],
) -> None:
    now = datetime.now(UTC)
    cursor = uuid.UUID(int=0)
    shapes = {
        "idx_tasks_queued_scheduled": [
            (sql.DUE_QUEUED_FIRST, (now, 100)),
            (sql.DUE_QUEUED_AFTER, (now, now, cursor, 100)),
        ],
        "idx_tasks_running_id_started": [
            (sql.STALE_RUNNING_FIRST, (now, 100)),
            (sql.STALE_RUNNING_AFTER, (cursor, now, 100)),
        ],
    }
    for index, queries in shapes.items():
        for query, params in queries:
            plan = _plan(analyzed, query, params)
            assert index in plan, plan
            assert "Seq Scan" not in plan, plan

    # each partial index holds only the rows of its status (ANALYZE counted them)
    sizes = dict(
        analyzed.execute(
            "SELECT relname, reltuples::bigint FROM pg_class WHERE relname = ANY(%s)",
            (list(shapes),),
        ).fetchall()
    )
    queued = analyzed.execute("SELECT count(*) FROM tasks WHERE status = 'queued'").fetchone()
    running = analyzed.execute("SELECT count(*) FROM tasks WHERE status = 'running'").fetchone()
    assert queued is not None and running is not None
    assert sizes == {
        "idx_tasks_queued_scheduled": queued[0],
        "idx_tasks_running_id_started": running[0],
    }
