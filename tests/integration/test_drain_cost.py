"""What a drain costs PostgreSQL per batch, pinned where a schema change can silently raise it.

The drain benchmark found it (benchmarks/PROFILE.md, third pass): once ``job_position`` and
``result`` widened the task row, every completion's settle probe (``JOB_HAS_STATUS``) visited
~2,000 dead index entries instead of ~50-200 halfway through a 5,000-task drain, because the
row versions that claims and completions leave behind were no longer pruned as they had been.
Keeping 10 % of each ``tasks`` heap page free (migration 0018) restored the old figures.
"""

from __future__ import annotations

import pytest

from dtq.adapters.cockroach.pool import Pool

pytestmark = pytest.mark.integration


async def test_tasks_heap_pages_keep_room_for_the_rewritten_rows(pg_pool: Pool) -> None:
    async with pg_pool.connection() as conn:
        version = await (await conn.execute("SELECT version()")).fetchone()
        if version is not None and "CockroachDB" in str(version[0]):
            pytest.skip("fillfactor is a PostgreSQL heap setting (a no-op on CockroachDB)")
        cur = await conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'tasks' AND relkind = 'r'"
        )
        row = await cur.fetchone()
    assert row is not None
    assert "fillfactor=70" in (row[0] or [])
