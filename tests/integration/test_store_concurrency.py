"""CockroachStore under contention and failure (CRDB.md "Making PostgreSQL catch CockroachDB bugs").

PostgreSQL runs these with ``default_transaction_isolation = 'serializable'`` (and the pool asks
for SERIALIZABLE too), so concurrent read-modify-write transactions get the SQLSTATE 40001s
CockroachDB would raise. Faults that a local server will not produce on demand (40001 at
COMMIT, a lost COMMIT acknowledgement) are injected through the store's test hooks.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import errors as pg_errors

from dtq.adapters.cockroach.repositories import PgTransaction
from dtq.adapters.cockroach.store import CockroachStore, Pool
from dtq.application.ports import Transaction
from dtq.domain.entities import Job, Task, TaskRun, Worker
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    DuplicateIdempotencyKey,
    InvalidPayload,
)
from dtq.domain.status import JobStatus, TaskStatus

pytestmark = pytest.mark.integration

WORKERS = 8
TASKS = 24


def new_job(now: datetime, key: str | None = None) -> Job:
    return Job(uuid4(), "job", JobStatus.PENDING, now, now, idempotency_key=key)


def new_task(job: Job, name: str, now: datetime, **fields: Any) -> Task:
    values: dict[str, Any] = {
        "id": uuid4(),
        "job_id": job.id,
        "name": name,
        "kind": "k",
        "payload": {"name": name},
        "status": TaskStatus.QUEUED,
        "scheduled_at": now,
        "created_at": now,
        "updated_at": now,
    }
    values.update(fields)
    return Task(**values)


async def db_now(store: CockroachStore) -> datetime:
    async def fn(tx: Transaction) -> datetime:
        return await tx.now()

    return await store.run(fn)


async def job_exists(store: CockroachStore, job_id: UUID) -> bool:
    async def fn(tx: Transaction) -> bool:
        return await tx.jobs.get(job_id) is not None

    return await store.run(fn)


@dataclass
class Faults:
    """A ``CommitHook`` raising what ``at`` / ``after`` raise at / after COMMIT (None: nothing)."""

    at: Callable[[], None] | None = None
    after: Callable[[], None] | None = None

    def at_commit(self) -> None:
        if self.at is not None:
            self.at()

    def after_commit(self) -> None:
        if self.after is not None:
            self.after()


def recording_store(pool: Pool, **options: Any) -> tuple[CockroachStore, list[str]]:
    reasons: list[str] = []
    options.setdefault("base_backoff", 0.001)
    return CockroachStore(pool, on_retry=reasons.append, **options), reasons


# --- contention -------------------------------------------------------------------------------


async def test_concurrent_claims_take_every_task_exactly_once(pg_pool: Pool) -> None:
    """8 workers claim the tasks of ONE job; each claim also rewrites the shared job row.

    Every claim reads the job's tasks and the job row and writes both, so any two concurrent
    claims conflict: SERIALIZABLE answers with 40001 (or the version guard with
    ConcurrentUpdate) and the store re-runs the loser. The outcome must still be one run per
    task and no task claimed twice.
    """
    store, reasons = recording_store(pg_pool, max_retries=200, max_backoff=0.02)
    now = await db_now(store)
    job = new_job(now)
    tasks = [new_task(job, f"t{i:02d}", now) for i in range(TASKS)]

    async def create(tx: Transaction) -> None:
        await tx.jobs.add(job, tasks, [])

    await store.run(create)

    async def claim_next(tx: Transaction, worker: str) -> TaskRun | None:
        at = await tx.now()
        shared = await tx.jobs.get(job.id)
        assert shared is not None
        queued = [t for t in await tx.tasks.list_by_job(job.id) if t.status is TaskStatus.QUEUED]
        if not queued:
            return None
        task = queued[0]  # everybody goes for the same task: maximal contention
        run = task.claim(run_id=uuid4(), worker_id=worker, at=at)
        await tx.tasks.save(task)
        await tx.runs.add_many([run])
        shared.set_status(JobStatus.RUNNING, at=at)
        shared.updated_at = at
        await tx.jobs.save(shared)
        return run

    async def worker(name: str) -> list[TaskRun]:
        claimed = []
        while (run := await store.run(lambda tx: claim_next(tx, name))) is not None:
            claimed.append(run)
        return claimed

    results = await asyncio.gather(*(worker(f"w{i}") for i in range(WORKERS)))
    claims = [run for runs in results for run in runs]

    assert len(claims) == TASKS
    assert Counter(run.task_id for run in claims) == Counter(t.id for t in tasks)

    async def final(tx: Transaction) -> tuple[list[Task], list[list[TaskRun]], Job | None]:
        stored = await tx.tasks.list_by_job(job.id)
        return (
            stored,
            [await tx.runs.list_for_task(t.id) for t in stored],
            await tx.jobs.get(job.id),
        )

    stored, histories, shared = await store.run(final)
    assert all(t.status is TaskStatus.RUNNING and t.attempt == 1 for t in stored)
    assert all(
        len(h) == 1 and h[0].id == t.current_run_id for t, h in zip(stored, histories, strict=True)
    )
    assert shared is not None
    assert shared.version == TASKS  # one committed job write per claim, none lost or doubled
    assert store.retries > 0, "contention never reached the retry path"
    assert store.retries == len(reasons)
    assert set(reasons) <= {"40001", "40P01", "concurrent_update"}, reasons


async def test_racing_submissions_with_one_idempotency_key_create_one_job(pg_pool: Pool) -> None:
    store, _ = recording_store(pg_pool, max_retries=50)
    now = await db_now(store)
    outcomes: list[str] = []

    async def submit() -> None:
        job = new_job(now, key="race")

        async def fn(tx: Transaction) -> str:
            if await tx.jobs.get_by_idempotency_key("race") is not None:
                return "replayed"
            await tx.jobs.add(job, [new_task(job, "t", now)], [])
            return "created"

        try:
            outcomes.append(await store.run(fn))
        except DuplicateIdempotencyKey:
            outcomes.append("duplicate")

    await asyncio.gather(*(submit() for _ in range(6)))

    assert outcomes.count("created") == 1, outcomes
    assert len(outcomes) == 6


# --- atomicity --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_edge", ["unknown_task", "self_dependency"])
async def test_a_failing_last_statement_of_job_insert_leaves_nothing(
    pg_store: CockroachStore, bad_edge: str
) -> None:
    now = await db_now(pg_store)
    job = new_job(now, key=f"atomic-{bad_edge}")
    tasks = [new_task(job, n, now) for n in "abc"]
    bad = (tasks[2].id, uuid4()) if bad_edge == "unknown_task" else (tasks[2].id, tasks[2].id)
    edges = [(tasks[1].id, tasks[0].id), bad]  # the edge insert is the last statement
    calls = 0

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.jobs.add(job, tasks, edges)

    with pytest.raises(BackendUnavailable) as caught:
        await pg_store.run(fn)
    assert isinstance(caught.value.__cause__, psycopg.IntegrityError)
    assert calls == 1  # a constraint violation is not retried

    async def leftovers(tx: Transaction) -> tuple[Any, ...]:
        return (
            await tx.jobs.get(job.id),
            await tx.jobs.get_by_idempotency_key(f"atomic-{bad_edge}"),
            await tx.tasks.get_many([t.id for t in tasks]),
            await tx.tasks.dependents(tasks[0].id),
        )

    assert await pg_store.run(leftovers) == (None, None, [], [])


async def test_a_payload_the_database_refuses_is_invalid_payload(pg_store: CockroachStore) -> None:
    now = await db_now(pg_store)
    job = new_job(now)

    async def fn(tx: Transaction) -> None:
        await tx.jobs.add(job, [new_task(job, "t", now, payload={"s": "nul \u0000 inside"})], [])

    with pytest.raises(InvalidPayload):
        await pg_store.run(fn)
    assert not await job_exists(pg_store, job.id)


# --- injected retryable failures -----------------------------------------------------------------


async def test_a_40001_on_the_first_try_reruns_the_function(pg_pool: Pool) -> None:
    store, reasons = recording_store(pg_pool)
    now = await db_now(store)
    calls = 0

    async def fn(tx: Transaction) -> str:
        nonlocal calls
        calls += 1
        await tx.workers.upsert(Worker(f"try-{calls}", None, now))
        if calls == 1:
            raise pg_errors.SerializationFailure("injected: restart transaction")
        return "done"

    assert await store.run(fn) == "done"
    assert (calls, store.retries, reasons) == (2, 1, ["40001"])

    async def workers(tx: Transaction) -> list[str]:
        return [w.id for w in await tx.workers.list_active(now)]

    assert await store.run(workers) == ["try-2"]


async def test_a_40001_at_commit_reruns_the_function_and_applies_once(pg_pool: Pool) -> None:
    store, reasons = recording_store(pg_pool, commit_hook=(hook := Faults()))
    now = await db_now(store)
    job = new_job(now)
    faults = [pg_errors.SerializationFailure("injected at COMMIT")]
    calls = 0

    def fault_on_commit() -> None:
        if faults:
            raise faults.pop()

    hook.at = fault_on_commit

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.jobs.add(job, [new_task(job, "t", now)], [])  # same ids every try

    await store.run(fn)
    assert (calls, reasons) == (2, ["40001"])

    async def count(tx: Transaction) -> int:
        return len(await tx.tasks.list_by_job(job.id))

    assert await store.run(count) == 1


async def test_a_lost_connection_before_commit_reruns_the_function(
    pg_pool: Pool, pg_dsn: str
) -> None:
    """A real one: the server terminates the session in the middle of the function."""
    store, reasons = recording_store(pg_pool)
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        version = admin.execute("SELECT version()").fetchone()
        if version and "CockroachDB" in str(version[0]):
            pytest.skip("pg_terminate_backend is PostgreSQL-only")
        now = await db_now(store)
        job = new_job(now)
        calls = 0

        async def fn(tx: Transaction) -> None:
            nonlocal calls
            calls += 1
            await tx.jobs.add(job, [new_task(job, "t", now)], [])
            if calls == 1:
                assert isinstance(tx, PgTransaction)
                admin.execute("SELECT pg_terminate_backend(%s)", (tx.conn.raw.info.backend_pid,))
            await tx.jobs.get(job.id)

        await store.run(fn)

    assert calls == 2
    assert reasons == ["connection_lost"]
    assert await job_exists(store, job.id)


async def test_retries_are_bounded_then_backend_unavailable(pg_pool: Pool) -> None:
    store, reasons = recording_store(pg_pool, max_retries=3)
    calls = 0

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        raise pg_errors.SerializationFailure("injected: always")

    with pytest.raises(BackendUnavailable, match="4 tries"):
        await store.run(fn)
    assert (calls, store.retries, reasons) == (4, 3, ["40001"] * 3)


# --- ambiguous commits (never re-run) ------------------------------------------------------------


async def test_a_connection_lost_during_commit_is_outcome_unknown(pg_pool: Pool) -> None:
    store, reasons = recording_store(pg_pool, commit_hook=(hook := Faults()))
    now = await db_now(store)
    job = new_job(now)
    calls = 0

    def lost() -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    hook.at = lost

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.jobs.add(job, [new_task(job, "t", now)], [])

    with pytest.raises(CommitOutcomeUnknown):
        await store.run(fn)
    assert (calls, reasons) == (1, [])


async def test_an_ambiguous_commit_that_applied_is_reported_not_rerun(pg_pool: Pool) -> None:
    store, reasons = recording_store(pg_pool, commit_hook=(hook := Faults()))
    now = await db_now(store)
    job = new_job(now)
    calls = 0

    def ack_lost() -> None:
        raise psycopg.OperationalError("connection lost while reading the COMMIT reply")

    hook.after = ack_lost

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.jobs.add(job, [new_task(job, "t", now)], [])

    with pytest.raises(CommitOutcomeUnknown):
        await store.run(fn)
    hook.after = None
    assert (calls, reasons) == (1, [])
    assert await job_exists(store, job.id)  # applied exactly once; the caller re-reads


async def test_sqlstate_40003_is_outcome_unknown(pg_pool: Pool) -> None:
    store, reasons = recording_store(pg_pool)
    calls = 0

    async def fn(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        raise pg_errors.StatementCompletionUnknown("injected: result is ambiguous")

    with pytest.raises(CommitOutcomeUnknown):
        await store.run(fn)
    assert (calls, reasons) == (1, [])


async def test_ping_and_a_closed_pool_report_backend_unavailable(pg_pool: Pool) -> None:
    store = CockroachStore(pg_pool)
    await store.ping()
    await pg_pool.close()

    with pytest.raises(BackendUnavailable):
        await store.ping()
    with pytest.raises(BackendUnavailable):
        await store.run(lambda tx: tx.now())
    assert store.retries == 0
