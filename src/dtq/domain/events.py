"""Transition events: what the outbox records for every task and job status change (issue 16
item 1).

Entities append a :class:`Transition` to their ``transitions`` each time their status moves (the
one guard of each entity does it, so no path can forget). The repositories that write an entity
turn its transitions into :class:`NewEvent` values with :func:`task_events` / :func:`job_events`
and hand them to the transaction's outbox, which writes them in the same transaction as the
change. Nothing here reads a clock or assigns ids: the store gives each event its id and its
ordering time when it writes it.

Event types are stable names, ``task.<status>`` and ``job.<status>`` for the status entered,
plus ``job.submitted`` for a new job (its first status is in ``data``):

=================  ======================================================================
type               when (``data.cause``)
=================  ======================================================================
task.pending       submitted behind dependencies (``submitted``); manual retry while a
                   dependency is unfinished (``retried``)
task.queued        submitted ready (``submitted``); promoted (``promoted``); a failed run
                   with attempts left (``retry``); a lost worker (``reclaimed``); a
                   shutdown hand-back (``handed_back``); manual retry (``retried``)
task.running       claimed by a worker (``claimed``)
task.completed     the handler succeeded (``succeeded``)
task.failed        the last attempt failed or the error was permanent (``failed``); a
                   dependency failed (``cascade``); the crash budget ran out (``reclaimed``)
task.cancelled     cancelled by a user (``cancelled``); a dependency was cancelled
                   (``cascade``)
job.submitted      the job was created
job.pending        (re)opened with nothing started, after a manual retry
job.running        a task of the job started, or a manual retry reopened it
job.completed      every task completed
job.failed         some task failed
job.cancelled      every task terminal, some cancelled, none failed
=================  ======================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from dtq.domain.entities import Job, Task

#: Every event type, in lifecycle order (the API refuses a ``kinds`` filter naming another).
EVENT_TYPES: tuple[str, ...] = (
    "job.submitted",
    "task.pending",
    "task.queued",
    "task.running",
    "task.completed",
    "task.failed",
    "task.cancelled",
    "job.pending",
    "job.running",
    "job.completed",
    "job.failed",
    "job.cancelled",
)


@dataclass(frozen=True, slots=True)
class Transition:
    """One status move of an entity: from ``source`` (None at creation) to ``target``, and why.

    ``cause`` is one of the causes listed in the module docstring.
    """

    source: str | None
    target: str
    cause: str


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An outbox row before the store writes it (id and time are the store's).

    Attributes:
        job_id: the job the event belongs to (every event has one).
        task_id: the task, or None for a job event.
        type: one of :data:`EVENT_TYPES`.
        data: a small JSON object (see :func:`task_events`, :func:`job_events`).
    """

    job_id: UUID
    task_id: UUID | None
    type: str
    data: dict[str, Any] = field(default_factory=dict)


def task_events(task: Task) -> list[NewEvent]:
    """The events of ``task``'s recorded transitions, oldest first.

    ``data`` holds ``from``, ``cause``, ``name``, ``kind`` and ``attempt``, and where they apply
    ``run_id`` (entering ``running``), ``error`` (a failure, retry or reclaim: the task's
    ``last_error``) and ``scheduled_at`` (entering ``queued``: when it is due, ISO 8601).
    Values are those of the task as it is written (a transaction moves a task once in practice).
    """
    events = []
    for move in task.transitions:
        data: dict[str, Any] = {
            "from": move.source,
            "cause": move.cause,
            "name": task.name,
            "kind": task.kind,
            "attempt": task.attempt,
        }
        if move.target == "running" and task.current_run_id is not None:
            data["run_id"] = str(task.current_run_id)
        if move.cause in ("failed", "retry", "reclaimed", "cascade") and task.last_error:
            data["error"] = task.last_error
        if move.target == "queued":
            data["scheduled_at"] = task.scheduled_at.isoformat()
        events.append(NewEvent(task.job_id, task.id, f"task.{move.target}", data))
    return events


def job_events(job: Job) -> list[NewEvent]:
    """The events of ``job``'s recorded transitions, oldest first: ``job.submitted`` for its
    creation (``data.status``: its first status), else ``job.<status>`` (``data.from``)."""
    events = []
    for move in job.transitions:
        if move.source is None:
            events.append(NewEvent(job.id, None, "job.submitted", {"status": move.target}))
        else:
            events.append(NewEvent(job.id, None, f"job.{move.target}", {"from": move.source}))
    return events


def created_events(job: Job, tasks: Sequence[Task]) -> list[NewEvent]:
    """The events of a job being submitted: ``job.submitted``, then one ``task.<status>`` per
    task in submission order (``cause`` ``submitted``)."""
    events = [NewEvent(job.id, None, "job.submitted", {"status": str(job.status)})]
    for task in tasks:
        data = {
            "from": None,
            "cause": "submitted",
            "name": task.name,
            "kind": task.kind,
            "attempt": task.attempt,
        }
        if task.status == "queued":
            data["scheduled_at"] = task.scheduled_at.isoformat()
        events.append(NewEvent(job.id, task.id, f"task.{task.status}", data))
    return events
