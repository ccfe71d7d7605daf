"""The requests a store try sends (``txconn.TryConnection``, ``PgTransaction.commit``): the BEGIN
rides with the try's first statement, bound on the client, and the outbox insert with the
COMMIT; the edges of that (nothing sent, a statement that cannot be bound, a failing first
request) leave the connection as a separate BEGIN and COMMIT would."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
from psycopg import AsyncClientCursor
from psycopg.pq import TransactionStatus

from dtq.adapters.cockroach import CockroachStore, sql, txconn
from dtq.adapters.cockroach.arrays import TextArray, UuidArray
from dtq.adapters.cockroach.repositories import PgTransaction, _task_columns, _task_row
from dtq.application.ports import Transaction
from dtq.domain.entities import Task, TaskRun
from dtq.domain.errors import BackendUnavailable, ConcurrentUpdate, InvalidPayload
from dtq.domain.events import NewEvent
from dtq.domain.status import RunStatus, TaskStatus
from tests.integration.test_store_concurrency import new_job, new_task
from tests.integration.wiring import (
    OUTBOX_WITH_COMMIT,
    counting_statements,
    guarded,
    opened_with,
)

pytestmark = pytest.mark.integration

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def label(query: str) -> str:
    return " ".join(query.split())


async def _two_tasks(store: CockroachStore) -> list[Task]:
    job = new_job(_EPOCH)
    tasks = [new_task(job, name, _EPOCH) for name in "ab"]

    async def add(tx: Transaction) -> None:
        await tx.jobs.add(job, tasks, [])

    await store.run(add)
    return tasks


async def test_a_try_that_sends_nothing_opens_no_transaction(pg_store: CockroachStore) -> None:
    async def nothing(tx: Transaction) -> int:
        return 1

    with counting_statements() as sent:
        assert await pg_store.run(nothing) == 1
    assert sent == []


async def test_events_alone_go_with_the_begin_and_the_commit(pg_store: CockroachStore) -> None:
    job_id = uuid4()

    async def only_events(tx: Transaction) -> None:
        tx.events.add_many([NewEvent(job_id, None, "job.submitted", {"status": "pending"})])

    with counting_statements() as sent:
        await pg_store.run(only_events)
    assert sent == [f"{label(sql.BEGIN_WITH_NOW)}; {OUTBOX_WITH_COMMIT}"]

    async def count(tx: Transaction) -> Any:
        assert isinstance(tx, PgTransaction)
        cur = await tx.conn.execute("SELECT count(*) FROM events WHERE job_id = %s", (job_id,))
        return await cur.fetchone()

    assert await pg_store.run(count) == (1,)


async def test_the_first_statement_bound_on_the_client_reads_what_a_prepared_one_reads(
    pg_store: CockroachStore,
) -> None:
    """``GET_TASKS`` takes a binary ``uuid[]`` (``%b``): bound as a text literal with the
    BEGIN, it finds the same rows as the same statement later in the try."""
    ids = UuidArray(t.id for t in await _two_tasks(pg_store))

    async def read_twice(tx: Transaction) -> tuple[list[Any], list[Any]]:
        assert isinstance(tx, PgTransaction)
        first = await (await tx.conn.execute(sql.GET_TASKS, (ids,))).fetchall()
        again = await (await tx.conn.execute(sql.GET_TASKS, (ids,))).fetchall()
        return first, again

    with counting_statements() as sent:
        first, again = await pg_store.run(read_twice)
    assert sent == [opened_with(sql.GET_TASKS), label(sql.GET_TASKS), label(sql.COMMIT)]
    assert len(first) == 2
    assert first == again


async def test_a_first_statement_that_cannot_be_bound_on_the_client_follows_its_own_begin(
    pg_store: CockroachStore,
) -> None:
    async def binary_first(tx: Transaction) -> Any:
        assert isinstance(tx, PgTransaction)
        cur = await tx.conn.execute("SELECT %s::bigint", (7,), binary=True)
        return await cur.fetchone()

    with counting_statements() as sent:
        assert await pg_store.run(binary_first) == (7,)
    assert sent == [label(sql.BEGIN_WITH_NOW), "SELECT %s::bigint", label(sql.COMMIT)]


async def test_a_first_request_that_fails_leaves_the_connection_out_of_any_transaction(
    pg_store: CockroachStore, pg_pool: Any
) -> None:
    """The BEGIN ran, the statement after it failed: the try is rolled back and the pool gets
    its connection back idle (one connection, so the next try gets the same one)."""

    async def divide_by_zero(tx: Transaction) -> None:
        assert isinstance(tx, PgTransaction)
        await tx.conn.execute("SELECT 1 / %s", (0,))

    with pytest.raises(InvalidPayload):
        await pg_store.run(divide_by_zero)
    async with pg_pool.connection() as conn:
        assert conn.info.transaction_status is TransactionStatus.IDLE
    tasks = await _two_tasks(pg_store)

    async def read(tx: Transaction) -> TaskStatus | None:
        task = await tx.tasks.get(tasks[0].id)
        return None if task is None else task.status

    assert await pg_store.run(read) is TaskStatus.QUEUED


async def test_a_literal_percent_sign_stays_literal_when_bound_on_the_client(
    pg_store: CockroachStore,
) -> None:
    """``%%b`` is a percent sign and a ``b``, not a binary placeholder to rebind as text."""

    async def first(tx: Transaction) -> Any:
        assert isinstance(tx, PgTransaction)
        cur = await tx.conn.execute("SELECT '%%b' || %s::text || %b::bigint", ("x", 7))
        return await cur.fetchone()

    with counting_statements() as sent:
        assert await pg_store.run(first) == ("%bx7",)
    assert len(sent) == 2  # bound with the BEGIN, then COMMIT


def _run_of(task_id: UUID) -> TaskRun:
    return TaskRun(uuid4(), task_id, 1, "w", RunStatus.RUNNING, _EPOCH)


async def test_a_queued_insert_goes_with_the_next_statement_which_sees_its_row(
    pg_store: CockroachStore,
) -> None:
    """A lone run insert is queued (``send_later``): the next read goes in the same request,
    after it, and finds the row."""
    run = _run_of((await _two_tasks(pg_store))[0].id)

    async def insert_then_read(tx: Transaction) -> TaskRun | None:
        await tx.runs.add_many([run])
        return await tx.runs.get(run.id)

    with counting_statements() as sent:
        assert await pg_store.run(insert_then_read) == run
    insert_and_read = f"{label(sql.INSERT_RUN)}; {label(sql.GET_RUN)}"
    assert sent == [opened_with(insert_and_read), label(sql.COMMIT)]


async def test_a_queued_insert_that_fails_stops_its_request_before_the_commit(
    pg_store: CockroachStore,
) -> None:
    """The run of a task that does not exist breaks its foreign key at the COMMIT's request:
    the error surfaces, the COMMIT after it never runs, nothing of the try is written."""
    task = (await _two_tasks(pg_store))[0]
    written, orphan = _run_of(task.id), _run_of(uuid4())

    async def insert_both(tx: Transaction) -> None:
        await tx.runs.add_many([written])
        await tx.runs.add_many([orphan])

    with pytest.raises(BackendUnavailable, match="foreign key"):
        await pg_store.run(insert_both)

    async def read(tx: Transaction) -> TaskRun | None:
        return await tx.runs.get(written.id)

    assert await pg_store.run(read) is None


async def test_the_write_of_a_task_read_in_the_try_rides_with_the_next_statement(
    pg_store: CockroachStore,
) -> None:
    """A compare-and-set of a row the try read at that version is queued (it cannot miss
    under SERIALIZABLE): it goes ahead of the next read, which sees it."""
    task = (await _two_tasks(pg_store))[0]

    async def claim_then_read(tx: Transaction) -> Task | None:
        read = await tx.tasks.get(task.id)
        assert read is not None
        read.claim(run_id=uuid4(), worker_id="w", at=await tx.now())
        await tx.tasks.save(read)
        assert read.version == 1  # bumped at once, as an immediate write would
        return await tx.tasks.get(task.id)

    with counting_statements() as sent:
        again = await pg_store.run(claim_then_read)
    assert again is not None and again.status is TaskStatus.RUNNING and again.version == 1
    assert sent == [
        opened_with(sql.GET_TASK),
        f"{guarded(sql.UPDATE_TASK)}; {label(sql.GET_TASK)}",
        OUTBOX_WITH_COMMIT,  # the claim's task.running event
    ]


async def test_a_queued_write_that_matches_no_row_fails_its_try_and_writes_nothing(
    pg_pool: Any,
) -> None:
    """If a queued compare-and-set ever matched no row (here the try itself moved the row's
    version behind the repository's back), its request raises ``ConcurrentUpdate`` (the store
    re-runs the try), the COMMIT after it never runs, and nothing of the try is kept."""
    store = CockroachStore(pg_pool, max_retries=1, base_backoff=0.001)
    task = (await _two_tasks(store))[0]
    tries = 0

    async def claim_a_moved_row(tx: Transaction) -> None:
        nonlocal tries
        tries += 1
        assert isinstance(tx, PgTransaction)
        read = await tx.tasks.get(task.id)
        assert read is not None
        await tx.conn.execute("UPDATE tasks SET version = version + 1 WHERE id = %s", (task.id,))
        read.claim(run_id=uuid4(), worker_id="w", at=await tx.now())
        await tx.tasks.save(read)  # queued: compares version 0, now 1 in this transaction

    with pytest.raises(BackendUnavailable, match="concurrent_update") as raised:
        await store.run(claim_a_moved_row)
    cause = raised.value.__cause__
    assert isinstance(cause, ConcurrentUpdate) and str(task.id) in str(cause)
    assert tries == 2  # re-run once (max_retries=1), as for an immediate write's miss

    async def read(tx: Transaction) -> Task | None:
        return await tx.tasks.get(task.id)

    stored = await store.run(read)
    assert stored is not None and stored.status is TaskStatus.QUEUED and stored.version == 0
    async with pg_pool.connection() as conn:
        assert conn.info.transaction_status is TransactionStatus.IDLE


async def test_the_run_of_a_task_written_in_the_try_is_queued_and_its_guard_still_holds(
    pg_pool: Any,
) -> None:
    """A run whose task the try wrote is written with the next request (a run only ends with a
    write to its task); if its ``running`` guard ever missed (here the try ended the run behind
    the repository's back), the try fails with ``ConcurrentUpdate`` and writes nothing."""
    store = CockroachStore(pg_pool, max_retries=0, base_backoff=0.001)
    task = (await _two_tasks(store))[0]
    run = _run_of(task.id)

    async def start(tx: Transaction) -> None:
        read = await tx.tasks.get(task.id)
        assert read is not None
        read.claim(run_id=run.id, worker_id="w", at=await tx.now())
        await tx.tasks.save(read)
        await tx.runs.add_many([run])

    await store.run(start)

    async def finish(tx: Transaction, *, end_it_first: bool) -> None:
        assert isinstance(tx, PgTransaction)
        read = await tx.tasks.get(task.id)
        stored = await tx.runs.get(run.id)
        assert read is not None and stored is not None
        if end_it_first:
            await tx.conn.execute("UPDATE task_runs SET status = 'dead' WHERE id = %s", (run.id,))
        now = await tx.now()
        read.succeed(stored, at=now, result={"ok": True})
        await tx.tasks.save(read)
        await tx.runs.save(stored)

    with pytest.raises(BackendUnavailable) as raised:
        await store.run(lambda tx: finish(tx, end_it_first=True))
    assert isinstance(raised.value.__cause__, ConcurrentUpdate)
    assert str(run.id) in str(raised.value.__cause__)

    with counting_statements() as sent:
        await store.run(lambda tx: finish(tx, end_it_first=False))
    writes = f"{guarded(sql.UPDATE_TASK)}; {guarded(sql.UPDATE_RUN)}"
    assert sent[-1] == f"{writes}; {OUTBOX_WITH_COMMIT}"  # both ride with the COMMIT
    stored = await store.run(lambda tx: tx.runs.get(run.id))
    assert stored is not None and stored.status is RunStatus.SUCCEEDED


def _job_of(tasks: int = 2, *, key: str | None = None) -> tuple[Any, list[Task], Any]:
    job = new_job(_EPOCH, key=key)
    made = [new_task(job, f"t{i}", _EPOCH) for i in range(tasks)]
    return job, made, [(made[1].id, made[0].id)] if tasks > 1 else []


async def test_a_keyless_job_with_edges_is_one_request_with_its_commit(
    pg_store: CockroachStore,
) -> None:
    """A keyless job of a few tasks and an edge: its job, tasks and edges inserts ride with the
    outbox insert and the COMMIT (three requests before: the tasks and the edges waited)."""
    job, tasks, edges = _job_of(3)

    async def add(tx: Transaction) -> None:
        await tx.jobs.add(job, tasks, edges)

    with counting_statements() as sent:
        await pg_store.run(add)
    inserts = "; ".join(label(q) for q in (sql.INSERT_JOB, sql.INSERT_TASKS, sql.INSERT_EDGES))
    assert sent == [opened_with(f"{inserts}; {OUTBOX_WITH_COMMIT}")]


async def test_a_group_of_keyless_jobs_is_one_request_with_its_commit(
    pg_store: CockroachStore,
) -> None:
    """``add_many`` of keyless jobs (every ``POST /v1/tasks`` group): the jobs' insert is not
    read, so jobs, tasks and edges go with the COMMIT, and every row reads back."""
    jobs = [_job_of(2), _job_of(1), _job_of(1)]

    async def add(tx: Transaction) -> None:
        await tx.jobs.add_many(jobs)

    with counting_statements() as sent:
        await pg_store.run(add)
    inserts = "; ".join(
        label(q) for q in (sql.INSERT_JOBS, sql.INSERT_TASKS_OF_JOBS, sql.INSERT_EDGES)
    )
    assert sent == [opened_with(f"{inserts}; {OUTBOX_WITH_COMMIT}")]

    async def read(tx: Transaction) -> list[list[UUID]]:
        return [[t.id for t in await tx.tasks.list_by_job(job.id)] for job, _, _ in jobs]

    assert await pg_store.run(read) == [[t.id for t in tasks] for _, tasks, _ in jobs]


async def test_a_group_with_a_key_reads_its_jobs_insert_before_the_rest(
    pg_store: CockroachStore,
) -> None:
    """A key may make ``ON CONFLICT`` skip a job: the jobs' insert is read at once."""
    jobs = [_job_of(1), _job_of(1, key=f"k-{uuid4()}")]

    async def add(tx: Transaction) -> None:
        await tx.jobs.add_many(jobs)

    with counting_statements() as sent:
        await pg_store.run(add)
    rest = f"{label(sql.INSERT_TASKS_OF_JOBS)}; {OUTBOX_WITH_COMMIT}"
    assert sent == [opened_with(sql.INSERT_JOBS), rest]


async def test_a_group_whose_deferred_insert_fails_writes_nothing(
    pg_store: CockroachStore,
) -> None:
    """Two jobs of the group share a task id: the tasks' insert fails in the COMMIT's request,
    the COMMIT never runs, and neither job is written."""
    first, second = _job_of(1), _job_of(1)
    second[1][0] = new_task(second[0], "t0", _EPOCH, id=first[1][0].id)

    async def add(tx: Transaction) -> None:
        await tx.jobs.add_many([first, second])

    with pytest.raises(BackendUnavailable, match="duplicate key"):
        await pg_store.run(add)

    async def read(tx: Transaction) -> list[Any]:
        return [await tx.jobs.get(job.id) for job in (first[0], second[0])]

    assert await pg_store.run(read) == [None, None]


_TRICKY = ['a"b', "c\\d", "it's", "", "null", " sp ", '{"k": "v\\"w"}', None]


async def test_a_statement_bound_by_dtq_is_the_text_psycopg_mogrify_writes(
    pg_pool: Any,
) -> None:
    """``bind_on_client``'s own binding (no prepared name yet) against psycopg's ``mogrify``
    of the same statement: the submit's inserts with quotes, backslashes, NULLs and a
    negative number (the transformer's literal), and a literal ``%%``."""
    job = new_job(_EPOCH)
    tasks = [new_task(job, "t", _EPOCH, payload={"s": text}) for text in _TRICKY]
    cases: list[tuple[str, Any]] = [
        (sql.INSERT_TASK, _task_row(job.id, tasks[0])),
        (sql.INSERT_TASKS_OF_JOBS, _task_columns([_task_row(job.id, t) for t in tasks])),
        ("SELECT %s::text[], %s, %s, '%%'", (TextArray(_TRICKY), -3, "x'y\\z")),
    ]
    async with pg_pool.connection() as conn:
        for query, params in cases:
            expected = AsyncClientCursor(conn).mogrify(query.replace("%b", "%s"), params)
            assert txconn._bound_fast(conn, txconn.ClientStatements(), query, params) == expected


async def test_a_group_of_payloads_full_of_quotes_is_bound_without_psycopg_s_dumpers(
    pg_store: CockroachStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg's array dumper escapes per character in Python (seconds for a group of large
    payloads of quotes, the event loop blocked throughout); the submit's inserts never reach
    it, and the payloads read back as written."""

    def no_mogrify(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("bound by psycopg's mogrify")

    monkeypatch.setattr(AsyncClientCursor, "mogrify", no_mogrify)
    jobs = [_job_of(1) for _ in range(4)]
    for job, tasks, _ in jobs:
        tasks[0] = new_task(job, "t0", _EPOCH, payload={"q": '"\\' * 500})

    async def add(tx: Transaction) -> None:
        await tx.jobs.add_many(jobs)

    await pg_store.run(add)

    async def read(tx: Transaction) -> list[Any]:
        return [(await tx.tasks.list_by_job(job.id))[0].payload for job, _, _ in jobs]

    assert await pg_store.run(read) == [{"q": '"\\' * 500}] * 4


async def test_a_database_error_reaches_the_caller_as_one_line_without_the_sql(
    pg_store: CockroachStore,
) -> None:
    """An error the store does not retry (here PostgreSQL's ``out of shared memory``, raised
    with its hint from inside a function so that it carries a CONTEXT naming the SQL) becomes
    a BackendUnavailable whose text (what the API answers in its 503 body) is the SQLSTATE,
    the message and the hint on one line: no SQL statement, no CONTEXT."""

    async def failing(tx: Transaction) -> None:
        assert isinstance(tx, PgTransaction)
        await tx.conn.execute(
            "DO $$ BEGIN PERFORM 1 FROM tasks WHERE id IS NULL;"
            " RAISE EXCEPTION 'out of shared memory' USING ERRCODE = '53200',"
            " HINT = 'You might need to increase max_pred_locks_per_transaction.'; END $$"
        )

    with pytest.raises(BackendUnavailable) as raised:
        await pg_store.run(failing)
    text = str(raised.value)
    assert text == (
        "database error (53200): out of shared memory"
        " (hint: You might need to increase max_pred_locks_per_transaction.)"
    )
    assert "\n" not in text and "CONTEXT" not in text and "PL/pgSQL" not in text
