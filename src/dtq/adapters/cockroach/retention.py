"""``RetentionRepository`` on one psycopg transaction (issue 14 item 8; SQL in ``sql.py``).

``delete_jobs`` issues a constant number of statements for its batch: the qualifying check,
the task names of the jobs that leave a tombstone (only when some do), one delete per table
(children first) and one tombstone insert. The batch's size in tasks is the caller's bound
(``RetentionService`` splits pages into transactions of at most ``batch_tasks`` tasks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

from dtq.adapters.cockroach import sql
from dtq.adapters.cockroach.rows import decode_json, encode_json
from dtq.adapters.cockroach.txconn import Conn
from dtq.application.ports import FinishedJob, PrunedJobs, Tombstone
from dtq.domain.status import JobStatus


class PgRetentionRepository:
    """``RetentionRepository`` on one transaction."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def finished_jobs(
        self,
        *,
        status: JobStatus,
        updated_before: datetime,
        after: tuple[datetime, UUID] | None,
        limit: int,
    ) -> list[FinishedJob]:
        """Keyset page of ``idx_jobs_status_updated_id``."""
        if after is None:
            cur = await self._conn.execute(
                sql.FINISHED_JOBS_FIRST, (status.value, updated_before, limit)
            )
        else:
            cur = await self._conn.execute(
                sql.FINISHED_JOBS_AFTER, (status.value, updated_before, after[0], after[1], limit)
            )
        return [
            FinishedJob(id=row[0], updated_at=row[1].astimezone(UTC))
            for row in await cur.fetchall()
        ]

    async def task_counts(self, job_ids: Sequence[UUID]) -> dict[UUID, int]:
        """Tasks per job, counted on ``idx_tasks_job_id``."""
        if not job_ids:
            return {}
        cur = await self._conn.execute(sql.TASK_COUNTS, (list(job_ids),))
        return {row[0]: int(row[1]) for row in await cur.fetchall()}

    async def delete_jobs(
        self,
        job_ids: Sequence[UUID],
        *,
        status: JobStatus,
        finished_before: datetime,
        tombstone_at: datetime | None,
    ) -> PrunedJobs:
        """Delete the qualifying jobs of the batch, children first; see the port."""
        if not job_ids:
            return PrunedJobs()
        conn = self._conn
        cur = await conn.execute(
            sql.PRUNABLE_JOBS,
            (list(dict.fromkeys(job_ids)), status.value, finished_before, finished_before),
        )
        prunable = await cur.fetchall()
        if not prunable:
            return PrunedJobs()
        ids = [row[0] for row in prunable]
        keyed = {row[0]: (row[1], row[2]) for row in prunable if row[1] is not None}
        names: dict[UUID, dict[str, str]] = defaultdict(dict)
        if tombstone_at is not None and keyed:
            cur = await conn.execute(sql.TASK_NAMES_OF_JOBS, (list(keyed),))
            for job_id, name, task_id in await cur.fetchall():
                names[job_id][name] = str(task_id)
        await conn.execute(sql.DELETE_EVENTS_OF_JOBS, (ids,))
        runs = (await conn.execute(sql.DELETE_RUNS_OF_JOBS, (ids,))).rowcount
        await conn.execute(sql.DELETE_EDGES_OF_JOBS, (ids,))
        tasks = (await conn.execute(sql.DELETE_TASKS_OF_JOBS, (ids,))).rowcount
        jobs = (await conn.execute(sql.DELETE_JOBS, (ids,))).rowcount
        written = 0
        if tombstone_at is not None and keyed:
            await conn.execute(
                sql.INSERT_TOMBSTONES,
                (
                    tombstone_at,
                    [key for key, _ in keyed.values()],
                    [request_hash for _, request_hash in keyed.values()],
                    list(keyed),
                    [encode_json(names[job_id]) for job_id in keyed],
                ),
            )
            written = len(keyed)
        return PrunedJobs(jobs=jobs, tasks=tasks, runs=runs, tombstones_written=written)

    async def get_tombstone(self, key: str) -> Tombstone | None:
        """The key's tombstone (primary key lookup), or None."""
        row = await (await self._conn.execute(sql.GET_TOMBSTONE, (key,))).fetchone()
        if row is None:
            return None
        task_ids = {name: UUID(value) for name, value in decode_json(row[3]).items()}
        return Tombstone(
            idempotency_key=row[0],
            request_hash=row[1],
            job_id=row[2],
            task_ids=task_ids,
            pruned_at=row[4].astimezone(UTC),
        )

    async def delete_tombstones(self, *, pruned_before: datetime, limit: int) -> int:
        """Delete a bounded page of expired tombstones, oldest first."""
        cur = await self._conn.execute(sql.DELETE_TOMBSTONES, (pruned_before, limit))
        return cur.rowcount
