"""Ports: what the application services need from the outside world (DESIGN §3).

Adapters implement these protocols structurally (no inheritance); mypy checks conformance where
the composition root wires them. Every adapter wraps its driver's exceptions at the boundary:
callers see only ``dtq.domain.errors`` types (``BackendUnavailable`` for infrastructure trouble).

Over 400 lines on purpose: it is all declarations (protocols and their docstrings, no logic), and
one file is the one place to read every contract the application depends on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar
from uuid import UUID

from dtq.application.filters import JobFilter, JobKeyset, TaskFilter, TaskKeyset
from dtq.domain.entities import Job, Task, TaskRun, Worker
from dtq.domain.events import NewEvent
from dtq.domain.sessions import DashboardSession
from dtq.domain.status import JobStatus, TaskStatus
from dtq.domain.tokens import ApiToken
from dtq.domain.webhooks import Webhook

T = TypeVar("T")


# --- clock ------------------------------------------------------------------------------------


class Clock(Protocol):
    """Time for the host side (timeouts, heartbeat pacing). Durable comparisons use the store's
    clock (``Transaction.now``), never this one."""

    def now(self) -> datetime:
        """Current time, aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (a fake clock may return at once after advancing itself)."""
        ...


# --- store ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DueTask:
    """A ``queued`` task whose ``scheduled_at <= now``, as listed by the reconciler."""

    id: UUID
    priority: str
    scheduled_at: datetime
    kind: str  # where kind-aware routing may have put it (issue 15 item 2)


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A ``running`` task with its live run, as listed by the reclaimer."""

    id: UUID
    run_id: UUID
    priority: str
    started_at: datetime


class JobRepository(Protocol):
    """Jobs, and job creation with all tasks and edges (spec §4: one transaction)."""

    async def add(
        self, job: Job, tasks: Sequence[Task], edges: Sequence[tuple[UUID, UUID]]
    ) -> None:
        """Insert a job, its tasks and its ``(task_id, depends_on_task_id)`` edges.

        Uses a constant number of statements whatever the job size.

        Raises:
            DuplicateIdempotencyKey: another job already holds ``job.idempotency_key``.
        """
        ...

    async def add_many(
        self, jobs: Sequence[tuple[Job, Sequence[Task], Sequence[tuple[UUID, UUID]]]]
    ) -> None:
        """``add`` for several jobs at once (group commit, issue 17 item 3), in a constant
        number of statements whatever the number of jobs and tasks.

        Raises:
            DuplicateIdempotencyKey: one of the jobs' keys is held by another job (or by two
                of ``jobs``); the transaction must be abandoned.
        """
        ...

    async def get(self, job_id: UUID) -> Job | None:
        """The job, or None for an unknown id."""
        ...

    async def get_by_idempotency_key(self, key: str) -> Job | None:
        """The job created under ``key``, or None."""
        ...

    def confirm(self, job: Job) -> None:
        """Take ``job``, a row this try did not read (a ``CarriedTask``), as read at
        ``job.version``, without a round trip of its own: the store checks that the stored
        row is exactly ``job`` before the try's next statement runs, so a later ``save`` is a
        compare-and-set on a row the try knows.

        Raises:
            ConcurrentUpdate: the row differs or is gone (now, or from the try's next request;
                nothing after the check ran, the try is re-run).
        """
        ...

    async def save(self, job: Job) -> None:
        """Write ``job`` if its row still has ``job.version``; then bump ``job.version``.

        Raises:
            ConcurrentUpdate: the row changed since it was read (the transaction is re-run).
        """
        ...

    async def get_finished(
        self, job_ids: Sequence[UUID], unfinished: Sequence[TaskStatus]
    ) -> list[tuple[Job, bool, bool]]:
        """The jobs among ``job_ids`` none of whose tasks has a status in ``unfinished``, each
        with whether some task of it is ``failed`` and whether some is ``cancelled``; in no
        set order, unknown ids left out. One statement of index probes whatever the jobs'
        sizes; a job with some task in ``unfinished`` is not read. What settling the jobs of a
        batch of finished tasks needs."""
        ...

    async def get_many(self, job_ids: Sequence[UUID]) -> list[Job]:
        """The known jobs among ``job_ids``, in no set order (one statement)."""
        ...

    async def save_many(self, jobs: Sequence[Job]) -> None:
        """``save`` for several jobs in one statement; all or nothing.

        Raises:
            ConcurrentUpdate: some row changed since it was read.
        """
        ...

    async def list_page(
        self, where: JobFilter, *, after: JobKeyset | None, limit: int
    ) -> list[Job]:
        """Jobs matching ``where``, newest first (``created_at`` then id, descending), strictly
        after the keyset ``after``; at most ``limit`` (index range scans, no OFFSET)."""
        ...


class TaskRepository(Protocol):
    """Tasks and the dependency edges between them."""

    async def get(self, task_id: UUID) -> Task | None:
        """The task, or None for an unknown id."""
        ...

    async def get_many(self, task_ids: Sequence[UUID], *, for_update: bool = False) -> list[Task]:
        """The known tasks among ``task_ids`` (unknown ids are left out), in no set order.

        ``for_update``: lock the rows read until the transaction ends (``FOR UPDATE``), so the
        transaction's writes to them cannot lose to a concurrent transition that commits after
        the read (a cancel racing a fast drain); writers of those rows wait for it instead.
        """
        ...

    async def get_many_with_jobs(self, task_ids: Sequence[UUID]) -> tuple[list[Task], list[Job]]:
        """``get_many``, and the jobs of the tasks found (each job once, in no set order),
        read together in one statement (the claim needs both)."""
        ...

    async def list_by_job(self, job_id: UUID) -> list[Task]:
        """Every task of the job, ordered by ``created_at`` then ``name``."""
        ...

    def confirm(self, task: Task) -> None:
        """``JobRepository.confirm`` for a task, every column but the payload, which is not
        carried: the stored payload is set on ``task.payload`` by the time the try's next
        request returns (for a claim, its commit).

        Raises:
            ConcurrentUpdate: the row differs or is gone (now, or from the try's next request).
        """
        ...

    async def save(self, task: Task) -> None:
        """Write ``task`` if its row still has ``task.version``; then bump ``task.version``.

        Raises:
            ConcurrentUpdate: the row changed since it was read.
        """
        ...

    async def save_many(self, tasks: Sequence[Task]) -> None:
        """``save`` for several tasks in one statement; all or nothing.

        Raises:
            ConcurrentUpdate: some row changed since it was read.
        """
        ...

    async def save_progress(self, updates: Sequence[tuple[UUID, UUID, Any]]) -> set[UUID]:
        """Set ``progress`` of each ``(task_id, run_id, value)`` whose run is still the task's
        live run (``running``, same run id), in one statement; ``version`` is not bumped.

        Returns:
            The ids of the tasks written (a stale run's task is left out, unchanged).
        """
        ...

    async def dependents(self, task_id: UUID) -> list[UUID]:
        """Ids of the tasks that depend directly on ``task_id``."""
        ...

    async def dependents_many(self, task_ids: Sequence[UUID]) -> list[tuple[UUID, UUID]]:
        """``(depends_on_task_id, task_id)`` edges out of any of ``task_ids`` (one statement)."""
        ...

    async def dependencies(self, task_id: UUID) -> list[UUID]:
        """Ids of the tasks ``task_id`` depends on directly, ordered by id (one index range;
        cost proportional to the in-degree). Unknown task or none: empty."""
        ...

    async def parent_results(self, task_ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
        """Per task of ``task_ids``, its direct dependencies' ``name -> result`` (one statement;
        cost proportional to the tasks' in-degree). Tasks without dependencies are left out."""
        ...

    async def results_page(
        self,
        job_id: UUID,
        *,
        after: tuple[int, UUID] | None,
        limit: int,
        for_update: bool = False,
    ) -> list[Task]:
        """The job's tasks in submission order (``(position, id)``), strictly after the keyset
        cursor ``after``; at most ``limit`` (an index range scan). Unknown job: empty.
        ``for_update`` as for :meth:`get_many`."""
        ...

    async def dependencies_completed(self, task_id: UUID) -> bool:
        """True when every direct dependency of ``task_id`` is ``completed`` (index probe)."""
        ...

    async def job_has_status(self, job_id: UUID, statuses: Sequence[TaskStatus]) -> bool:
        """True when some task of the job has one of ``statuses`` (an index probe, not a count)."""
        ...

    async def dependency_has_status(self, task_id: UUID, statuses: Sequence[TaskStatus]) -> bool:
        """True when some direct dependency of ``task_id`` has one of ``statuses`` (one
        statement, stopping at the first hit; False for a task without dependencies). The
        manual retry asks it for ``failed``/``cancelled`` (issue 14 item 4)."""
        ...

    async def due_queued(
        self, *, now: datetime, after: tuple[datetime, UUID] | None, limit: int
    ) -> list[DueTask]:
        """``queued`` tasks with ``scheduled_at <= now``, ordered by ``(scheduled_at, id)``,
        strictly after the keyset cursor ``after``; at most ``limit``."""
        ...

    async def stale_running(
        self, *, started_before: datetime, after: UUID | None, limit: int
    ) -> list[RunningTask]:
        """``running`` tasks whose ``started_at < started_before``, ordered by id, with id
        strictly greater than ``after``; at most ``limit``."""
        ...

    async def list_page(
        self, where: TaskFilter, *, after: TaskKeyset | None, limit: int
    ) -> list[Task]:
        """Tasks matching ``where``, newest first (``(created_at, position, id)`` descending),
        strictly after the keyset ``after``; at most ``limit`` (index range scans, no OFFSET).
        The heavy columns are not read: ``payload``, ``result`` and ``progress`` are None."""
        ...

    async def matching_task_ids(
        self, where: TaskFilter, *, after: TaskKeyset | None, limit: int
    ) -> list[TaskKeyset]:
        """The keysets ``(created_at, position, id)`` of ``list_page``'s tasks: the next batch
        of at most ``limit`` matching ids after ``after``, for bulk operations."""
        ...

    async def count_by_status(self, job_id: UUID) -> dict[TaskStatus, int]:
        """How many tasks of the job have each status; statuses with none are left out (one
        index scan of the job's range; unknown job: empty)."""
        ...


class RunRepository(Protocol):
    """Run history (``task_runs``)."""

    async def get(self, run_id: UUID) -> TaskRun | None:
        """The run, or None."""
        ...

    async def save(self, run: TaskRun) -> None:
        """Write the run's status, error and finished_at.

        Raises:
            ConcurrentUpdate: the stored run is no longer ``running`` (it was ended elsewhere).
        """
        ...

    async def add_many(self, runs: Sequence[TaskRun]) -> None:
        """Insert new runs in one statement (none for an empty batch)."""
        ...

    async def get_many(self, run_ids: Sequence[UUID]) -> list[TaskRun]:
        """The known runs among ``run_ids``, in no set order (one statement)."""
        ...

    async def save_many(self, runs: Sequence[TaskRun]) -> None:
        """``save`` for several runs in one statement; all or nothing.

        Raises:
            ConcurrentUpdate: some stored run is no longer ``running``.
        """
        ...

    async def list_for_task(self, task_id: UUID) -> list[TaskRun]:
        """Every run of the task ordered by ``started_at`` (then id)."""
        ...


class WorkerRepository(Protocol):
    """The optional worker registry (spec §4 ``workers``)."""

    async def upsert(self, worker: Worker) -> None:
        """Insert or update the worker row (hostname, last_heartbeat_at, metadata)."""
        ...

    async def list_active(self, since: datetime) -> list[Worker]:
        """Workers with ``last_heartbeat_at >= since``, most recent first."""
        ...

    async def get(self, worker_id: str) -> Worker | None:
        """The worker's row, or None when it has none."""
        ...

    async def delete(self, worker_id: str) -> bool:
        """Delete the worker's row; idempotent.

        Returns:
            True when a row was deleted; False when there was none.
        """
        ...


class ApiTokenRepository(Protocol):
    """API tokens (``api_tokens``, issue 15 item 3): stored by the hash of their secret."""

    async def add(self, token: ApiToken) -> None:
        """Insert ``token``.

        Raises:
            TokenNameTaken: another token already has ``token.name``.
        """
        ...

    async def get_by_hash(self, secret_hash: str) -> ApiToken | None:
        """The token whose secret hashes to ``secret_hash`` (unique index), or None."""
        ...

    async def get_by_name(self, name: str) -> ApiToken | None:
        """The token named ``name``, or None."""
        ...

    async def list_all(self) -> list[ApiToken]:
        """Every token, revoked and expired ones included, ordered by name."""
        ...

    async def set_revoked(self, token_id: UUID, at: datetime) -> bool:
        """Set ``revoked_at = at`` unless the token is already revoked.

        Returns:
            True when this call revoked it; False when it was revoked already or is unknown.
        """
        ...


class DashboardSessionRepository(Protocol):
    """Dashboard login sessions (``dashboard_sessions``, issue 16 item 3), keyed by the hash of
    the cookie's random id, and the dashboard's shared signing keys (``dashboard_keys``)."""

    async def add(self, session: DashboardSession) -> None:
        """Insert ``session`` (its ``id_hash`` is new: 256 random bits behind it)."""
        ...

    async def get(self, id_hash: str) -> tuple[DashboardSession, ApiToken] | None:
        """The session and the token it logged in with, in one statement (two primary-key
        reads), or None when there is no such session or its token is gone. Expired
        sessions and revoked or expired tokens are returned too: the caller judges them."""
        ...

    async def delete(self, id_hash: str) -> bool:
        """Delete the session; True when it existed (idempotent)."""
        ...

    async def delete_expired(self, before: datetime, limit: int) -> int:
        """Delete at most ``limit`` sessions with ``expires_at <= before``, oldest first.

        Returns:
            How many were deleted (``limit`` means more may be left).
        """
        ...

    async def key(self, name: str, candidate: str) -> str:
        """The signing key named ``name``: the stored one, else ``candidate``, stored now.
        Writers racing on a new name all get the one that was stored first."""
        ...


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A terminal job as listed by the retention pass (issue 14 item 8), in keyset order."""

    id: UUID
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What is left of a pruned job that was created under an ``Idempotency-Key``: enough to
    answer a replay with the original ids (issue 14 item 8).

    Attributes:
        pruned_at: when the job was deleted (database clock); the tombstone lives
            ``IDEMPOTENCY_KEY_TTL`` from then.
    """

    idempotency_key: str
    request_hash: str | None
    job_id: UUID
    task_ids: dict[str, UUID]
    pruned_at: datetime


@dataclass(frozen=True, slots=True)
class PrunedJobs:
    """Rows one ``RetentionRepository.delete_jobs`` call deleted (and tombstones it wrote)."""

    jobs: int = 0
    tasks: int = 0
    runs: int = 0
    tombstones_written: int = 0


class RetentionRepository(Protocol):
    """Deleting finished jobs and the idempotency tombstones they leave (issue 14 item 8)."""

    async def finished_jobs(
        self,
        *,
        status: JobStatus,
        updated_before: datetime,
        after: tuple[datetime, UUID] | None,
        limit: int,
    ) -> list[FinishedJob]:
        """Jobs with ``status`` and ``updated_at < updated_before``, ordered
        by ``(updated_at, id)``, strictly after the keyset cursor ``after``; at most ``limit``
        (an index range scan). Candidates only: ``delete_jobs`` re-checks them."""
        ...

    async def task_counts(self, job_ids: Sequence[UUID]) -> dict[UUID, int]:
        """Number of tasks of each of ``job_ids`` (a job without tasks or unknown: absent)."""
        ...

    async def delete_jobs(
        self,
        job_ids: Sequence[UUID],
        *,
        status: JobStatus,
        finished_before: datetime,
        tombstone_at: datetime | None,
    ) -> PrunedJobs:
        """Delete each of ``job_ids`` that still qualifies, with its tasks, dependency edges,
        runs and events (issue 16 item 1), in a constant number of statements.

        A job qualifies when its status is still ``status``, its ``updated_at`` is before
        ``finished_before``, and every one of its tasks is terminal and finished (``finished_at``)
        before ``finished_before``. Unknown or no longer qualifying ids are skipped and not
        counted, so two callers deleting the same job count it once. When ``tombstone_at`` is
        given, each deleted job that holds an idempotency key leaves a ``Tombstone`` with that
        ``pruned_at`` (replacing an older tombstone of the same key).
        """
        ...

    async def get_tombstone(self, key: str) -> Tombstone | None:
        """The tombstone of ``key``, or None."""
        ...

    async def delete_tombstones(self, *, pruned_before: datetime, limit: int) -> int:
        """Delete at most ``limit`` tombstones with ``pruned_at < pruned_before``, oldest first.

        Returns:
            How many were deleted.
        """
        ...


@dataclass(frozen=True, slots=True)
class Event:
    """An outbox row as read back (issue 16 item 1): a ``NewEvent`` with the id and the
    ordering time the store gave it when it wrote it.

    Events are ordered by ``(created_at, id)``; that pair is the stream's cursor
    (:class:`EventCursor`).
    """

    id: UUID
    job_id: UUID
    task_id: UUID | None
    type: str
    data: dict[str, Any]
    created_at: datetime

    @property
    def cursor(self) -> EventCursor:
        """The position just after this event."""
        return EventCursor(self.created_at, self.id)


@dataclass(frozen=True, slots=True, order=True)
class EventCursor:
    """A position in the event order: strictly after the event ``(created_at, id)``; cursors
    compare in that order."""

    created_at: datetime
    id: UUID


class EventRepository(Protocol):
    """The transition outbox (``events``, issue 16 item 1).

    Writes are buffered: ``add_many`` costs no statement; the store writes everything the try
    buffered in ONE statement just before COMMIT (none when nothing was buffered), and gives
    each event its id and its ordering time then (the database clock at that statement, plus
    the event's position in the buffer in microseconds). The task and job repositories buffer
    the events of the transitions they write (``domain.events``); services never need to.
    """

    def add_many(self, events: Sequence[NewEvent]) -> None:
        """Buffer ``events`` to be written with this transaction, in order."""
        ...

    async def page(
        self,
        *,
        after: EventCursor | None,
        job_id: UUID | None,
        types: Sequence[str] | None,
        settle: float,
        limit: int,
    ) -> list[Event]:
        """Committed events strictly after ``after`` in ``(created_at, id)`` order, at most
        ``limit``, of ``job_id`` (all jobs when None) and of ``types`` (all when None).

        Only events older than ``settle`` seconds by the database clock are returned (the
        visibility horizon: an event written by a transaction still committing is never
        skipped, see ARCHITECTURE.md "Outbox and event stream"). An adapter whose commits are
        serialised (the memory fake) may ignore ``settle``.
        """
        ...


class WebhookRepository(Protocol):
    """Webhooks and their delivery state (``webhooks``, issue 16 item 2)."""

    async def add(self, webhook: Webhook) -> None:
        """Insert a new webhook."""
        ...

    async def get(self, webhook_id: UUID) -> Webhook | None:
        """The webhook, or None."""
        ...

    async def list_all(self) -> list[Webhook]:
        """Every webhook, oldest first (then id)."""
        ...

    async def delete(self, webhook_id: UUID) -> bool:
        """Delete the webhook; True when it existed."""
        ...

    async def replace(self, expected: Webhook, new: Webhook) -> bool:
        """Write ``new``'s delivery state (cursor, attempts, next attempt, last status, error,
        attempt time, delivered count) if the stored row still has ``expected``'s cursor and
        ``next_attempt_at`` (a compare-and-set); True when it did. False when the webhook is
        gone or another writer moved it first: nothing is written then."""
        ...


class DeliveryFailed(Exception):
    """A webhook request got no response (connect error, timeout, TLS): ``str()`` says why."""


class WebhookSender(Protocol):
    """Sends webhook requests (issue 16 item 2)."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        """POST ``body`` with ``headers`` to exactly ``url`` (no redirect is followed) within
        the sender's timeout, and return the response's status code (any code, 2xx or not).

        Raises:
            DeliveryFailed: no response.
        """
        ...

    async def aclose(self) -> None:
        """Close open connections (a later ``post`` may open new ones)."""
        ...


class Transaction(Protocol):
    """One database transaction: the repositories plus the database clock."""

    @property
    def jobs(self) -> JobRepository: ...

    @property
    def tasks(self) -> TaskRepository: ...

    @property
    def runs(self) -> RunRepository: ...

    @property
    def workers(self) -> WorkerRepository: ...

    @property
    def tokens(self) -> ApiTokenRepository: ...

    @property
    def retention(self) -> RetentionRepository: ...

    @property
    def events(self) -> EventRepository: ...

    @property
    def webhooks(self) -> WebhookRepository: ...

    @property
    def sessions(self) -> DashboardSessionRepository: ...

    async def now(self) -> datetime:
        """The transaction's timestamp (database clock, aware UTC; fixed within one try)."""
        ...

    async def write_time(self, *, not_before: datetime | None = None) -> datetime:
        """The time to stamp the rows this try creates with (aware UTC; fixed within one try;
        then also what :meth:`now` returns).

        The database clock, as :meth:`now`; an adapter may estimate it instead of reading it
        first, if the database checks the estimate before anything of the try runs: never
        after the transaction's timestamp and at most a documented tolerance before it (100 ms
        for the SQL adapter), or the try is re-run (ARCHITECTURE.md, "SQL per use case").
        ``not_before``: a time the caller knows to precede this transaction (a row committed
        before it began is dated by it); an estimate is raised to it, and checked all the same.
        """
        ...


class Store(Protocol):
    """The system of record. ``run`` is the unit of retry (DESIGN §3)."""

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction and commit; return its result.

        On a retryable conflict (SQLSTATE 40001, ``ConcurrentUpdate``, a connection lost before
        COMMIT) the whole function is run again on a fresh transaction, with jittered
        exponential backoff, a bounded number of times. ``fn`` must have no side effects
        outside the transaction.

        Raises:
            CommitOutcomeUnknown: the outcome of COMMIT is unknown; re-read before acting.
            BackendUnavailable: the database failed, or retries were exhausted.
            DtqError: whatever ``fn`` raised (the transaction is rolled back).
        """
        ...

    async def ping(self) -> None:
        """Raise ``BackendUnavailable`` unless the database answers."""
        ...


# --- queue ------------------------------------------------------------------------------------


class LeaseState(StrEnum):
    """Result of a lease heartbeat (``Queue.extend_leases``; ``CANCELLED`` only from
    ``ExecutionService.heartbeat_many``, which reads the store when a lease is missing)."""

    EXTENDED = "extended"  # the lease was ours and now lasts ttl longer
    MISSING = "missing"  # the task has no lease (expired, evicted, or the queue lost its data)
    LOST = "lost"  # the lease names another run: stop working on the task
    CANCELLED = (
        "cancelled"  # the run was closed because its task was cancelled: stop, report nothing
    )


@dataclass(frozen=True, slots=True)
class Lease:
    """A run's lease on its task (spec §5 Lease / visibility): who holds it and until when."""

    task_id: UUID
    worker_id: str
    run_id: UUID
    deadline_ms: int  # Unix epoch milliseconds at which the lease ends


class Queue(Protocol):
    """The fast path (spec §5): one ready list per priority, a pending marker per delivered
    task, a lease per running task, and the set of tasks scheduled for later (due); plus, for
    kind-aware routing (issue 15 item 2), a routed list per (priority, kind) that a worker not
    serving the kind moved the task to.

    Every operation takes a batch; a single item is a one-item list, and an empty batch costs
    nothing. Durations are in seconds (float). Nothing here is authoritative: the store wins.
    Adapters wrap their driver's errors as ``BackendUnavailable``. A call cancelled in flight
    (``asyncio.timeout``: the push breaker's trial) may still take effect on the server, but
    leaves nothing for a later call to read (the Redis adapter drops that connection).
    """

    async def enqueue_many(
        self, items: Sequence[tuple[UUID, str]], *, carried: Sequence[CarriedTask] = ()
    ) -> int:
        """For each ``(task_id, priority)``, in order and atomically per item: set the task's
        pending marker (it lives for the adapter's marker TTL) and append the id to the ready
        list of ``priority``, unless a live marker already exists (a delivery is in flight, or
        the id appeared earlier in the batch). One round trip (a batch larger than the adapter's
        chunk, 500 ids on Redis, takes one per chunk, so no call holds the server long).

        ``carried``: snapshots of some of the ``items`` to travel with their ids, so that the
        worker that pops one claims it without reading it (:meth:`carried`). An adapter may
        drop any of them (the Redis adapter keeps one only when its list was empty, so only an
        idle system's pushes carry, and only up to ``CARRY_MAX_BYTES``).

        Returns:
            How many ids were pushed.
        """
        ...

    def carried(self, task_id: UUID) -> CarriedTask | None:
        """The snapshot that came with ``task_id`` when this process popped it
        (``enqueue_many``'s ``carried``), handed out once; None when none came, or when it was
        dropped (an adapter keeps a bounded number, the oldest dropped first). No I/O.

        A snapshot is not the store's word: a claim using it has the store confirm it
        (``TaskRepository.confirm``).
        """
        ...

    async def enqueue_unlisted(self, items: Sequence[tuple[UUID, str, str]]) -> int:
        """The reconciler's ``enqueue_many`` over ``(task_id, priority, kind)``: like it, set
        each marker first; but an id that is still waiting in its ready list or in the routed
        list of its ``(priority, kind)`` (its marker expired during a long backlog, or while no
        worker serves its kind) only gets its marker back and is not pushed a second time,
        however deep it waits. One round trip, whose cost on the queue server grows with the
        ids given, not with the lists' length (issue 17 item 5). An id on neither list is
        pushed onto its ready list.

        Returns:
            How many ids were pushed.
        """
        ...

    async def route(self, items: Sequence[tuple[UUID, str, str]]) -> None:
        """Kind-aware routing (issue 15 item 2): for each ``(task_id, priority, kind)`` popped
        by a worker that does not serve ``kind``, append the id to the routed list of
        ``(priority, kind)``, which only workers serving ``kind`` pop (``pop_many`` with
        ``kinds``), and re-arm its pending marker for a full marker TTL (the delivery is still
        pending: the id is listed again). Atomic per item, one round trip, never re-sent (a
        re-sent push would list the id twice); a lost reply leaves the marker to expire and the
        reconciler to re-push the task.
        """
        ...

    async def release_markers(self, task_ids: Sequence[UUID]) -> None:
        """Drop the pending markers of ``task_ids``; idempotent (spec §5: every exit path of a
        delivery releases its marker). One round trip."""
        ...

    async def pop_many(
        self,
        priorities: Sequence[str],
        timeout: float,
        max_count: int,
        kinds: Collection[str] | None = None,
    ) -> list[UUID]:
        """Take the oldest ids from the ready lists, first tier first: block up to ``timeout``
        for the first id, then take up to ``max_count - 1`` more that are already waiting,
        without blocking. A taken id keeps its marker until the claim releases it.

        With ``kinds`` (kind-aware routing, issue 15 item 2), each tier is the tier's ready
        list plus the routed list of each of ``kinds`` under that priority (``route``); within
        a tier the lists are taken in an order that rotates from one call to the next, so no
        kind's backlog starves another. The ready list still delivers every kind: the claim
        (``ExecutionService.claim_many`` with the same ``kinds``) routes what the worker does
        not serve. ``None`` pops the ready lists alone (the spec's path).

        Args:
            priorities: tier names, highest first (non-empty).
            timeout: seconds to block for the first id; ``<= 0`` means do not block.
            max_count: most ids to return (>= 1).
            kinds: the kinds the popping worker serves, or None.

        Returns:
            Between 0 and ``max_count`` ids; empty when nothing arrived within ``timeout``.

        Raises:
            ValueError: ``max_count < 1``, ``priorities`` is empty or a bare string, or
                ``kinds`` is a bare string.
        """
        ...

    async def schedule(self, task_id: UUID, priority: str, due_at: datetime) -> None:
        """Hold the task for the ready list of ``priority`` until ``due_at`` (aware; millisecond
        precision). Scheduling it again under the same priority moves its due time.

        Raises:
            ValueError: ``due_at`` is naive.
        """
        ...

    async def promote_due(self, limit: int) -> int:
        """Atomically move up to ``limit`` scheduled entries that are due by the queue's clock
        (``server_time``) onto their ready lists, each behind a fresh pending marker; an entry
        whose marker is already set is dropped (that task is already in flight).

        Returns:
            How many ids were pushed onto ready lists.
        """
        ...

    async def set_leases(
        self, leases: Sequence[Lease], ttl: float, *, release: Sequence[UUID] = ()
    ) -> None:
        """Give each task the lease, replacing any lease it had, lasting ``ttl`` seconds; each
        lease is written whole (never seen half-written, never without its expiry). The pending
        markers of ``release`` are dropped too, as :meth:`release_markers` would (a claim's
        Redis side in one call). One round trip.

        Raises:
            ValueError: ``ttl`` is not positive (checked when there are leases).
        """
        ...

    async def extend_leases(self, leases: Sequence[Lease], ttl: float) -> list[LeaseState]:
        """For each lease: if its task's lease names ``lease.run_id``, make it last ``ttl``
        seconds from now and store ``lease.deadline_ms``. One round trip for all of them.

        Returns:
            One state per lease, in order: EXTENDED; MISSING (the task has no lease: the caller
            may re-create it with ``recreate_lease`` after checking the store); or LOST (another
            run holds it; nothing was changed).

        Raises:
            ValueError: ``ttl`` is not positive (checked only when there are leases).
        """
        ...

    async def recreate_lease(self, lease: Lease, ttl: float) -> LeaseState:
        """Re-create a lease the queue lost, atomically: create it with a TTL of ``ttl`` seconds
        only if the task has no lease; if it has one naming ``lease.run_id``, extend it like
        ``extend_leases``; if it names another run, change nothing.

        Returns:
            EXTENDED (created or extended) or LOST (another run holds it). Never MISSING.

        Raises:
            ValueError: ``ttl`` is not positive.
        """
        ...

    async def delete_leases(self, leases: Sequence[tuple[UUID, UUID]]) -> None:
        """For each ``(task_id, run_id)``, drop the task's lease if it names ``run_id`` (a lease
        another run holds is left alone); idempotent. One round trip."""
        ...

    async def leases_present(self, task_ids: Sequence[UUID]) -> set[UUID]:
        """The ids among ``task_ids`` that hold a lease (one round trip)."""
        ...

    async def ping(self) -> None:
        """Raise ``BackendUnavailable`` unless the queue server answers."""
        ...

    # --- reconciler safety (issue 12 bugs 3 and 7) --------------------------------------------

    async def server_time(self) -> datetime:
        """The queue server's clock (aware UTC): the clock ``promote_due`` compares due times
        with, so a caller can measure how far it runs ahead of the database's."""
        ...

    async def epoch(self, token: str) -> QueueEpoch:
        """The identity of the queue's current data set; created from ``token`` when absent.

        The epoch record never expires, so it vanishes only together with the rest of the
        queue's data (a flush, a failover to an empty replica, a restart without persistence).
        Atomic: of several callers finding it absent, one creates it and all see that one.

        Returns:
            The epoch in force and its age by the queue server's clock.
        """
        ...


@dataclass(frozen=True, slots=True)
class CarriedTask:
    """A root task due now and its job, as the submit that created them committed them
    (``queued`` and ``pending``, version 0), carried on the ready list with the task's id
    (``Queue.enqueue_many``) so that the worker popping it claims it in one request: the
    claim has the store confirm both rows (``confirm``) instead of reading them.

    Attributes:
        task: the task, its ``payload`` None (not carried: the store brings it with the
            claim's commit).
        job: its job.
    """

    task: Task
    job: Job


# --- queue inspection (issue 14 item 7: explain) --------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """What the queue holds for one task, read in one round trip (``QueueInspector.inspect``).

    Attributes:
        server_time: the queue server's clock at the read (aware UTC).
        marker_ttl: seconds left on the task's pending marker; None when no marker is held.
        lease: the task's lease (who holds it, its ``deadline_ms``); None when absent.
        lease_ttl: seconds before the lease key expires; None without a lease.
        scheduled_at: the due time of the task's entry in the scheduled set under its
            priority; None when it has none.
        ready_depth: how many ids wait on the ready list of the task's priority.
        ready_position: how many ids would be popped from that list before this task (0: it
            is next); None when it is not on the list, or not found among the ``searched``
            oldest entries.
        searched: how many of the list's oldest entries are known to hold the task or not:
            the whole list (``ready_depth``) when the queue keeps books of its pushes, else
            the adapter's bounded search (position unknown beyond it).
        routed: True when ``ready_depth``, ``ready_position`` and ``searched`` are those of
            the routed list of the task's (priority, kind), where the task was found (kind-aware
            routing, issue 15 item 2); False: those of the priority's ready list.
    """

    server_time: datetime
    marker_ttl: float | None
    lease: Lease | None
    lease_ttl: float | None
    scheduled_at: datetime | None
    ready_depth: int
    ready_position: int | None
    searched: int
    routed: bool = False


class QueueInspector(Protocol):
    """Read-only view of the queue for diagnostics (``GET /v1/tasks/{id}/explain``). Off the
    hot path on purpose: nothing in the claim flow calls it, and it changes nothing."""

    async def inspect(self, task_id: UUID, priority: str, kind: str | None = None) -> QueueSnapshot:
        """The queue's state for ``task_id`` on the ready list and scheduled entry of
        ``priority``, read at one instant in one round trip. An unknown task: an empty snapshot
        (no marker, lease or entry; its list's depth). Idempotent, writes nothing. With
        ``kind``, the routed list of ``(priority, kind)`` is read too, and the snapshot
        describes that list when the task is found there (``routed``).

        Raises:
            BackendUnavailable: the queue server failed or is unreachable.
        """
        ...


@dataclass(frozen=True, slots=True)
class QueueEpoch:
    """The queue's current data set (``Queue.epoch``).

    Attributes:
        id: changes whenever the queue lost its data.
        age: seconds (>= 0) since this data set began, by the queue server's clock.
        created: True when this very call created it (the queue's data was just found lost,
            or this is the queue's first use).
    """

    id: str
    age: float
    created: bool
