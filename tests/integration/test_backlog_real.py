"""A large backlog on PostgreSQL (issue 17 item 5): the reconciler's keyset listings stay range
scans of their index on a table that has no statistics yet, as a fresh deployment's backlog
has (autovacuum has not analyzed it; the local server runs without autovacuum at all).

Without statistics the planner guesses a handful of matches for the row comparison of the
keyset and picks a bitmap scan of every queued task past the cursor plus a top-N sort: O(backlog)
per page (0.9-1.4 s per page of 500 at 1,000,000 queued tasks, measured on the 2-core box). The
pool turns bitmap scans off for its sessions, as it does sequential scans, so each page reads
500 index entries in key order.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from dtq.adapters.cockroach import apply_migrations
from dtq.adapters.cockroach.pool import open_pool
from dtq.adapters.cockroach.sql import DUE_QUEUED_AFTER, STALE_RUNNING_AFTER

pytestmark = pytest.mark.integration

# 20,000 queued tasks in 4 jobs (a job's tasks share their scheduled_at, as a submit writes
# them), and 2,000 running ones; no ANALYZE.
SEED = (
    "INSERT INTO jobs (id, name, status) SELECT gen_random_uuid(), 'j' || g, 'running'"
    " FROM generate_series(1, 4) AS g",
    "INSERT INTO tasks (id, job_id, name, kind, status, scheduled_at, job_position)"
    " SELECT gen_random_uuid(), j.id, 't' || g, 'count', 'queued',"
    " now() - interval '1 hour' + j.n * interval '1 second', g"
    " FROM (SELECT id, row_number() OVER () AS n FROM jobs) AS j, generate_series(1, 5000) AS g",
    "UPDATE tasks SET status = 'running', started_at = now() - interval '1 hour',"
    " current_run_id = gen_random_uuid() WHERE job_position <= 500",
)


async def test_the_reconcilers_listings_read_their_index_in_key_order_without_statistics(
    pg_empty_dsn: str,
) -> None:
    apply_migrations(pg_empty_dsn)
    pool = await open_pool(pg_empty_dsn, min_size=1, max_size=1)
    try:
        async with pool.connection() as conn:
            for statement in SEED:
                await conn.execute(statement)
            now = datetime.now(UTC)
            plans = {}
            for name, query, params in (
                (
                    "idx_tasks_queued_scheduled",
                    DUE_QUEUED_AFTER,
                    (now, now - timedelta(hours=2), UUID(int=0), 500),
                ),
                (
                    "idx_tasks_running_id_started",
                    STALE_RUNNING_AFTER,
                    (UUID(int=0), now, 500),
                ),
            ):
                cur = await conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + query, params)
                plans[name] = "\n".join(str(row[0]) for row in await cur.fetchall())
    finally:
        await pool.close()

    for index, plan in plans.items():
        assert f"Index Scan using {index}" in plan, plan
        assert "Bitmap" not in plan and "Sort" not in plan, plan
