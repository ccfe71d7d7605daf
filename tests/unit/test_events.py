"""The transition outbox on the memory adapters (issue 16 item 1): one event per task and job
transition, in transition order, written with the transaction that made it (a re-run writes it
once, a refused report none), read back in pages after a cursor, pruned with its job."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest

from dtq.application.commands import Claim, TaskSpec
from dtq.application.control import ControlService
from dtq.application.events import (
    EventService,
    EventStreamPolicy,
    format_event_id,
    parse_event_id,
)
from dtq.application.ports import Event, EventCursor
from dtq.application.retention import RetentionPolicy, RetentionService
from dtq.domain.errors import ValidationError
from dtq.domain.events import EVENT_TYPES
from tests.single import claim_one, complete_one, pop_one
from tests.unit.conftest import App
from tests.unit.held_reads import HeldReads, cancel_mid_read

Step = tuple[str, str | None, str | None]  # (type, task name or None, cause or None)


async def all_events(app: App, **filters: Any) -> list[Event]:
    return await EventService(store=app.store).page(after=None, limit=1000, **filters)


async def steps(app: App, names: dict[str, UUID], **filters: Any) -> list[Step]:
    """The events as (type, task name, cause), in stream order."""
    by_id = {task_id: name for name, task_id in names.items()}
    return [
        (e.type, by_id.get(e.task_id) if e.task_id else None, e.data.get("cause"))
        for e in await all_events(app, **filters)
    ]


async def pop_claim(app: App) -> Claim:
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None
    claim = await claim_one(app.execution, task_id, "w1")
    assert claim is not None
    return claim


async def test_a_job_run_to_completion_records_every_transition_in_order(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    for _ in range(2):
        await complete_one(app.execution, await pop_claim(app))

    assert await steps(app, result.task_ids) == [
        ("job.submitted", None, None),
        ("task.queued", "a", "submitted"),
        ("task.pending", "b", "submitted"),
        ("task.running", "a", "claimed"),
        ("job.running", None, None),
        ("task.completed", "a", "succeeded"),
        ("task.queued", "b", "promoted"),
        ("task.running", "b", "claimed"),
        ("task.completed", "b", "succeeded"),
        ("job.completed", None, None),
    ]
    events = await all_events(app)
    assert all(e.job_id == result.job_id for e in events)
    running = events[3]
    claim_run = (await app.queries.get_task(result.task_ids["a"])).runs[0]
    assert running.data["run_id"] == str(claim_run.id) and running.data["attempt"] == 1
    assert [e.cursor for e in events] == sorted(e.cursor for e in events)
    assert {e.type for e in events} <= set(EVENT_TYPES)


async def test_a_retried_failure_then_the_last_one_cascade_to_the_dependents(app: App) -> None:
    result = await app.submit_tasks(
        TaskSpec("a", "echo", max_attempts=2), TaskSpec("b", "echo", depends_on=("a",))
    )
    await app.execution.fail(await pop_claim(app), "boom 1", permanent=False)
    app.clock.advance(10)
    await app.reconcile.promote_scheduled()
    await app.execution.fail(await pop_claim(app), "boom 2", permanent=False)

    assert (await steps(app, result.task_ids))[3:] == [
        ("task.running", "a", "claimed"),
        ("job.running", None, None),
        ("task.queued", "a", "retry"),
        ("task.running", "a", "claimed"),
        ("task.failed", "a", "failed"),
        ("task.failed", "b", "cascade"),
        ("job.failed", None, None),
    ]
    retry, failed = (
        (await all_events(app, types=["task.queued"]))[1],
        (await all_events(app, types=["task.failed"]))[0],
    )
    assert retry.data["error"] == "boom 1" and "scheduled_at" in retry.data
    assert failed.data["error"] == "boom 2" and failed.data["attempt"] == 2


async def test_a_reclaim_and_a_hand_back_requeue_with_their_causes(app: App) -> None:
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    await pop_claim(app)
    app.clock.advance(120)  # past the lease and the stale threshold
    assert await app.reconcile.reclaim_stale() == 1
    claim = await pop_claim(app)
    await app.execution.hand_back(claim, "worker stopping")

    assert (await steps(app, result.task_ids))[2:] == [
        ("task.running", "a", "claimed"),
        ("job.running", None, None),
        ("task.queued", "a", "reclaimed"),
        ("task.running", "a", "claimed"),
        ("task.queued", "a", "handed_back"),
    ]


async def test_cancel_and_manual_retry_record_their_transitions(app: App) -> None:
    control = ControlService(store=app.store, queue=app.queue)
    result = await app.submit_tasks(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",)))
    await control.cancel_task(result.task_ids["a"])
    await control.retry_task(result.task_ids["a"])

    assert (await steps(app, result.task_ids))[3:] == [
        ("task.cancelled", "a", "cancelled"),
        ("task.cancelled", "b", "cascade"),
        ("job.cancelled", None, None),
        ("task.queued", "a", "retried"),
        ("task.pending", "b", "retried"),
        ("job.pending", None, None),
    ]


async def test_a_rerun_transaction_writes_its_events_once(app: App) -> None:
    app.store.inject_conflicts(2)
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    assert app.store.retries == 2
    assert await steps(app, result.task_ids) == [
        ("job.submitted", None, None),
        ("task.queued", "a", "submitted"),
    ]


async def test_a_refused_report_writes_no_event(app: App) -> None:
    await app.submit_tasks(TaskSpec("a", "echo"))
    claim = await pop_claim(app)
    app.clock.advance(120)
    await app.reconcile.reclaim_stale()
    before = await all_events(app)

    await complete_one(app.execution, claim)  # the reclaimed run reports: refused

    assert await all_events(app) == before


async def test_pages_follow_the_cursor_and_the_filters(app: App) -> None:
    first = await app.submit_tasks(TaskSpec("a", "echo"))
    second = await app.submit_tasks(TaskSpec("a", "echo"))
    service = EventService(store=app.store)

    page = await service.page(after=None, limit=3)
    rest = await service.page(after=page[-1].cursor, limit=100)
    assert [e.id for e in page + rest] == [e.id for e in await all_events(app)]
    assert len(rest) == 1
    assert {e.job_id for e in await all_events(app, job_id=second.job_id)} == {second.job_id}
    only = await all_events(app, types=["job.submitted"])
    assert [e.job_id for e in only] == [first.job_id, second.job_id]
    assert await service.page(after=rest[-1].cursor) == []


async def test_retention_prunes_a_jobs_events_with_the_job(app: App) -> None:
    pruned = await app.submit_tasks(TaskSpec("a", "echo"))
    await complete_one(app.execution, await pop_claim(app))
    kept = await app.submit_tasks(TaskSpec("a", "echo"))
    app.clock.advance(3600)
    retention = RetentionService(
        store=app.store, policy=RetentionPolicy(completed=60.0, failed=60.0)
    )

    report = await retention.prune_once()

    assert report.jobs == 1
    assert {e.job_id for e in await all_events(app)} == {kept.job_id}
    assert await all_events(app, job_id=pruned.job_id) == []


def test_an_event_id_round_trips_and_anything_else_is_refused_naming_the_field() -> None:
    cursor = EventCursor(
        parse_event_id("1767225600000001-" + "0" * 31 + "1", field="after").created_at, uuid4()
    )
    assert parse_event_id(format_event_id(cursor), field="after") == cursor
    for bad in ("", "x", "12-zz", "-" + uuid4().hex, "1" * 19 + "-" + uuid4().hex, "1-" + "g" * 32):
        with pytest.raises(ValidationError) as caught:
            parse_event_id(bad, field="Last-Event-ID")
        assert caught.value.field == "Last-Event-ID"


def test_the_stream_settings_load_and_bad_values_name_the_variable() -> None:
    from dtq.entrypoints.config import ConfigError, load_settings

    settings = load_settings({"EVENTS_SETTLE": "2s", "EVENTS_POLL_INTERVAL": "50ms"})
    assert settings.event_stream_policy() == EventStreamPolicy(settle=2.0, poll_interval=0.05)
    for name, value in (("EVENTS_SETTLE", "2m"), ("EVENTS_POLL_INTERVAL", "1ms")):
        with pytest.raises(ConfigError) as caught:
            load_settings({name: value})
        assert caught.value.variable == name


async def test_a_follower_that_goes_away_mid_read_lets_the_read_finish(app: App) -> None:
    # A client closing its event stream cancels the follower; a database query cancelled in
    # flight costs the pool its connection (psycopg closes it), so the read finishes instead.
    store = HeldReads(app.store)
    follower = EventService(store=store).follow(after=None).__aiter__()  # type: ignore[arg-type]
    await cancel_mid_read(store, follower.__anext__())

    assert store.ended == ["finished"]
