"""One-item calls of the ports' batch operations, for tests that handle one id at a time.

The ports keep one batch form per operation (a single item is a one-item list); these helpers
only spell that list for the many tests that push, pop, claim or complete a single task.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID, uuid4

from dtq.application.commands import Claim, ReportOutcome
from dtq.application.execution import ExecutionService
from dtq.application.ports import CarriedTask, Queue
from dtq.domain.entities import Job, Task
from dtq.domain.status import JobStatus, TaskStatus


async def enqueue_one(queue: Queue, task_id: UUID, priority: str) -> bool:
    """``enqueue_many`` of one id: True when it was pushed (no live marker)."""
    return await queue.enqueue_many([(task_id, priority)]) == 1


async def pop_one(queue: Queue, priorities: Sequence[str], timeout: float) -> UUID | None:
    """``pop_many`` of at most one id, or None when nothing arrived within ``timeout`` s."""
    found = await queue.pop_many(priorities, timeout, 1)
    return found[0] if found else None


async def claim_one(execution: ExecutionService, task_id: UUID, worker_id: str) -> Claim | None:
    """``claim_many`` of one popped id: the claim, or None when it was not claimable."""
    claims = await execution.claim_many([task_id], worker_id)
    return claims[0] if claims else None


async def complete_one(execution: ExecutionService, claim: Claim) -> ReportOutcome:
    """``complete_many`` of one claim."""
    return (await execution.complete_many([claim]))[0]


def queued_task(job_id: UUID, at: datetime, *, name: str = "a", kind: str = "k") -> Task:
    """A fresh ``queued`` task of ``job_id`` (version 0, no payload), dated ``at``."""
    return Task(
        id=uuid4(),
        job_id=job_id,
        name=name,
        kind=kind,
        payload=None,
        status=TaskStatus.QUEUED,
        scheduled_at=at,
        created_at=at,
        updated_at=at,
    )


def carried_snapshot() -> CarriedTask:
    """The snapshot a lone submit of a fresh one-task job carries with its task's id (a
    ``queued`` task at version 0 and its ``pending`` job, dated now, without a payload)."""
    now = datetime.now(UTC)
    job = Job(id=uuid4(), name="", status=JobStatus.PENDING, created_at=now, updated_at=now)
    return CarriedTask(task=queued_task(job.id, now), job=job)
