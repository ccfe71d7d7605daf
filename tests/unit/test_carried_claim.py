"""A lone claim from the snapshot its pop brought (``Queue.carried``, ``CarriedTask``), on the
memory adapters: what a lone submit carries, what the claim takes from it, and that a snapshot
is never the store's word (``TaskRepository.confirm``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from uuid import UUID

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import CARRIED_KEPT, InMemoryQueue
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.control import ControlService
from dtq.application.events import EventService
from dtq.application.ports import CarriedTask
from dtq.domain.events import Transition
from dtq.domain.status import JobStatus, TaskStatus
from tests.unit.conftest import App

PAYLOAD = {"b": [1, 2], "a": "x"}


async def submit_one(app: App, **spec: object) -> UUID:
    result = await app.submit_tasks(TaskSpec("t", "k", payload=PAYLOAD, **spec))  # type: ignore[arg-type]
    return result.task_ids["t"]


async def pop(app: App) -> list[UUID]:
    return await app.queue.pop_many(["default"], timeout=0, max_count=10)


async def test_a_lone_submit_carries_its_task_and_job_without_the_payload(app: App) -> None:
    task_id = await submit_one(app)

    assert await pop(app) == [task_id]
    carried = app.queue.carried(task_id)

    assert carried is not None
    stored = (await app.queries.get_task(task_id)).task
    assert carried.task == replace(stored, payload=None)
    assert carried.task.payload is None and carried.task.transitions == ()
    assert carried.job.id == stored.job_id and carried.job.status is JobStatus.PENDING
    assert app.queue.carried(task_id) is None  # handed out once


async def test_what_does_not_qualify_carries_nothing(app: App) -> None:
    """A job of two tasks (its first claim changes the job the other would carry), a task
    due later (pushed by the promoter), a group of submits (answered at their commit, under
    load), and a push onto a list that already holds an id."""
    two = await app.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k"))))
    later = await submit_one(app, delay=timedelta(seconds=5))
    behind = await submit_one(app)  # the list holds the two-task job's ids

    popped = await pop(app)

    assert set(popped) == {*two.task_ids.values(), behind}
    assert all(app.queue.carried(task_id) is None for task_id in [*popped, later])


async def test_a_claim_from_a_snapshot_delivers_the_stored_payload_and_writes_the_claim(
    app: App,
) -> None:
    task_id = await submit_one(app)
    [popped] = await pop(app)

    [claim] = await app.execution.claim_many([popped], "w1")

    assert claim.task.id == task_id and claim.task.payload == PAYLOAD
    stored = (await app.queries.get_task(task_id)).task
    assert stored.status is TaskStatus.RUNNING and stored.current_run_id == claim.run.id
    assert (await app.queries.get_job(stored.job_id)).job.status is JobStatus.RUNNING
    assert app.queue.carried(task_id) is None  # used up


class ForgedQueue(InMemoryQueue):
    """A queue whose pops bring a snapshot that is not the stored row."""

    def __init__(self, forged: dict[UUID, CarriedTask]) -> None:
        super().__init__(FakeClock())
        self.forged = forged

    def carried(self, task_id: UUID) -> CarriedTask | None:
        return self.forged.pop(task_id, None)


async def test_a_snapshot_that_is_not_the_stored_row_is_refused_and_the_task_read(
    app: App,
) -> None:
    """The claim neither runs the snapshot's kind nor writes its max_attempts back: the store
    refuses it and the claim's re-run reads the row."""
    task_id = await submit_one(app)
    [popped] = await pop(app)
    real = app.queue.carried(popped)
    assert real is not None
    forged = replace(real.task, kind="other", max_attempts=9)
    queue = ForgedQueue({task_id: CarriedTask(task=forged, job=real.job)})
    execution = type(app.execution)(store=app.store, queue=queue, policy=app.execution.policy)

    [claim] = await execution.claim_many([task_id], "w1")

    assert (claim.task.kind, claim.task.max_attempts) == ("k", 3)
    stored = (await app.queries.get_task(task_id)).task
    assert (stored.kind, stored.max_attempts, stored.status) == ("k", 3, TaskStatus.RUNNING)


async def test_a_snapshot_of_a_task_cancelled_since_is_not_claimed(app: App) -> None:
    task_id = await submit_one(app)
    [popped] = await pop(app)
    await ControlService(store=app.store, queue=app.queue).cancel_task(task_id)

    assert await app.execution.claim_many([popped], "w1") == []
    assert (await app.queries.get_task(task_id)).task.status is TaskStatus.CANCELLED


async def test_the_memory_queue_keeps_a_bounded_number_of_snapshots(app: App) -> None:
    ids: list[UUID] = []
    for _ in range(CARRIED_KEPT + 5):
        ids.append(await submit_one(app))
        await pop(app)  # the list empties, so each submit carries

    kept: Sequence[CarriedTask | None] = [app.queue.carried(task_id) for task_id in ids]
    assert kept[:5] == [None] * 5  # the oldest dropped
    assert all(c is not None for c in kept[5:])


async def test_transitions_a_snapshot_brings_are_not_recorded(app: App) -> None:
    """A snapshot's entities arrive with a ``transitions`` field (the outbox's input); none of
    it is the claim's: a forged ``task.failed`` or ``job.completed`` never becomes an event."""
    task_id = await submit_one(app)
    [popped] = await pop(app)
    real = app.queue.carried(popped)
    assert real is not None
    forged = CarriedTask(
        task=replace(real.task, transitions=(Transition("queued", "failed", "forged"),)),
        job=replace(real.job, transitions=(Transition("pending", "completed", "forged"),)),
    )
    queue = ForgedQueue({task_id: forged})
    execution = type(app.execution)(store=app.store, queue=queue, policy=app.execution.policy)

    [claim] = await execution.claim_many([task_id], "w1")

    events = await EventService(store=app.store).page(after=None, limit=100)
    assert [(e.type, e.data.get("cause")) for e in events if e.type != "job.submitted"] == [
        ("task.queued", "submitted"),
        ("task.running", "claimed"),
        ("job.running", None),
    ]
    assert claim.task.transitions == () and claim.task.status is TaskStatus.RUNNING


async def test_a_snapshot_spelling_a_value_otherwise_is_refused(app: App) -> None:
    """``1.0 == 1`` in Python, but the claim writes the job back from the snapshot: the memory
    store refuses a snapshot whose metadata is spelled otherwise, as the database does."""
    result = await app.submit_tasks(TaskSpec("t", "k"), metadata={"n": 1})
    task_id = result.task_ids["t"]
    [popped] = await pop(app)
    real = app.queue.carried(popped)
    assert real is not None
    forged = CarriedTask(task=real.task, job=replace(real.job, metadata={"n": 1.0}))
    queue = ForgedQueue({task_id: forged})
    execution = type(app.execution)(store=app.store, queue=queue, policy=app.execution.policy)

    await execution.claim_many([task_id], "w1")

    metadata = (await app.queries.get_job(result.job_id)).job.metadata
    assert metadata == {"n": 1} and type(metadata["n"]) is int
