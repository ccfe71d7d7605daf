"""Repositories over one psycopg transaction, and ``PgTransaction`` (ports ``Transaction`` & co).

Each repository method issues the statements named in ``sql.py`` on the transaction's
connection. psycopg errors are not caught here: they travel up to ``CockroachStore.run``, which
decides between re-running the transaction and raising a domain error. The domain errors raised
here are ``ConcurrentUpdate`` (a version- or status-guarded write matched no row; the store
re-runs the function), ``DuplicateIdempotencyKey`` and ``InvalidPayload``.

Every batch method issues one statement whatever the batch size (parallel typed arrays through
``unnest`` or ``= ANY``), and none for an empty batch. The single-row writes keep their own
plain statements, cheaper than a one-row batch statement (ARCHITECTURE.md, "Figures behind the
hot-path choices"), so a batch method given one row uses the single-row statement (same guards,
same errors): an idle worker's claim and report are one-row batches.

This module is over 400 lines on purpose: the repositories share one connection, one row-mapping
table and the transaction clock, and splitting them per entity would scatter that state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach import listing_sql, sql
from dtq.adapters.cockroach.arrays import Int8Array, TextArray, TimestamptzArray, UuidArray
from dtq.adapters.cockroach.events import PgEventRepository
from dtq.adapters.cockroach.retention import PgRetentionRepository
from dtq.adapters.cockroach.rows import (
    decode_json,
    encode_json,
    job_from_row,
    run_from_row,
    task_from_row,
    token_from_row,
    worker_from_row,
)
from dtq.adapters.cockroach.sessions import PgSessionRepository
from dtq.adapters.cockroach.txconn import Conn, TryConnection
from dtq.adapters.cockroach.webhooks import PgWebhookRepository
from dtq.application.filters import JobFilter, JobKeyset, TaskFilter, TaskKeyset
from dtq.application.ports import DueTask, RunningTask
from dtq.domain.entities import Job, Task, TaskRun, Worker
from dtq.domain.errors import ConcurrentUpdate, DuplicateIdempotencyKey
from dtq.domain.events import created_events, job_events, task_events
from dtq.domain.status import RunStatus, TaskStatus
from dtq.domain.tokens import ApiToken, TokenNameTaken

#: Where the job's columns start in a ``sql.GET_TASKS_WITH_JOBS`` row (after the task's).
_JOB_COLUMNS = 23


def _for_ids(many: str, one: str, ids: Sequence[UUID]) -> tuple[str, tuple[Any, ...]]:
    """The statement and parameters for reading by ``ids``: ``one`` (its ``= %s`` form,
    ``sql._by_equality``) for a single id, whose generic plan PostgreSQL caches, else ``many``
    with the ids as one array."""
    if len(ids) == 1:
        return one, (ids[0],)
    return many, (UuidArray(ids),)


class _Versions:
    """The version at which this try last read or wrote each task and job row, by id, and
    the tasks it has written.

    A compare-and-set of such a row at that version cannot miss under SERIALIZABLE: a
    concurrent write to the row fails this try with 40001 (PostgreSQL at the write, CockroachDB
    at the latest at COMMIT). Nor can the ``running`` guard of a run whose task this try wrote:
    a run only ends together with a write to its task, which that compare-and-set excluded. So
    ``save`` queues those writes (``TryConnection.send_guarded``) to ride with the try's next
    request instead of waiting for their row count.
    """

    __slots__ = ("jobs", "tasks", "written")

    def __init__(self) -> None:
        self.jobs: dict[UUID, int] = {}
        self.tasks: dict[UUID, int] = {}
        self.written: set[UUID] = set()  # tasks whose compare-and-set passed or is queued

    def wrote_task(self, task: Task) -> None:
        """Record a task written at ``task.version`` (already bumped)."""
        self.tasks[task.id] = task.version
        self.written.add(task.id)

    def read_jobs(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.jobs[job.id] = job.version

    def read_tasks(self, tasks: Sequence[Task]) -> None:
        for task in tasks:
            self.tasks[task.id] = task.version


class _TxClock:
    """The transaction timestamp of one try, read at most once.

    A store try learns it from its BEGIN request (``txconn.TryConnection`` hands it to
    :meth:`know`); only a transaction opened otherwise sends ``SELECT now()``.
    """

    def __init__(self, conn: TryConnection) -> None:
        self._conn = conn
        self._now: datetime | None = None

    def know(self, now: datetime) -> None:
        """Take ``now`` (the transaction timestamp, read with ``BEGIN``) as this try's time,
        unless the try took an estimate already (:meth:`write_time`)."""
        if self._now is None:
            self._now = now.astimezone(UTC)

    async def write_time(self, not_before: datetime | None = None) -> datetime:
        """The try's time, estimated without a round trip when its BEGIN has not gone yet
        (``TryConnection.estimate_now``, raised to ``not_before``; then it is also what
        :meth:`now` returns), else read."""
        if self._now is None:
            estimate = self._conn.estimate_now(not_before)
            if estimate is not None:
                self._now = estimate
                return estimate
        return await self.now()

    async def now(self) -> datetime:
        """The transaction timestamp (aware UTC), from the BEGIN (sent now if still owed)."""
        if self._now is None:
            await self._conn.flush()  # an unsent BEGIN brings it (:meth:`know`)
        if self._now is None:
            row = await (await self._conn.execute(sql.NOW)).fetchone()
            assert row is not None
            self._now = row[0].astimezone(UTC)
        return self._now


def _distinct_ids(kind: str, ids: Sequence[UUID]) -> None:
    """Refuse a batch naming one row twice (it would be written once and look stale).

    Raises:
        ValueError: some id appears more than once (a caller bug, not a conflict).
    """
    if len(set(ids)) != len(ids):
        raise ValueError(f"{kind} batch names the same id more than once")


def _check_all_written(kind: str, sent: Sequence[UUID], written: list[TupleRow]) -> None:
    """Raise ``ConcurrentUpdate`` unless a guarded batch write returned every row it was sent.

    The batch statements write all rows or none, so a short result means none were written.
    """
    if len(written) != len(sent):
        raise ConcurrentUpdate(
            f"{kind} batch of {len(sent)} refused: some row changed since it was read or is gone"
        )


async def _write_one(
    conn: TryConnection, query: str, params: tuple[Any, ...], *, queue: bool, what: str
) -> None:
    """One single-row compare-and-set of ``what`` (``"task <id>"``): queued with the try's next
    request when ``queue`` says it cannot miss (``_Versions``, ``TryConnection.send_guarded``),
    else sent now and its row count checked.

    Raises:
        ConcurrentUpdate: the guard matched no row (for a queued write, from the request that
            carries it).
    """
    if queue and conn.send_guarded(query, params, what):
        return
    cur = await conn.execute(query, params)
    if cur.rowcount != 1:
        raise ConcurrentUpdate(f"{what} changed since it was read, or is gone")


_Row = TypeVar("_Row", Job, Task, TaskRun)


async def _write_guarded(
    conn: Conn,
    kind: str,
    rows: Sequence[_Row],
    *,
    single: Callable[[_Row], Awaitable[None]],
    statement: str,
    params: Callable[[list[UUID]], tuple[Any, ...]],
) -> bool:
    """One guarded batch write (compare-and-set per row, all or nothing), shared by the
    ``save_many`` methods.

    No statement for no rows; the single-row statement ``single`` for one row (cheaper, same
    guard and errors, see the module docstring); else ``statement`` with ``params(ids)``.

    Returns:
        True when the batch statement wrote every row (the caller bumps what ``single`` would
        have); False when there was nothing to write or ``single`` did it.

    Raises:
        ConcurrentUpdate: a row was stale or gone; nothing was written.
        ValueError: two rows share an id.
    """
    if not rows:
        return False
    if len(rows) == 1:
        await single(rows[0])
        return False
    ids = [row.id for row in rows]
    _distinct_ids(kind, ids)
    cur = await conn.execute(statement, params(ids))
    _check_all_written(kind, ids, await cur.fetchall())
    return True


def _bool_text(value: bool | None) -> str | None:
    """A boolean as the text ``INSERT_JOBS`` casts to ``bool`` (its arrays are typed ones)."""
    return None if value is None else ("true" if value else "false")


def _job_row(job: Job) -> tuple[Any, ...]:
    """Parameters of ``sql.INSERT_JOB`` (and of ``sql.CONFIRM_JOB``, in the same order)."""
    return (
        job.id,
        job.name,
        job.status.value,
        encode_json(job.metadata),
        job.idempotency_key,
        job.request_hash,
        job.version,
        job.created_at,
        job.updated_at,
        job.trace_context,
        job.has_dependencies,
        job.task_count,
    )


# --- repositories -----------------------------------------------------------------------------


class PgJobRepository:
    """``JobRepository`` on one transaction; buffers the events of what it writes."""

    def __init__(self, conn: TryConnection, events: PgEventRepository, versions: _Versions) -> None:
        self._conn = conn
        self._events = events
        self._versions = versions

    async def add(
        self, job: Job, tasks: Sequence[Task], edges: Sequence[tuple[UUID, UUID]]
    ) -> None:
        """Insert the job, its tasks and edges in at most three statements (spec §4).

        A job without an idempotency key, its tasks and its edges are plain inserts whose
        answer nobody reads: they ride with the try's next request
        (``TryConnection.send_later``), so a keyless submission's inserts go with its COMMIT.
        A keyed job's insert is read at once (its ``ON CONFLICT`` may skip it).

        Raises:
            DuplicateIdempotencyKey: another job already holds ``job.idempotency_key``.
            InvalidPayload: metadata or a payload is not JSON-encodable.
        """
        row = _job_row(job)
        if job.idempotency_key is None:
            await self._conn.send_later(sql.INSERT_JOB, row)  # no key, no conflict to skip it
        elif await (await self._conn.execute(sql.INSERT_JOB, row)).fetchone() is None:
            raise DuplicateIdempotencyKey(
                f"a job with Idempotency-Key {job.idempotency_key!r} already exists"
            )
        if len(tasks) == 1:
            await self._conn.send_later(sql.INSERT_TASK, _task_row(job.id, tasks[0]))
        elif tasks:
            await self._conn.send_later(sql.INSERT_TASKS, _task_arrays(job.id, tasks))
        if edges:
            await self._conn.send_later(sql.INSERT_EDGES, _edge_columns(edges))
        self._events.add_many(created_events(job, tasks))

    async def add_many(
        self, jobs: Sequence[tuple[Job, Sequence[Task], Sequence[tuple[UUID, UUID]]]]
    ) -> None:
        """Insert several jobs with their tasks and edges in at most three statements, and
        buffer their created events (written with the transaction's one outbox insert).

        As in :meth:`add`, inserts nobody reads ride with the try's next request: the tasks'
        and edges' always, the jobs' when none of them has an idempotency key, so a group of
        keyless submissions is one request with its COMMIT.

        Raises:
            DuplicateIdempotencyKey: another job already holds the key of one of ``jobs``
                (the caller's transaction must then be abandoned).
            InvalidPayload: metadata or a payload is not JSON-encodable.
        """
        if len(jobs) == 1:
            await self.add(*jobs[0])
            return
        if not jobs:
            return
        columns = (
            UuidArray([j.id for j, _, _ in jobs]),
            TextArray([j.name for j, _, _ in jobs]),
            TextArray([j.status.value for j, _, _ in jobs]),
            TextArray([encode_json(j.metadata) for j, _, _ in jobs]),
            TextArray([j.idempotency_key for j, _, _ in jobs]),
            TextArray([j.request_hash for j, _, _ in jobs]),
            Int8Array([j.version for j, _, _ in jobs]),
            TimestamptzArray([j.created_at for j, _, _ in jobs]),
            TimestamptzArray([j.updated_at for j, _, _ in jobs]),
            TextArray([j.trace_context for j, _, _ in jobs]),
            TextArray([_bool_text(j.has_dependencies) for j, _, _ in jobs]),
            Int8Array([j.task_count for j, _, _ in jobs]),
        )
        if any(j.idempotency_key is not None for j, _, _ in jobs):
            cur = await self._conn.execute(sql.INSERT_JOBS, columns)
            if len(await cur.fetchall()) != len(jobs):
                raise DuplicateIdempotencyKey("a job of the group has an Idempotency-Key in use")
        else:  # no key, no conflict to skip a row: nobody reads the answer
            await self._conn.send_later(sql.INSERT_JOBS, columns)
        rows = [_task_row(job.id, t) for job, tasks, _ in jobs for t in tasks]
        if rows:
            await self._conn.send_later(sql.INSERT_TASKS_OF_JOBS, _task_columns(rows))
        edges = [e for _, _, job_edges in jobs for e in job_edges]
        if edges:
            await self._conn.send_later(sql.INSERT_EDGES, _edge_columns(edges))
        for job, tasks, _ in jobs:
            self._events.add_many(created_events(job, tasks))

    async def get(self, job_id: UUID) -> Job | None:
        """The job, or None for an unknown id."""
        row = await (await self._conn.execute(sql.GET_JOB, (job_id,))).fetchone()
        return None if row is None else self._read(job_from_row(row))

    def _read(self, job: Job) -> Job:
        self._versions.jobs[job.id] = job.version
        return job

    async def get_finished(
        self, job_ids: Sequence[UUID], unfinished: Sequence[TaskStatus]
    ) -> list[tuple[Job, bool, bool]]:
        """See the port: one statement (``sql.GET_FINISHED_JOBS``)."""
        if not job_ids:
            return []
        cur = await self._conn.execute(
            sql.GET_FINISHED_JOBS,
            (
                TaskStatus.FAILED.value,
                TaskStatus.CANCELLED.value,
                UuidArray(dict.fromkeys(job_ids)),
                TextArray([TaskStatus(s).value for s in unfinished]),
            ),
        )
        return [
            (self._read(job_from_row(row)), bool(row[12]), bool(row[13]))
            for row in await cur.fetchall()
        ]

    async def get_by_idempotency_key(self, key: str) -> Job | None:
        """The job created under ``key``, or None."""
        row = await (await self._conn.execute(sql.GET_JOB_BY_KEY, (key,))).fetchone()
        return None if row is None else self._read(job_from_row(row))

    async def get_many(self, job_ids: Sequence[UUID]) -> list[Job]:
        """The known jobs among ``job_ids``, in no set order (one statement)."""
        if not job_ids:
            return []
        cur = await self._conn.execute(sql.GET_JOBS, (UuidArray(job_ids),))
        jobs = [job_from_row(row) for row in await cur.fetchall()]
        self._versions.read_jobs(jobs)
        return jobs

    def confirm(self, job: Job) -> None:
        """Take ``job``, a row this try did not read (a claim's ``CarriedTask``), as read at
        ``job.version``: the request that carries the try's next statements first checks that
        the stored row is exactly ``job`` (``sql.CONFIRM_JOB``), no round trip of its own.

        Raises:
            ConcurrentUpdate: from that request, when the row differs or is gone (nothing
                after the check ran).
        """
        if not self._conn.send_check(sql.CONFIRM_JOB, _job_row(job), f"job {job.id}"):
            raise ConcurrentUpdate(f"job {job.id} could not be checked without a read")
        self._versions.read_jobs([job])

    async def save(self, job: Job) -> None:
        """Compare-and-set on ``version``; bumps ``job.version`` on success.

        A job this try read at ``job.version`` is written with the try's next request
        (``_Versions``), the others at once.

        Raises:
            ConcurrentUpdate: the stored row no longer has ``job.version`` (or is gone); for a
                queued write, from the request that carries it.
            InvalidPayload: the metadata is not JSON-encodable.
        """
        params = (
            job.name,
            job.status.value,
            encode_json(job.metadata),
            job.updated_at,
            job.id,
            job.version,
        )
        known = self._versions.jobs.get(job.id) == job.version
        await _write_one(self._conn, sql.UPDATE_JOB, params, queue=known, what=f"job {job.id}")
        job.version += 1
        self._versions.jobs[job.id] = job.version
        self._events.add_many(job_events(job))
        job.transitions = ()

    async def save_many(self, jobs: Sequence[Job]) -> None:
        """Compare-and-set of every job on its ``version`` in one statement; all or nothing.

        On success each job's ``version`` is bumped in memory.

        Raises:
            ConcurrentUpdate: some stored row no longer has the job's version (or is gone);
                no row of the batch was written.
            ValueError: two jobs share an id.
            InvalidPayload: some metadata is not JSON-encodable.
        """
        written = await _write_guarded(
            self._conn,
            "job",
            jobs,
            single=self.save,
            statement=sql.UPDATE_JOBS,
            params=lambda ids: (
                ids,
                [Int8(j.version) for j in jobs],
                [j.name for j in jobs],
                [j.status.value for j in jobs],
                [encode_json(j.metadata) for j in jobs],
                [j.updated_at for j in jobs],
            ),
        )
        if written:
            for job in jobs:
                job.version += 1
                self._versions.jobs[job.id] = job.version
                self._events.add_many(job_events(job))
                job.transitions = ()

    async def list_page(
        self, where: JobFilter, *, after: JobKeyset | None, limit: int
    ) -> list[Job]:
        """Matching jobs newest first after the keyset."""
        query, params = listing_sql.job_page(where, after, limit)
        cur = await self._conn.execute(query, params)
        return [job_from_row(row) for row in await cur.fetchall()]


def _task_row(job_id: UUID, t: Task) -> tuple[Any, ...]:
    """Parameters of ``sql.INSERT_TASK``: one task's columns (id, job id, then the rest in
    ``INSERT_TASKS``'s order).

    Integers are wrapped in ``Int8`` so they travel as ``int8`` (psycopg would pick ``int2`` for
    small ones), in the arrays of :func:`_task_arrays` too, leaving the casts no work.
    """
    return (
        t.id,
        job_id,
        t.name,
        t.kind,
        encode_json(t.payload),
        t.status.value,
        t.scheduled_at,
        t.created_at,
        t.updated_at,
        t.priority,
        Int8(t.max_attempts),
        Int8(t.attempt),
        Int8(t.reclaims),
        t.started_at,
        t.finished_at,
        t.last_error,
        t.current_run_id,
        Int8(t.version),
        Int8(t.position),
        encode_json(t.result),
        encode_json(t.progress),
        None if t.retry_policy is None else encode_json(t.retry_policy.to_json()),
        None if t.timeout is None else Int8(round(t.timeout.total_seconds() * 1000)),
    )


#: The typed array (``arrays.py``) of each column of :func:`_task_row`, in its order.
_TASK_ROW_ARRAYS: tuple[type[list[Any]], ...] = (
    UuidArray,  # id
    UuidArray,  # job_id
    TextArray,  # name
    TextArray,  # kind
    TextArray,  # payload
    TextArray,  # status
    TimestamptzArray,  # scheduled_at
    TimestamptzArray,  # created_at
    TimestamptzArray,  # updated_at
    TextArray,  # priority
    Int8Array,  # max_attempts
    Int8Array,  # attempt
    Int8Array,  # reclaims
    TimestamptzArray,  # started_at
    TimestamptzArray,  # finished_at
    TextArray,  # last_error
    UuidArray,  # current_run_id
    Int8Array,  # version
    Int8Array,  # job_position
    TextArray,  # result
    TextArray,  # progress
    TextArray,  # retry_policy
    Int8Array,  # timeout_ms
)


def _task_columns(rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """The rows of :func:`_task_row` as one typed array per column (``INSERT_TASKS_OF_JOBS``):
    no element type for psycopg to discover per list, the fixed-size ones packed at once."""
    columns = zip(*rows, strict=True)
    return [array(column) for array, column in zip(_TASK_ROW_ARRAYS, columns, strict=True)]


def _edge_columns(edges: Sequence[tuple[UUID, UUID]]) -> tuple[list[UUID], list[UUID]]:
    """Parameters of ``sql.INSERT_EDGES``: the dependents' ids, then their dependencies'."""
    return [e[0] for e in edges], [e[1] for e in edges]


def _task_arrays(job_id: UUID, tasks: Sequence[Task]) -> tuple[Any, ...]:
    """Parameters of ``sql.INSERT_TASKS`` (two tasks or more): the job id, then one typed
    array per column of :func:`_task_row` but the job id."""
    columns = _task_columns([_task_row(job_id, t) for t in tasks])
    return (job_id, columns[0], *columns[2:])


def _status(t: Task) -> str:
    return t.status.value


def _result(t: Task) -> str | None:
    return encode_json(t.result)


def _progress(t: Task) -> str | None:
    return encode_json(t.progress)


#: The mutable columns of a task, in the order ``UPDATE_TASK`` and ``UPDATE_TASKS`` write them
#: (after the id and version that guard the write): how to read each from a task, and the
#: typed array that carries it in the batch statement.
_TASK_CHANGES: tuple[tuple[Callable[[Task], Any], type[list[Any]]], ...] = (
    (_status, TextArray),
    (attrgetter("scheduled_at"), TimestamptzArray),
    (attrgetter("updated_at"), TimestamptzArray),
    (attrgetter("priority"), TextArray),
    (attrgetter("max_attempts"), Int8Array),
    (attrgetter("attempt"), Int8Array),
    (attrgetter("reclaims"), Int8Array),
    (attrgetter("started_at"), TimestamptzArray),
    (attrgetter("finished_at"), TimestamptzArray),
    (attrgetter("last_error"), TextArray),
    (attrgetter("current_run_id"), UuidArray),
    (_result, TextArray),
    (_progress, TextArray),
)


def _task_changes(t: Task) -> tuple[Any, ...]:
    """The parameters of ``UPDATE_TASK`` after the id and version, from :data:`_TASK_CHANGES`
    (integers as ``Int8``)."""
    return tuple(Int8(get(t)) if array is Int8Array else get(t) for get, array in _TASK_CHANGES)


def _task_change_arrays(tasks: Sequence[Task]) -> tuple[Any, ...]:
    """The same columns for many tasks, one typed array each (``UPDATE_TASKS``)."""
    return tuple(array(map(get, tasks)) for get, array in _TASK_CHANGES)


class PgTaskRepository:
    """``TaskRepository`` on one transaction."""

    def __init__(self, conn: TryConnection, events: PgEventRepository, versions: _Versions) -> None:
        self._conn = conn
        self._events = events
        self._versions = versions

    async def get(self, task_id: UUID) -> Task | None:
        """The task, or None for an unknown id."""
        row = await (await self._conn.execute(sql.GET_TASK, (task_id,))).fetchone()
        if row is None:
            return None
        task = task_from_row(row)
        self._versions.tasks[task.id] = task.version
        return task

    async def get_many(self, task_ids: Sequence[UUID], *, for_update: bool = False) -> list[Task]:
        """The known tasks among ``task_ids``, in no set order (one statement; with
        ``for_update`` the rows are locked, ``sql.GET_TASKS_FOR_UPDATE``)."""
        if not task_ids:
            return []
        statement = sql.GET_TASKS_FOR_UPDATE if for_update else sql.GET_TASKS
        cur = await self._conn.execute(statement, (UuidArray(task_ids),))
        tasks = [task_from_row(row) for row in await cur.fetchall()]
        self._versions.read_tasks(tasks)
        return tasks

    async def get_many_with_jobs(self, task_ids: Sequence[UUID]) -> tuple[list[Task], list[Job]]:
        """``get_many`` and the jobs of the tasks found, each job once, in one statement
        (``sql.GET_TASKS_WITH_JOBS``; ``sql.GET_TASK_WITH_JOB`` for one id)."""
        if not task_ids:
            return [], []
        cur = await self._conn.execute(
            *_for_ids(sql.GET_TASKS_WITH_JOBS, sql.GET_TASK_WITH_JOB, task_ids)
        )
        rows = await cur.fetchall()
        if not rows:
            return [], []
        jobs: dict[UUID, Job] = {}
        for row in rows:
            if row[_JOB_COLUMNS] not in jobs:  # tasks of one job decode it once
                jobs[row[_JOB_COLUMNS]] = job_from_row(row[_JOB_COLUMNS:])
        tasks = [task_from_row(row) for row in rows]
        self._versions.read_tasks(tasks)
        self._versions.read_jobs(list(jobs.values()))
        return tasks, list(jobs.values())

    async def list_by_job(self, job_id: UUID) -> list[Task]:
        """Every task of the job, ordered by ``created_at``, ``name`` (then id)."""
        cur = await self._conn.execute(sql.LIST_TASKS_BY_JOB, (job_id,))
        tasks = [task_from_row(row) for row in await cur.fetchall()]
        self._versions.read_tasks(tasks)
        return tasks

    def confirm(self, task: Task) -> None:
        """Take ``task``, a row this try did not read (a claim's ``CarriedTask``, its payload
        not carried), as read at ``task.version``: the request that carries the try's next
        statements first checks that the stored row is exactly ``task``, every column but
        the payload (``sql.CONFIRM_TASK``), and brings the stored payload, set on
        ``task.payload`` when that request returns; no round trip of its own.

        Raises:
            ConcurrentUpdate: from that request, when the row differs or is gone (nothing
                after the check ran).
        """
        row = _task_row(task.job_id, task)
        params = (*row[:4], *row[5:])  # INSERT_TASK's columns but the payload

        def take(answer: TupleRow) -> None:
            task.payload = decode_json(answer[1])

        if not self._conn.send_check(sql.CONFIRM_TASK, params, f"task {task.id}", take):
            raise ConcurrentUpdate(f"task {task.id} could not be checked without a read")
        self._versions.read_tasks([task])

    async def save(self, task: Task) -> None:
        """Compare-and-set on ``version``; bumps ``task.version`` on success.

        A task this try read at ``task.version`` is written with the try's next request
        (``_Versions``), the others at once.

        Raises:
            ConcurrentUpdate: the stored row no longer has ``task.version`` (or is gone); for a
                queued write, from the request that carries it.
        """
        params = (*_task_changes(task), task.id, Int8(task.version))
        known = self._versions.tasks.get(task.id) == task.version
        await _write_one(self._conn, sql.UPDATE_TASK, params, queue=known, what=f"task {task.id}")
        task.version += 1
        self._versions.wrote_task(task)
        self._events.add_many(task_events(task))
        task.transitions = ()

    async def save_many(self, tasks: Sequence[Task]) -> None:
        """Compare-and-set of every task on its ``version`` in one statement; all or nothing.

        Writes the mutable columns (as ``sql.UPDATE_TASKS`` lists them); on success each task's
        ``version`` is bumped in memory.

        Raises:
            ConcurrentUpdate: some stored row no longer has the task's version (or is gone);
                no row of the batch was written.
            ValueError: two tasks share an id.
        """
        written = await _write_guarded(
            self._conn,
            "task",
            tasks,
            single=self.save,
            statement=sql.UPDATE_TASKS,
            params=lambda ids: (
                UuidArray(ids),
                Int8Array([t.version for t in tasks]),
                *_task_change_arrays(tasks),
            ),
        )
        if written:
            for task in tasks:
                task.version += 1
                self._versions.wrote_task(task)
                self._events.add_many(task_events(task))
                task.transitions = ()

    async def save_progress(self, updates: Sequence[tuple[UUID, UUID, Any]]) -> set[UUID]:
        """Write each ``(task_id, run_id, progress)`` whose run is still the task's live run,
        in one statement (``sql.UPDATE_PROGRESS``); ``version`` is left alone.

        Returns:
            The ids of the tasks written; the others' runs are no longer live.

        Raises:
            InvalidPayload: a value is not JSON-encodable.
        """
        if not updates:
            return set()
        cur = await self._conn.execute(
            sql.UPDATE_PROGRESS,
            (
                [u[0] for u in updates],
                [u[1] for u in updates],
                [encode_json(u[2]) for u in updates],
                TaskStatus.RUNNING.value,
            ),
        )
        return {row[0] for row in await cur.fetchall()}

    async def dependents(self, task_id: UUID) -> list[UUID]:
        """Ids of the tasks that depend directly on ``task_id`` (ordered by id)."""
        cur = await self._conn.execute(sql.DEPENDENTS, (task_id,))
        return [row[0] for row in await cur.fetchall()]

    async def dependencies(self, task_id: UUID) -> list[UUID]:
        """Ids of the tasks ``task_id`` depends on directly (ordered by id)."""
        cur = await self._conn.execute(sql.DEPENDENCIES, (task_id,))
        return [row[0] for row in await cur.fetchall()]

    async def dependents_many(self, task_ids: Sequence[UUID]) -> list[tuple[UUID, UUID]]:
        """``(depends_on_task_id, task_id)`` edges out of any of ``task_ids``, in no set order
        (one statement: ``sql.DEPENDENTS_MANY``, ``sql.DEPENDENTS_ONE`` for one id)."""
        if not task_ids:
            return []
        cur = await self._conn.execute(*_for_ids(sql.DEPENDENTS_MANY, sql.DEPENDENTS_ONE, task_ids))
        return [(row[0], row[1]) for row in await cur.fetchall()]

    async def parent_results(self, task_ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
        """Per task of ``task_ids``, its direct dependencies' ``name -> result`` (one
        statement); tasks without dependencies are left out."""
        if not task_ids:
            return {}
        cur = await self._conn.execute(sql.PARENT_RESULTS, (UuidArray(task_ids),))
        found: dict[UUID, dict[str, Any]] = {}
        for task_id, name, result in await cur.fetchall():
            found.setdefault(task_id, {})[name] = decode_json(result)
        return found

    async def results_page(
        self,
        job_id: UUID,
        *,
        after: tuple[int, UUID] | None,
        limit: int,
        for_update: bool = False,
    ) -> list[Task]:
        """The job's tasks ordered by ``(position, id)`` after the cursor; at most ``limit``
        (with ``for_update`` the rows are locked: the ``*_FOR_UPDATE`` statements)."""
        if after is None:
            first = sql.RESULTS_PAGE_FIRST_FOR_UPDATE if for_update else sql.RESULTS_PAGE_FIRST
            cur = await self._conn.execute(first, (job_id, Int8(limit)))
        else:
            later = sql.RESULTS_PAGE_AFTER_FOR_UPDATE if for_update else sql.RESULTS_PAGE_AFTER
            cur = await self._conn.execute(later, (job_id, Int8(after[0]), after[1], Int8(limit)))
        return [task_from_row(row) for row in await cur.fetchall()]

    async def dependencies_completed(self, task_id: UUID) -> bool:
        """True when no direct dependency of ``task_id`` is other than ``completed``."""
        cur = await self._conn.execute(
            sql.DEPENDENCIES_COMPLETED, (task_id, TaskStatus.COMPLETED.value)
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def dependency_has_status(self, task_id: UUID, statuses: Sequence[TaskStatus]) -> bool:
        """True when some direct dependency of ``task_id`` has one of ``statuses``."""
        cur = await self._conn.execute(
            sql.DEPENDENCY_HAS_STATUS, (task_id, [status.value for status in statuses])
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def job_has_status(self, job_id: UUID, statuses: Sequence[TaskStatus]) -> bool:
        """True when some task of the job has one of ``statuses`` (EXISTS probe)."""
        if not statuses:
            return False
        cur = await self._conn.execute(
            sql.JOB_HAS_STATUS, (TextArray([TaskStatus(s).value for s in statuses]), job_id)
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def due_queued(
        self, *, now: datetime, after: tuple[datetime, UUID] | None, limit: int
    ) -> list[DueTask]:
        """Queued tasks due by ``now`` in ``(scheduled_at, id)`` order after the cursor."""
        if after is None:
            cur = await self._conn.execute(sql.DUE_QUEUED_FIRST, (now, limit))
        else:
            cur = await self._conn.execute(sql.DUE_QUEUED_AFTER, (now, after[0], after[1], limit))
        return [
            DueTask(id=r[0], priority=r[1], scheduled_at=r[2], kind=r[3])
            for r in await cur.fetchall()
        ]

    async def stale_running(
        self, *, started_before: datetime, after: UUID | None, limit: int
    ) -> list[RunningTask]:
        """Running tasks started before ``started_before``, by id, after the cursor."""
        if after is None:
            cur = await self._conn.execute(sql.STALE_RUNNING_FIRST, (started_before, limit))
        else:
            cur = await self._conn.execute(sql.STALE_RUNNING_AFTER, (after, started_before, limit))
        return [
            RunningTask(id=r[0], run_id=r[1], priority=r[2], started_at=r[3])
            for r in await cur.fetchall()
        ]

    async def list_page(
        self, where: TaskFilter, *, after: TaskKeyset | None, limit: int
    ) -> list[Task]:
        """Matching tasks newest first after the keyset, without payload, result, progress."""
        query, params = listing_sql.task_page(where, after, limit)
        cur = await self._conn.execute(query, params)
        return [task_from_row(row) for row in await cur.fetchall()]

    async def matching_task_ids(
        self, where: TaskFilter, *, after: TaskKeyset | None, limit: int
    ) -> list[TaskKeyset]:
        """The keysets of ``list_page``'s tasks (three columns read)."""
        query, params = listing_sql.task_page(where, after, limit, keys_only=True)
        cur = await self._conn.execute(query, params)
        return [(r[0], r[1], r[2]) for r in await cur.fetchall()]

    async def count_by_status(self, job_id: UUID) -> dict[TaskStatus, int]:
        """Tasks per status of the job (statuses with none left out)."""
        cur = await self._conn.execute(listing_sql.COUNT_TASKS_BY_STATUS, (job_id,))
        return {TaskStatus(status): count for status, count in await cur.fetchall()}


class PgRunRepository:
    """``RunRepository`` on one transaction."""

    def __init__(self, conn: TryConnection, versions: _Versions) -> None:
        self._conn = conn
        self._versions = versions

    async def _add_one(self, run: TaskRun) -> None:
        """``add_many`` of one run: the single-row INSERT (cheaper to plan than ``unnest``),
        sent with the try's next request (``TryConnection.send_later``)."""
        await self._conn.send_later(
            sql.INSERT_RUN,
            (
                run.id,
                run.task_id,
                run.attempt_number,
                run.worker_id,
                run.status.value,
                run.started_at,
                run.error,
                run.finished_at,
            ),
        )

    async def add_many(self, runs: Sequence[TaskRun]) -> None:
        """Insert new runs in one statement (``INSERT ... SELECT FROM unnest``)."""
        if not runs:
            return
        if len(runs) == 1:
            await self._add_one(runs[0])
            return
        await self._conn.execute(
            sql.INSERT_RUNS,
            (
                UuidArray([r.id for r in runs]),
                UuidArray([r.task_id for r in runs]),
                Int8Array([r.attempt_number for r in runs]),
                TextArray([r.worker_id for r in runs]),
                TextArray([r.status.value for r in runs]),
                TimestamptzArray([r.started_at for r in runs]),
                TextArray([r.error for r in runs]),
                TimestamptzArray([r.finished_at for r in runs]),
            ),
        )

    async def get(self, run_id: UUID) -> TaskRun | None:
        """The run, or None."""
        row = await (await self._conn.execute(sql.GET_RUN, (run_id,))).fetchone()
        return None if row is None else run_from_row(row)

    async def get_many(self, run_ids: Sequence[UUID]) -> list[TaskRun]:
        """The known runs among ``run_ids``, in no set order (one statement)."""
        if not run_ids:
            return []
        cur = await self._conn.execute(sql.GET_RUNS, (UuidArray(run_ids),))
        return [run_from_row(row) for row in await cur.fetchall()]

    async def save(self, run: TaskRun) -> None:
        """Write status, error and finished_at if the stored run is still ``running``.

        The run of a task this try wrote is written with the try's next request
        (``_Versions``), the others at once.

        Raises:
            ConcurrentUpdate: the stored run already ended (or does not exist); for a queued
                write, from the request that carries it.
        """
        params = (run.status.value, run.error, run.finished_at, run.id, RunStatus.RUNNING.value)
        queue = run.task_id in self._versions.written
        await _write_one(self._conn, sql.UPDATE_RUN, params, queue=queue, what=f"run {run.id}")

    async def save_many(self, runs: Sequence[TaskRun]) -> None:
        """Write status, error and finished_at of every run whose stored row is still
        ``running``, in one statement; all or nothing.

        Raises:
            ConcurrentUpdate: some stored run already ended (or does not exist); no row of
                the batch was written.
            ValueError: two runs share an id.
        """
        await _write_guarded(
            self._conn,
            "run",
            runs,
            single=self.save,
            statement=sql.UPDATE_RUNS,
            params=lambda ids: (
                UuidArray(ids),
                TextArray([r.status.value for r in runs]),
                TextArray([r.error for r in runs]),
                TimestamptzArray([r.finished_at for r in runs]),
                RunStatus.RUNNING.value,
                RunStatus.RUNNING.value,
            ),
        )

    async def list_for_task(self, task_id: UUID) -> list[TaskRun]:
        """Every run of the task ordered by ``started_at``, then id."""
        cur = await self._conn.execute(sql.LIST_RUNS_FOR_TASK, (task_id,))
        return [run_from_row(row) for row in await cur.fetchall()]


class PgWorkerRepository:
    """``WorkerRepository`` on one transaction."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def upsert(self, worker: Worker) -> None:
        """Insert or overwrite the worker row (``INSERT ... ON CONFLICT (id) DO UPDATE``)."""
        await self._conn.execute(
            sql.UPSERT_WORKER,
            (
                worker.id,
                worker.hostname,
                worker.last_heartbeat_at,
                encode_json(worker.metadata),
                worker.redis_key_prefix,
            ),
        )

    async def list_active(self, since: datetime) -> list[Worker]:
        """Workers with ``last_heartbeat_at >= since``, most recent first (then id)."""
        cur = await self._conn.execute(sql.LIST_ACTIVE_WORKERS, (since,))
        return [worker_from_row(row) for row in await cur.fetchall()]

    async def get(self, worker_id: str) -> Worker | None:
        """The worker's row, or None (a primary-key probe)."""
        cur = await self._conn.execute(sql.GET_WORKER, (worker_id,))
        row = await cur.fetchone()
        return None if row is None else worker_from_row(row)

    async def delete(self, worker_id: str) -> bool:
        """Delete the worker's row; True when there was one."""
        cur = await self._conn.execute(sql.DELETE_WORKER, (worker_id,))
        return await cur.fetchone() is not None


class PgApiTokenRepository:
    """``ApiTokenRepository`` on one transaction."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def add(self, token: ApiToken) -> None:
        """Insert the token (scopes sorted).

        Raises:
            TokenNameTaken: the name is taken (the insert wrote nothing).
        """
        cur = await self._conn.execute(
            sql.API_TOKENS_INSERT,
            (
                token.id,
                token.name,
                token.secret_hash,
                sorted(scope.value for scope in token.scopes),
                token.created_at,
                token.expires_at,
                token.revoked_at,
            ),
        )
        if await cur.fetchone() is None:
            raise TokenNameTaken(f"a token named {token.name!r} already exists", field="name")

    async def get_by_hash(self, secret_hash: str) -> ApiToken | None:
        """The token with this secret hash, or None (one index probe)."""
        row = await (await self._conn.execute(sql.API_TOKENS_BY_HASH, (secret_hash,))).fetchone()
        return None if row is None else token_from_row(row)

    async def get_by_name(self, name: str) -> ApiToken | None:
        """The token named ``name``, or None (one index probe)."""
        row = await (await self._conn.execute(sql.API_TOKENS_BY_NAME, (name,))).fetchone()
        return None if row is None else token_from_row(row)

    async def list_all(self) -> list[ApiToken]:
        """Every token, ordered by name."""
        cur = await self._conn.execute(sql.API_TOKENS_LIST)
        return [token_from_row(row) for row in await cur.fetchall()]

    async def set_revoked(self, token_id: UUID, at: datetime) -> bool:
        """Set ``revoked_at`` if still NULL; True when this call did."""
        cur = await self._conn.execute(sql.API_TOKENS_REVOKE, (at, token_id))
        return await cur.fetchone() is not None


class PgTransaction:
    """``Transaction``: the repositories on one connection plus the database clock.

    One instance per try of ``CockroachStore.run``; ``now()`` is read once and cached, and costs
    no statement when a task read earlier in the try brought it (``_TxClock``).
    """

    def __init__(self, conn: AsyncConnection[TupleRow]) -> None:
        self.conn = TryConnection(conn, on_now=self._know)
        self._clock = _TxClock(self.conn)
        sent = self.conn  # every repository sends through it (the first request opens the try)
        self.events = PgEventRepository(sent)
        versions = _Versions()  # the rows this try has read: their writes can be queued
        self.jobs = PgJobRepository(sent, self.events, versions)
        self.tasks = PgTaskRepository(sent, self.events, versions)
        self.runs = PgRunRepository(sent, versions)
        self.workers = PgWorkerRepository(sent)
        self.tokens = PgApiTokenRepository(sent)
        self.retention = PgRetentionRepository(sent)
        self.webhooks = PgWebhookRepository(sent)
        self.sessions = PgSessionRepository(sent)

    async def now(self) -> datetime:
        """The transaction timestamp (database ``now()``, aware UTC), fixed for this try."""
        return await self._clock.now()

    async def write_time(self, *, not_before: datetime | None = None) -> datetime:
        """The try's time for the rows it creates (``Transaction.write_time``): estimated
        from the connection's last reading of the database clock, raised to ``not_before``,
        checked by the database with the BEGIN (``txconn.ClockAnchor``), when the try has sent
        nothing yet."""
        return await self._clock.write_time(not_before)

    def _know(self, now: datetime) -> None:
        self._clock.know(now)

    def begin(self) -> None:
        """Open the try's transaction with its first request (no I/O now).

        ``BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT now()`` is sent with the try's first
        statement (``txconn.TryConnection``), so neither the transaction nor its timestamp
        costs a round trip of its own.
        """
        self.conn.open_lazily()

    async def commit(self) -> None:
        """Write the buffered events and COMMIT in one round trip (the outbox insert is the
        try's last statement, DESIGN §7).

        The insert is bound on the client (``INSERT ...; COMMIT`` is one simple query, which
        takes no parameters); an insert that fails leaves the COMMIT unexecuted and the
        transaction aborted for the caller's ROLLBACK. What the try still owes goes first in
        the same request: its BEGIN if it sent no statement, its queued inserts
        (``TryConnection.send_later``); a try that owes nothing and has no event sends nothing.

        Raises:
            psycopg.Error: the insert or the COMMIT failed (40001 at COMMIT included).
            RuntimeError: the server did not answer COMMIT (the transaction had already failed:
                a caller swallowed an error inside it), so nothing was written.
        """
        insert = self.events.take_insert(self.conn.raw)
        cur = await self.conn.finish([sql.COMMIT] if insert is None else [insert, sql.COMMIT])
        if cur is None:
            return  # the try sent nothing: no transaction was opened
        if cur.statusmessage != sql.COMMIT:
            raise RuntimeError(f"COMMIT answered {cur.statusmessage!r}; nothing was written")
