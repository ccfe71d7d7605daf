"""Explain: why a task is (not) running (issue 14 item 7), one stable reason code per answer.

Decision order (each staged situation answers exactly one code; ARCHITECTURE.md "Explain"):

1. ``terminal`` — the task is ``completed``, ``failed`` or ``cancelled``.
2. ``waiting_on_dependencies`` — ``pending``: some dependency is not ``completed``.
3. ``running`` / ``lease_lost`` — ``running``: the queue holds a lease naming the task's live
   run (``running``), or it does not (``lease_lost``: the reconciler reclaims it once the run
   is older than ``STALE_RUNNING_AFTER``).
4. ``scheduled`` — ``queued`` with ``scheduled_at`` after now (a delay, or a retry's backoff).
5. ``queued_no_worker`` — ``queued`` and due, and no live worker both polls its priority and
   registered its kind (the registry; no queue read).
6. ``queued`` — due and served, and its id waits on its ready list (depth and position), or is
   on no list and holds no marker (the reconciler pushes it within one interval).
7. ``delivery_in_flight`` — due and served, its pending marker held but the id is not on the
   ready list: a worker popped it and is claiming it, or the delivery was lost and the marker
   blocks a re-push until its TTL.

Steps 1, 2, 4 and 5 read the database only and answer during a Redis outage; steps 3, 6 and 7
read the queue once (``QueueInspector.inspect``) and raise ``BackendUnavailable`` (HTTP 503)
when it cannot be read: an answer that guessed would name the wrong code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

from dtq.application.fleet import Fleet, FleetService, Missing, describe_missing
from dtq.application.ports import QueueInspector, QueueSnapshot, Store, Transaction
from dtq.domain.entities import Task, TaskRun
from dtq.domain.errors import TaskNotFound
from dtq.domain.status import TaskStatus

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TERMINAL = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class Reason(StrEnum):
    """The stable reason codes of ``GET /v1/tasks/{id}/explain``."""

    TERMINAL = "terminal"
    WAITING_ON_DEPENDENCIES = "waiting_on_dependencies"
    RUNNING = "running"
    LEASE_LOST = "lease_lost"
    SCHEDULED = "scheduled"
    QUEUED_NO_WORKER = "queued_no_worker"
    QUEUED = "queued"
    DELIVERY_IN_FLIGHT = "delivery_in_flight"


@dataclass(frozen=True, slots=True)
class Explanation:
    """One answer of explain.

    Attributes:
        task_id: the task explained.
        status: its status in the database.
        reason: the one code the decision order picked.
        message: a sentence for people; its wording may change, the code does not.
        details: the facts behind the code (JSON-ready values, datetimes aware UTC, durations
            in seconds); the keys per code are listed in the README.
    """

    task_id: UUID
    status: TaskStatus
    reason: Reason
    message: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Read:
    """What one database transaction gathered for the task."""

    task: Task
    now: datetime
    dependencies: list[Task]
    run: TaskRun | None
    fleet: Fleet | None


def _at(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


class ExplainService:
    """Answers explain from the store, the worker registry and the queue (ports only).

    Args:
        store: the system of record.
        inspector: the read-only view of the queue.
        fleet: the live workers' advertisements (read fresh, not from the submit cache).
        stale_running_after: ``STALE_RUNNING_AFTER`` in seconds (when a run without a lease
            becomes reclaimable).
        reconcile_interval: ``RECONCILE_INTERVAL`` in seconds.
    """

    def __init__(
        self,
        *,
        store: Store,
        inspector: QueueInspector,
        fleet: FleetService,
        stale_running_after: float,
        reconcile_interval: float,
    ) -> None:
        self._store = store
        self._inspector = inspector
        self._fleet = fleet
        self._stale_after = timedelta(seconds=stale_running_after)
        self._interval = reconcile_interval

    async def explain(self, task_id: UUID) -> Explanation:
        """Why ``task_id`` is in its state, by the decision order of the module docstring.

        Raises:
            TaskNotFound: unknown id (field ``id``).
            BackendUnavailable: the database failed, or the queue did when the code depends on
                it (``running``/``lease_lost``/``queued``/``delivery_in_flight``).
        """
        read = await self._store.run(lambda tx: self._read(tx, task_id))
        task = read.task
        if task.status in _TERMINAL:
            return self._terminal(read)
        if task.status is TaskStatus.PENDING:
            return self._waiting(read)
        if task.status is TaskStatus.QUEUED and task.scheduled_at > read.now:
            return self._scheduled(read)
        if task.status is TaskStatus.QUEUED and read.fleet is not None:
            missing = read.fleet.missing(task.kind, task.priority)
            if missing:
                return self._no_worker(read, read.fleet, missing)
        # the task may wait on its priority's ready list or, kind-aware routing (issue 15
        # item 2), on the routed list of its (priority, kind): the inspector reads both
        snapshot = await self._inspector.inspect(task.id, task.priority, task.kind)
        if task.status is TaskStatus.RUNNING:
            return self._running(read, snapshot)
        return self._queued(read, snapshot)

    async def _read(self, tx: Transaction, task_id: UUID) -> _Read:
        task = await tx.tasks.get(task_id)
        if task is None:
            raise TaskNotFound(f"task {task_id} not found", field="id")
        now = await tx.now()
        dependencies: list[Task] = []
        run = fleet = None
        if task.status is TaskStatus.PENDING:
            found = await tx.tasks.get_many(await tx.tasks.dependencies(task_id))
            dependencies = sorted(found, key=lambda t: (t.position, t.name))
        elif task.status is TaskStatus.RUNNING and task.current_run_id is not None:
            run = await tx.runs.get(task.current_run_id)
        elif task.status is TaskStatus.QUEUED and task.scheduled_at <= now:
            fleet = await self._fleet.read(tx)
        elif task.status in _TERMINAL:
            runs = await tx.runs.list_for_task(task_id)
            run = runs[-1] if runs else None
        return _Read(task, now, dependencies, run, fleet)

    def _answer(self, read: _Read, reason: Reason, message: str, **details: Any) -> Explanation:
        return Explanation(read.task.id, read.task.status, reason, message, details)

    def _terminal(self, read: _Read) -> Explanation:
        task, run = read.task, read.run
        last_run = None
        if run is not None:
            last_run = {"id": run.id, "status": run.status.value, "error": run.error}
        how = f"task {task.status.value}"
        if task.last_error and task.status is not TaskStatus.COMPLETED:
            how += f": {task.last_error}"
        return self._answer(
            read,
            Reason.TERMINAL,
            how,
            status=task.status.value,
            finished_at=task.finished_at,
            last_error=task.last_error,
            attempts=task.attempt,
            max_attempts=task.max_attempts,
            last_run=last_run,
        )

    def _waiting(self, read: _Read) -> Explanation:
        deps = [
            {"task_id": d.id, "name": d.name, "status": d.status.value} for d in read.dependencies
        ]
        waiting = [d.name for d in read.dependencies if d.status is not TaskStatus.COMPLETED]
        message = f"waiting on {len(waiting)} of {len(deps)} dependencies: {', '.join(waiting)}"
        return self._answer(
            read,
            Reason.WAITING_ON_DEPENDENCIES,
            message,
            dependencies=deps,
            waiting_on=waiting,
            scheduled_at=read.task.scheduled_at,
        )

    def _scheduled(self, read: _Read) -> Explanation:
        task = read.task
        # a first attempt's due time came from run_at or delay: the task does not say which
        message = f"scheduled: due at {task.scheduled_at.isoformat()}"
        if task.attempt > 0:
            message += " (a retry's backoff)"
        return self._answer(
            read,
            Reason.SCHEDULED,
            message,
            scheduled_at=task.scheduled_at,
            due_in=(task.scheduled_at - read.now).total_seconds(),
            attempt=task.attempt,
        )

    def _no_worker(self, read: _Read, fleet: Fleet, missing: tuple[Missing, ...]) -> Explanation:
        task = read.task
        sentences = [describe_missing(m, task.kind, task.priority) for m in missing]
        return self._answer(
            read,
            Reason.QUEUED_NO_WORKER,
            "; ".join(sentences) + ": the task stays queued until a worker serves it",
            kind=task.kind,
            priority=task.priority,
            missing=[m.value for m in missing],
            live_workers=len(fleet.workers),
            alive_within=fleet.alive_within,
        )

    def _running(self, read: _Read, snap: QueueSnapshot) -> Explanation:
        task, run = read.task, read.run
        worker_id = run.worker_id if run is not None else None
        lease = snap.lease
        if lease is not None and lease.run_id == task.current_run_id:
            deadline = _at(lease.deadline_ms)
            message = f"running on worker {lease.worker_id}, lease until {deadline.isoformat()}"
            if deadline < read.now:  # the key outlives its deadline by the lease TTL's buffer
                message = (
                    f"running on worker {lease.worker_id}, whose lease ran out at"
                    f" {deadline.isoformat()} without a renewal: once the lease's key expires"
                    " (the lease TTL's buffer after that), the reconciler reclaims the run"
                )
            return self._answer(
                read,
                Reason.RUNNING,
                message,
                worker_id=lease.worker_id,
                run_id=task.current_run_id,
                attempt=task.attempt,
                started_at=task.started_at,
                lease_deadline=deadline,
                lease_ttl=snap.lease_ttl,
            )
        started = task.started_at or read.now
        reclaim_after = started + self._stale_after
        held_by = None if lease is None else lease.run_id
        return self._answer(
            read,
            Reason.LEASE_LOST,
            "running without a live lease: the reconciler reclaims it on its first pass after"
            f" {reclaim_after.isoformat()} (every {self._interval:g}s)",
            worker_id=worker_id,
            run_id=task.current_run_id,
            started_at=task.started_at,
            reclaim_after=reclaim_after,
            reconcile_interval=self._interval,
            lease_held_by_run=held_by,
        )

    def _queued(self, read: _Read, snap: QueueSnapshot) -> Explanation:
        task = read.task
        listed = snap.ready_position is not None
        unsearched = snap.ready_depth > snap.searched
        if snap.marker_ttl is not None and not listed and not unsearched:
            return self._answer(
                read,
                Reason.DELIVERY_IN_FLIGHT,
                "a delivery is in flight (popped by a worker, or lost): its pending marker"
                f" blocks a re-push for {snap.marker_ttl:g}s more",
                priority=task.priority,
                marker_ttl=snap.marker_ttl,
                ready_depth=snap.ready_depth,
            )
        if listed and snap.routed:
            message = (
                f"queued on priority {task.priority!r}, routed to the workers of kind"
                f" {task.kind!r}: {snap.ready_position} ahead of it, {snap.ready_depth} waiting"
            )
        elif listed:
            message = (
                f"queued on priority {task.priority!r}: {snap.ready_position} ahead of it,"
                f" {snap.ready_depth} waiting"
            )
        elif unsearched:
            message = (
                f"queued on priority {task.priority!r}: {snap.ready_depth} waiting; not among"
                f" the oldest {snap.searched}"
            )
        else:
            message = (
                f"queued but on no ready list: the reconciler pushes it within {self._interval:g}s"
            )
        return self._answer(
            read,
            Reason.QUEUED,
            message,
            priority=task.priority,
            ready_depth=snap.ready_depth,
            position=snap.ready_position,
            on_ready_list=listed if listed or not unsearched else None,
            routed=snap.routed,
            marker_ttl=snap.marker_ttl,
            scheduled_entry=snap.scheduled_at,
        )
