"""An in-memory ``Store``: the embedded default of ``dtq dev`` and the fake of the unit tests.

Transactions are serialised by one ``asyncio.Lock`` (trivially serialisable). Each try works on
copies and a private write set that is applied only at commit, so a function that raises leaves
nothing behind. Saves are version-guarded like the SQL adapter's, and conflicts and ambiguous
commits can be injected to exercise the retry paths.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from dtq.adapters.memory.events import EventLog, MemoryEvents
from dtq.adapters.memory.retention import MemoryRetention
from dtq.adapters.memory.sessions import MemorySessions, SessionTables
from dtq.application.filters import (
    JobFilter,
    JobKeyset,
    TaskFilter,
    TaskKeyset,
    job_keyset,
    task_keyset,
)
from dtq.application.ports import Clock, DueTask, RunningTask, Tombstone
from dtq.domain.entities import Job, Task, TaskRun, Worker
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    ConcurrentUpdate,
    DuplicateIdempotencyKey,
    StaleRun,
)
from dtq.domain.events import created_events, job_events, task_events
from dtq.domain.status import RunStatus, TaskStatus
from dtq.domain.tokens import ApiToken, TokenNameTaken
from dtq.domain.webhooks import Webhook

T = TypeVar("T")


class _Tables:
    """The committed state."""

    def __init__(self) -> None:
        self.jobs: dict[UUID, Job] = {}
        self.tasks: dict[UUID, Task] = {}
        self.runs: dict[UUID, TaskRun] = {}
        self.workers: dict[str, Worker] = {}
        self.tokens: dict[UUID, ApiToken] = {}
        self.webhooks: dict[UUID, Webhook] = {}
        self.idempotency: dict[str, UUID] = {}
        self.job_tasks: dict[UUID, list[UUID]] = defaultdict(list)
        self.task_runs: dict[UUID, list[UUID]] = defaultdict(list)
        self.dependents: dict[UUID, list[UUID]] = defaultdict(list)
        self.dependencies: dict[UUID, list[UUID]] = defaultdict(list)
        self.tombstones: dict[str, Tombstone] = {}
        self.events = EventLog()
        self.dashboard = SessionTables()

    def delete_job(self, job_id: UUID) -> None:
        """Drop a job with its tasks, their runs and edges, and its idempotency key."""
        job = self.jobs.pop(job_id, None)
        key = None if job is None else job.idempotency_key
        if key is not None and self.idempotency.get(key) == job_id:
            del self.idempotency[key]
        for task_id in self.job_tasks.pop(job_id, []):
            self.tasks.pop(task_id, None)
            for run_id in self.task_runs.pop(task_id, []):
                self.runs.pop(run_id, None)
            self.dependents.pop(task_id, None)  # edges stay inside one job
            self.dependencies.pop(task_id, None)
        self.events.delete_jobs({job_id})


class InMemoryStore:
    """Implements ``dtq.application.ports.Store`` in process memory.

    Args:
        clock: gives ``Transaction.now()``.
        max_retries: tries of a transaction function on conflict before ``BackendUnavailable``.

    Attributes:
        retries: how many times a transaction function was re-run after a conflict.
        available: set False to make every call raise ``BackendUnavailable`` (outage drills).
    """

    def __init__(self, clock: Clock, *, max_retries: int = 10) -> None:
        self._clock = clock
        self._max_retries = max_retries
        self._tables = _Tables()
        self._lock = asyncio.Lock()
        self._conflicts = 0
        self._ambiguous = 0
        self._lost = 0
        self.retries = 0
        self.available = True

    # -- test hooks ----------------------------------------------------------------------------

    def inject_conflicts(self, count: int) -> None:
        """Make the next ``count`` commits fail with a retryable conflict (like SQLSTATE 40001)."""
        self._conflicts += count

    def inject_ambiguous_commits(self, count: int) -> None:
        """Make the next ``count`` commits apply, then raise ``CommitOutcomeUnknown``."""
        self._ambiguous += count

    def inject_lost_commits(self, count: int) -> None:
        """Make the next ``count`` commits of a transaction that writes a job, task or run
        raise ``CommitOutcomeUnknown`` without applying (the connection lost with the COMMIT
        unsent or unprocessed); a read-only transaction commits as usual."""
        self._lost += count

    # -- Store ---------------------------------------------------------------------------------

    async def run(self, fn: Callable[[_MemoryTransaction], Awaitable[T]]) -> T:
        """Run ``fn`` in a serialised transaction; re-run it on a conflict (see ``Store.run``)."""
        for attempt in range(self._max_retries):
            self._check_available()
            async with self._lock:
                tx = _MemoryTransaction(self._tables, self._clock.now())
                try:
                    result = await fn(tx)
                    if self._conflicts:
                        self._conflicts -= 1
                        raise ConcurrentUpdate("injected serialization failure")
                    if self._lost and tx.writes_rows():
                        self._lost -= 1
                        raise CommitOutcomeUnknown("injected: connection lost before COMMIT")
                    tx.commit()
                except ConcurrentUpdate:
                    self.retries += 1
                    retry = True
                else:
                    retry = False
                if not retry:
                    if self._ambiguous:
                        self._ambiguous -= 1
                        raise CommitOutcomeUnknown("injected: connection lost during COMMIT")
                    return result
            await asyncio.sleep(min(0.001 * 2**attempt, 0.05) * random.random())
        raise BackendUnavailable(f"transaction still conflicting after {self._max_retries} tries")

    async def ping(self) -> None:
        """Raise ``BackendUnavailable`` when marked unavailable."""
        self._check_available()

    def _check_available(self) -> None:
        if not self.available:
            raise BackendUnavailable("in-memory store marked unavailable")


class _MemoryTransaction:
    """One try of a transaction: reads see this try's writes; ``commit`` publishes them."""

    def __init__(self, tables: _Tables, now: datetime) -> None:
        self._t = tables
        self._now = now
        self._jobs: dict[UUID, Job] = {}
        self._tasks: dict[UUID, Task] = {}
        self._runs: dict[UUID, TaskRun] = {}
        self._workers: dict[str, Worker | None] = {}  # None: deleted in this try
        self._tokens: dict[UUID, ApiToken] = {}
        self._webhooks: dict[UUID, Webhook | None] = {}  # None: deleted in this try
        self._new_jobs: list[tuple[Job, list[Task], list[tuple[UUID, UUID]]]] = []
        self.deleted_jobs: set[UUID] = set()
        self.tombstones: dict[str, Tombstone | None] = {}  # None: deleted in this try
        self.jobs = _Jobs(self)
        self.tasks = _Tasks(self)
        self.runs = _Runs(self)
        self.workers = _Workers(self)
        self.tokens = _Tokens(self)
        self.retention = MemoryRetention(self)
        self.events = MemoryEvents(tables.events)
        self.webhooks = _Webhooks(self)
        self.sessions = MemorySessions(self, tables)

    async def now(self) -> datetime:
        """The transaction's fixed timestamp."""
        return self._now

    async def write_time(self, *, not_before: datetime | None = None) -> datetime:
        """The transaction's fixed timestamp (the fake's clock costs no round trip and is
        never estimated, so ``not_before`` has nothing to raise)."""
        return self._now

    # reads through the write set
    def job(self, job_id: UUID) -> Job | None:
        if job_id in self.deleted_jobs:
            return None
        return self._jobs.get(job_id) or self._t.jobs.get(job_id)

    @property
    def new_jobs(self) -> list[tuple[Job, list[Task], list[tuple[UUID, UUID]]]]:
        """Jobs added in this try, with their tasks and edges."""
        return self._new_jobs

    def job_task_ids(self, job_id: UUID) -> list[UUID]:
        """Ids of the job's tasks, committed and added in this try."""
        ids = list(self._t.job_tasks.get(job_id, ()))
        for job, tasks, _ in self._new_jobs:
            if job.id == job_id:
                ids.extend(t.id for t in tasks)
        return ids

    def run_ids(self, task_id: UUID) -> list[UUID]:
        """Ids of the task's runs, committed and added in this try."""
        ids = list(self._t.task_runs.get(task_id, ()))
        ids.extend(r.id for r in self._runs.values() if r.task_id == task_id and r.id not in ids)
        return ids

    def token(self, token_id: UUID) -> ApiToken | None:
        return self._tokens.get(token_id) or self._t.tokens.get(token_id)

    def task(self, task_id: UUID) -> Task | None:
        return self._tasks.get(task_id) or self._t.tasks.get(task_id)

    def run(self, run_id: UUID) -> TaskRun | None:
        return self._runs.get(run_id) or self._t.runs.get(run_id)

    @property
    def tables(self) -> _Tables:
        """The committed state (read by ``MemoryRetention``)."""
        return self._t

    def writes_rows(self) -> bool:
        """Whether this transaction creates or changes a job, task or run."""
        return bool(self._new_jobs or self._jobs or self._tasks or self._runs)

    def _commit_workers(self) -> None:
        for worker_id, worker in self._workers.items():
            if worker is None:
                self._t.workers.pop(worker_id, None)
            else:
                self._t.workers[worker_id] = worker

    def commit(self) -> None:
        t = self._t
        for job, tasks, edges in self._new_jobs:
            if job.idempotency_key is not None:
                t.idempotency[job.idempotency_key] = job.id
            t.job_tasks[job.id].extend(task.id for task in tasks)
            for task_id, dep_id in edges:
                t.dependents[dep_id].append(task_id)
                t.dependencies[task_id].append(dep_id)
        for run in self._runs.values():
            if run.id not in t.runs:
                t.task_runs[run.task_id].append(run.id)
        t.jobs.update(self._jobs)
        t.tasks.update(self._tasks)
        t.runs.update(self._runs)
        self._commit_workers()
        t.tokens.update(self._tokens)
        for webhook_id, webhook in self._webhooks.items():
            if webhook is None:
                t.webhooks.pop(webhook_id, None)
            else:
                t.webhooks[webhook_id] = webhook
        for job_id in self.deleted_jobs:
            t.delete_job(job_id)
        for key, tombstone in self.tombstones.items():
            if tombstone is None:
                t.tombstones.pop(key, None)
            else:
                t.tombstones[key] = tombstone
        t.events.append(self.events.buffer, self._now)
        self.sessions.commit()


class _Jobs:
    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    async def add(
        self, job: Job, tasks: Sequence[Task], edges: Sequence[tuple[UUID, UUID]]
    ) -> None:
        tx = self._tx
        key = job.idempotency_key
        pending_keys = {j.idempotency_key for j, _, _ in tx._new_jobs}
        if key is not None and (key in tx._t.idempotency or key in pending_keys):
            raise DuplicateIdempotencyKey(f"idempotency key {key!r} already used")
        tx._jobs[job.id] = replace(job)
        for task in tasks:
            tx._tasks[task.id] = replace(task)
        tx._new_jobs.append((replace(job), list(tasks), list(edges)))
        tx.events.add_many(created_events(job, tasks))

    async def add_many(
        self, jobs: Sequence[tuple[Job, Sequence[Task], Sequence[tuple[UUID, UUID]]]]
    ) -> None:
        keys = [j.idempotency_key for j, _, _ in jobs if j.idempotency_key is not None]
        if len(keys) != len(set(keys)):
            raise DuplicateIdempotencyKey("two jobs of the group have one Idempotency-Key")
        for job, tasks, edges in jobs:
            await self.add(job, tasks, edges)

    async def get(self, job_id: UUID) -> Job | None:
        job = self._tx.job(job_id)
        return replace(job) if job else None

    async def get_finished(
        self, job_ids: Sequence[UUID], unfinished: Sequence[TaskStatus]
    ) -> list[tuple[Job, bool, bool]]:
        found = []
        for job_id in dict.fromkeys(job_ids):
            tasks = (self._tx.task(i) for i in self._tx.job_task_ids(job_id))
            statuses = {t.status for t in tasks if t is not None}
            if statuses.isdisjoint(unfinished) and (job := await self.get(job_id)) is not None:
                found.append((job, TaskStatus.FAILED in statuses, TaskStatus.CANCELLED in statuses))
        return found

    async def get_by_idempotency_key(self, key: str) -> Job | None:
        tx = self._tx
        for job, _, _ in tx._new_jobs:
            if job.idempotency_key == key:
                return await self.get(job.id)
        job_id = tx._t.idempotency.get(key)
        return await self.get(job_id) if job_id else None

    def confirm(self, job: Job) -> None:
        stored = self._tx.job(job.id)
        if stored is None or repr(stored) != repr(job):  # 1.0 is not 1 here: it is written back
            raise ConcurrentUpdate(f"job {job.id} is not as carried")

    async def save(self, job: Job) -> None:
        await self.save_many([job])

    async def get_many(self, job_ids: Sequence[UUID]) -> list[Job]:
        found = (self._tx.job(i) for i in dict.fromkeys(job_ids))
        return [replace(j) for j in found if j is not None]

    async def save_many(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            stored = self._tx.job(job.id)
            if stored is None or stored.version != job.version:
                raise ConcurrentUpdate(f"job {job.id} changed since it was read")
        for job in jobs:
            job.version += 1
            self._tx.events.add_many(job_events(job))
            job.transitions = ()
            self._tx._jobs[job.id] = replace(job)

    async def list_page(
        self, where: JobFilter, *, after: JobKeyset | None, limit: int
    ) -> list[Job]:
        merged = dict(self._tx._t.jobs)
        merged.update(self._tx._jobs)
        found = sorted(
            (
                j
                for j in merged.values()
                if where.matches(j) and (after is None or job_keyset(j) < after)
            ),
            key=job_keyset,
            reverse=True,
        )
        return [replace(j) for j in found[:limit]]


class _Tasks:
    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    def _job_task_ids(self, job_id: UUID) -> list[UUID]:
        return self._tx.job_task_ids(job_id)

    def _edges(self, index: str, task_id: UUID) -> list[UUID]:
        tx = self._tx
        committed: dict[UUID, list[UUID]] = getattr(tx._t, index)
        ids = list(committed.get(task_id, ()))
        for _, _, edges in tx._new_jobs:
            for child, parent in edges:
                if index == "dependents" and parent == task_id:
                    ids.append(child)
                elif index == "dependencies" and child == task_id:
                    ids.append(parent)
        return ids

    async def get(self, task_id: UUID) -> Task | None:
        task = self._tx.task(task_id)
        return replace(task) if task else None

    async def get_many(self, task_ids: Sequence[UUID], *, for_update: bool = False) -> list[Task]:
        # for_update: transactions run one at a time here, so every read is as good as locked
        found = (self._tx.task(i) for i in dict.fromkeys(task_ids))  # each row once, as SQL
        return [replace(t) for t in found if t is not None]

    async def get_many_with_jobs(self, task_ids: Sequence[UUID]) -> tuple[list[Task], list[Job]]:
        tasks = await self.get_many(task_ids)
        jobs = (self._tx.job(i) for i in dict.fromkeys(t.job_id for t in tasks))
        return tasks, [replace(j) for j in jobs if j is not None]

    async def list_by_job(self, job_id: UUID) -> list[Task]:
        tasks = await self.get_many(self._job_task_ids(job_id))
        return sorted(tasks, key=lambda t: (t.created_at, t.name))

    def confirm(self, task: Task) -> None:
        stored = self._tx.task(task.id)
        if stored is None or repr(replace(stored, payload=None)) != repr(
            replace(task, payload=None)
        ):
            raise ConcurrentUpdate(f"task {task.id} is not as carried")
        task.payload = copy.deepcopy(stored.payload)  # the store's copy, as a database's read

    async def save(self, task: Task) -> None:
        await self.save_many([task])

    async def save_many(self, tasks: Sequence[Task]) -> None:
        for task in tasks:
            stored = self._tx.task(task.id)
            if stored is None or stored.version != task.version:
                raise ConcurrentUpdate(f"task {task.id} changed since it was read")
        for task in tasks:
            task.version += 1
            self._tx.events.add_many(task_events(task))
            task.transitions = ()
            # a result is the handler's own object: store a copy, as a database would
            self._tx._tasks[task.id] = replace(
                task, result=copy.deepcopy(task.result), progress=copy.deepcopy(task.progress)
            )

    async def save_progress(self, updates: Sequence[tuple[UUID, UUID, Any]]) -> set[UUID]:
        written: set[UUID] = set()
        for task_id, run_id, value in updates:
            stored = self._tx.task(task_id)
            if stored is None:
                continue
            task = replace(stored)  # version left alone, as UPDATE_PROGRESS does
            try:
                task.record_progress(run_id, copy.deepcopy(value))
            except StaleRun:
                continue
            self._tx._tasks[task_id] = task
            written.add(task_id)
        return written

    async def dependents(self, task_id: UUID) -> list[UUID]:
        return self._edges("dependents", task_id)

    async def dependencies(self, task_id: UUID) -> list[UUID]:
        return sorted(self._edges("dependencies", task_id))

    async def parent_results(self, task_ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
        found: dict[UUID, dict[str, Any]] = {}
        for task_id in dict.fromkeys(task_ids):
            parents = [self._tx.task(p) for p in self._edges("dependencies", task_id)]
            if parents:
                found[task_id] = {p.name: copy.deepcopy(p.result) for p in parents if p is not None}
        return found

    async def results_page(
        self,
        job_id: UUID,
        *,
        after: tuple[int, UUID] | None,
        limit: int,
        for_update: bool = False,
    ) -> list[Task]:
        tasks = sorted(
            await self.get_many(self._job_task_ids(job_id)), key=lambda t: (t.position, t.id)
        )
        if after is not None:
            tasks = [t for t in tasks if (t.position, t.id) > after]
        return tasks[:limit]

    async def dependents_many(self, task_ids: Sequence[UUID]) -> list[tuple[UUID, UUID]]:
        return [
            (parent, child)
            for parent in dict.fromkeys(task_ids)
            for child in self._edges("dependents", parent)
        ]

    async def dependencies_completed(self, task_id: UUID) -> bool:
        for dep_id in self._edges("dependencies", task_id):
            dep = self._tx.task(dep_id)
            if dep is None or dep.status is not TaskStatus.COMPLETED:
                return False
        return True

    async def dependency_has_status(self, task_id: UUID, statuses: Sequence[TaskStatus]) -> bool:
        wanted = set(statuses)
        for dep_id in self._edges("dependencies", task_id):
            dep = self._tx.task(dep_id)
            if dep is not None and dep.status in wanted:
                return True
        return False

    async def job_has_status(self, job_id: UUID, statuses: Sequence[TaskStatus]) -> bool:
        wanted = set(statuses)
        for task_id in self._job_task_ids(job_id):
            task = self._tx.task(task_id)
            if task is not None and task.status in wanted:
                return True
        return False

    def _all(self) -> list[Task]:
        merged = dict(self._tx._t.tasks)
        merged.update(self._tx._tasks)
        return list(merged.values())

    def _matching(self, where: TaskFilter, after: TaskKeyset | None, limit: int) -> list[Task]:
        found = sorted(
            (
                t
                for t in self._all()
                if where.matches(t) and (after is None or task_keyset(t) < after)
            ),
            key=task_keyset,
            reverse=True,
        )
        return found[:limit]

    async def list_page(
        self, where: TaskFilter, *, after: TaskKeyset | None, limit: int
    ) -> list[Task]:
        return [
            replace(t, payload=None, result=None, progress=None)
            for t in self._matching(where, after, limit)
        ]

    async def matching_task_ids(
        self, where: TaskFilter, *, after: TaskKeyset | None, limit: int
    ) -> list[TaskKeyset]:
        return [task_keyset(t) for t in self._matching(where, after, limit)]

    async def count_by_status(self, job_id: UUID) -> dict[TaskStatus, int]:
        counts: dict[TaskStatus, int] = {}
        for task_id in self._job_task_ids(job_id):
            task = self._tx.task(task_id)
            if task is not None:
                counts[task.status] = counts.get(task.status, 0) + 1
        return counts

    async def due_queued(
        self, *, now: datetime, after: tuple[datetime, UUID] | None, limit: int
    ) -> list[DueTask]:
        due = sorted(
            (t.scheduled_at, t.id, t.priority, t.kind)
            for t in self._all()
            if t.status is TaskStatus.QUEUED and t.scheduled_at <= now
        )
        if after is not None:
            due = [d for d in due if (d[0], d[1]) > after]
        return [DueTask(id=i, priority=p, scheduled_at=at, kind=k) for at, i, p, k in due[:limit]]

    async def stale_running(
        self, *, started_before: datetime, after: UUID | None, limit: int
    ) -> list[RunningTask]:
        stale = sorted(
            (
                t
                for t in self._all()
                if t.status is TaskStatus.RUNNING
                and t.started_at is not None
                and t.started_at < started_before
                and t.current_run_id is not None
                and (after is None or t.id > after)
            ),
            key=lambda t: t.id,
        )
        return [
            RunningTask(
                id=t.id, run_id=t.current_run_id, priority=t.priority, started_at=t.started_at
            )
            for t in stale[:limit]
            if t.current_run_id is not None and t.started_at is not None
        ]


class _Runs:
    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    async def add_many(self, runs: Sequence[TaskRun]) -> None:
        for run in runs:
            self._tx._runs[run.id] = replace(run)

    async def get(self, run_id: UUID) -> TaskRun | None:
        run = self._tx.run(run_id)
        return replace(run) if run else None

    async def get_many(self, run_ids: Sequence[UUID]) -> list[TaskRun]:
        found = (self._tx.run(i) for i in dict.fromkeys(run_ids))
        return [replace(r) for r in found if r is not None]

    async def save(self, run: TaskRun) -> None:
        await self.save_many([run])

    async def save_many(self, runs: Sequence[TaskRun]) -> None:
        for run in runs:
            stored = self._tx.run(run.id)
            if stored is None or stored.status is not RunStatus.RUNNING:
                raise ConcurrentUpdate(f"run {run.id} already ended")
        for run in runs:
            self._tx._runs[run.id] = replace(run)

    async def list_for_task(self, task_id: UUID) -> list[TaskRun]:
        tx = self._tx
        ids = list(tx._t.task_runs.get(task_id, ()))
        ids.extend(r.id for r in tx._runs.values() if r.task_id == task_id and r.id not in ids)
        runs = [replace(r) for r in (tx.run(i) for i in ids) if r is not None]
        return sorted(runs, key=lambda r: (r.started_at, str(r.id)))


class _Workers:
    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    async def upsert(self, worker: Worker) -> None:
        self._tx._workers[worker.id] = replace(worker, metadata=dict(worker.metadata))

    async def list_active(self, since: datetime) -> list[Worker]:
        merged: dict[str, Worker | None] = dict(self._tx._t.workers)
        merged.update(self._tx._workers)
        active = [
            replace(w) for w in merged.values() if w is not None and w.last_heartbeat_at >= since
        ]
        return sorted(active, key=lambda w: w.last_heartbeat_at, reverse=True)

    async def get(self, worker_id: str) -> Worker | None:
        tx = self._tx
        worker = (
            tx._workers[worker_id] if worker_id in tx._workers else tx._t.workers.get(worker_id)
        )
        return None if worker is None else replace(worker, metadata=dict(worker.metadata))

    async def delete(self, worker_id: str) -> bool:
        found = await self.get(worker_id) is not None
        self._tx._workers[worker_id] = None
        return found


class _Tokens:
    """``ApiTokenRepository`` over the committed tokens plus this try's writes (tokens are
    frozen values, so no copies are needed)."""

    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    def _merged(self) -> dict[UUID, ApiToken]:
        merged = dict(self._tx._t.tokens)
        merged.update(self._tx._tokens)
        return merged

    async def add(self, token: ApiToken) -> None:
        if any(t.name == token.name for t in self._merged().values()):
            raise TokenNameTaken(f"a token named {token.name!r} already exists", field="name")
        self._tx._tokens[token.id] = token

    async def get_by_hash(self, secret_hash: str) -> ApiToken | None:
        return next((t for t in self._merged().values() if t.secret_hash == secret_hash), None)

    async def get_by_name(self, name: str) -> ApiToken | None:
        return next((t for t in self._merged().values() if t.name == name), None)

    async def list_all(self) -> list[ApiToken]:
        return sorted(self._merged().values(), key=lambda t: t.name)

    async def set_revoked(self, token_id: UUID, at: datetime) -> bool:
        token = self._merged().get(token_id)
        if token is None or token.revoked_at is not None:
            return False
        self._tx._tokens[token_id] = token.revoke(at=at)
        return True


class _Webhooks:
    """``WebhookRepository`` over the committed webhooks plus this try's writes (frozen values)."""

    def __init__(self, tx: _MemoryTransaction) -> None:
        self._tx = tx

    def _merged(self) -> dict[UUID, Webhook]:
        merged: dict[UUID, Webhook | None] = dict(self._tx._t.webhooks)
        merged.update(self._tx._webhooks)
        return {k: v for k, v in merged.items() if v is not None}

    async def add(self, webhook: Webhook) -> None:
        self._tx._webhooks[webhook.id] = webhook

    async def get(self, webhook_id: UUID) -> Webhook | None:
        return self._merged().get(webhook_id)

    async def list_all(self) -> list[Webhook]:
        return sorted(self._merged().values(), key=lambda w: (w.created_at, w.id))

    async def delete(self, webhook_id: UUID) -> bool:
        if webhook_id not in self._merged():
            return False
        self._tx._webhooks[webhook_id] = None
        return True

    async def replace(self, expected: Webhook, new: Webhook) -> bool:
        current = self._merged().get(expected.id)
        if current is None or (
            current.cursor_at,
            current.cursor_id,
            current.next_attempt_at,
        ) != (expected.cursor_at, expected.cursor_id, expected.next_attempt_at):
            return False
        self._tx._webhooks[expected.id] = replace(
            current,
            cursor_at=new.cursor_at,
            cursor_id=new.cursor_id,
            attempts=new.attempts,
            next_attempt_at=new.next_attempt_at,
            last_status=new.last_status,
            last_error=new.last_error,
            last_attempt_at=new.last_attempt_at,
            delivered=new.delivered,
        )
        return True
