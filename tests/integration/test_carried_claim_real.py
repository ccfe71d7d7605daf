"""An idle task's claim from the snapshot its pop brought (``CarriedTask``, issue 17 item 4).

A lone submit pushes its one-task job's task and job onto an empty ready list with the id; the
worker popping it claims it in one request: the database confirms both rows, brings the
payload, and takes the writes and the COMMIT, instead of a read before them. A snapshot that
is not the stored row fails that request and the claim reads as before. On PostgreSQL and
Redis: ``RedisQueue`` carries the snapshot in the list entry, ``TaskRepository.confirm``
checks it.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import sql
from dtq.adapters.cockroach.store import CONCURRENT_UPDATE, CockroachStore, Pool
from dtq.adapters.redis import RedisQueue
from dtq.adapters.redis.keys import KeyLayout
from dtq.adapters.redis.queue import carried_entry
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.ports import CarriedTask
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import counting_statements, services_on
from tests.single import carried_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("estimates_on")]

PAYLOAD = {"zeta": [1, "two", None, True], "a": {"y": 2, "x": 1.5}, "big": 2**62}


def label(query: str) -> str:
    return " ".join(query.split())


@pytest.fixture
def services(
    one_connection: Pool, redis_client: Redis, redis_prefix: str, retries: list[str]
) -> Services:
    store = CockroachStore(one_connection, base_backoff=0.001, on_retry=retries.append)
    return services_on(store, queue=RedisQueue(redis_client, prefix=redis_prefix))


async def submit_and_pop(services: Services, payload: object = PAYLOAD) -> uuid.UUID:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k", payload=payload),))
    )
    popped = await services.worker.queue.pop_many(["default"], timeout=1.0, max_count=1)
    assert popped == [result.task_ids["a"]]
    return popped[0]


async def test_a_popped_task_that_carried_its_rows_is_claimed_in_one_request(
    services: Services, retries: list[str]
) -> None:
    """One request: the BEGIN, the estimate's check, the two confirmations, the task write,
    the run insert, the job write, the outbox and the COMMIT (two before: the read first).
    The handler gets the payload the database stores, as a claim that reads it would."""
    await submit_and_pop(services)  # the connection reads the clock once
    await services.worker.execution.claim_many(
        await services.worker.queue.pop_many(["default"], timeout=0, max_count=1), "w"
    )
    task_id = await submit_and_pop(services)

    with counting_statements() as sent:
        claims = await services.worker.execution.claim_many([task_id], "w")

    assert len(sent) == 1
    request = sent[0]
    assert label(sql.CONFIRM_TASK) in request and label(sql.CONFIRM_JOB) in request
    assert label(sql.GET_TASK_WITH_JOB) not in request
    assert request.endswith(sql.COMMIT)
    assert retries == []
    [claim] = claims
    stored = (await services.api.queries.get_task(task_id)).task
    assert claim.task.payload == stored.payload == PAYLOAD
    assert list(claim.task.payload) == list(stored.payload)  # the store's key order too
    assert replace(claim.task, payload=None) == replace(stored, payload=None)
    assert stored.status is TaskStatus.RUNNING and stored.version == 1
    job = (await services.api.queries.get_job(claim.task.job_id)).job
    assert job.status is JobStatus.RUNNING


async def test_a_snapshot_that_is_not_the_stored_row_is_read_instead(
    services: Services, retries: list[str], pg_dsn: str
) -> None:
    """A row changed without its version (so only the confirmation can tell): the claim's
    request fails before it writes anything, the re-run reads the task, and the stored value
    wins, in the claim and in the row (the snapshot's is never written back)."""
    import psycopg

    task_id = await submit_and_pop(services)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE tasks SET max_attempts = 7 WHERE id = %s", (task_id,))

    claims = await services.worker.execution.claim_many([task_id], "w")

    assert retries == [CONCURRENT_UPDATE]
    [claim] = claims
    assert claim.task.max_attempts == 7
    stored = (await services.api.queries.get_task(task_id)).task
    assert stored.max_attempts == 7 and stored.status is TaskStatus.RUNNING


async def test_a_task_cancelled_after_its_push_is_not_claimed_from_its_snapshot(
    services: Services, retries: list[str]
) -> None:
    task_id = await submit_and_pop(services)
    await services.api.control.cancel_task(task_id)

    claims = await services.worker.execution.claim_many([task_id], "w")

    assert claims == []
    assert (await services.api.queries.get_task(task_id)).task.status is TaskStatus.CANCELLED
    assert retries == [CONCURRENT_UPDATE]


# --- RedisQueue: what rides on the list ----------------------------------------------------


async def test_a_carried_entry_is_counted_in_the_books_by_its_id(
    redis_client: Redis, redis_prefix: str
) -> None:
    """The reconciler's ``enqueue_unlisted`` finds the id waiting (books, not entries), so it
    is not pushed a second time; ``explain`` places it from the books too."""
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    one = carried_snapshot()
    await queue.enqueue_many([(one.task.id, "default")], carried=[one])
    await queue.release_markers([one.task.id])  # as if its marker had expired

    assert await queue.enqueue_unlisted([(one.task.id, "default", "k")]) == 0
    place = await queue.inspector().inspect(one.task.id, "default", "k")
    assert (place.ready_depth, place.ready_position) == (1, 0)


async def test_a_malformed_carried_entry_still_delivers_its_id(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    task_id = uuid.uuid4()
    ready = KeyLayout(redis_prefix).ready("default")
    await redis_client.lpush(ready, f"{task_id}|not json", f"{uuid.uuid4()}#garbage")

    popped = await queue.pop_many(["default"], timeout=0, max_count=5)

    assert popped == [task_id]
    assert queue.carried(task_id) is None


async def test_a_snapshot_too_large_to_carry_goes_as_a_bare_id(
    redis_client: Redis, redis_prefix: str
) -> None:
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    big = carried_snapshot()
    big = CarriedTask(task=big.task, job=replace(big.job, metadata={"notes": "x" * 5000}))

    await queue.enqueue_many([(big.task.id, "default")], carried=[big])

    ready = KeyLayout(redis_prefix).ready("default")
    assert await redis_client.lrange(ready, 0, -1) == [str(big.task.id).encode()]
    assert await queue.pop_many(["default"], timeout=0, max_count=1) == [big.task.id]
    assert queue.carried(big.task.id) is None


async def test_a_snapshot_spelling_a_json_value_otherwise_is_refused(
    services: Services, retries: list[str], redis_client: Redis, redis_prefix: str
) -> None:
    """JSONB equality calls 1 and 1.0 the same value, but the claim writes the job row back from
    the snapshot: the confirmation compares the JSON columns as the database prints them, so a
    snapshot whose metadata says ``1.0`` where the row says ``1`` is refused and read."""
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k"),), metadata={"n": 1, "k": "v"})
    )
    queue = services.worker.queue
    [task_id] = await queue.pop_many(["default"], timeout=1.0, max_count=1)
    real = queue.carried(task_id)
    assert real is not None
    forged = CarriedTask(task=real.task, job=replace(real.job, metadata={"k": "v", "n": 1.0}))
    entry = carried_entry(forged)
    assert entry is not None
    await redis_client.lpush(KeyLayout(redis_prefix).ready("default"), entry)
    assert await queue.pop_many(["default"], timeout=1.0, max_count=1) == [task_id]

    await services.worker.execution.claim_many([task_id], "w")

    assert retries == [CONCURRENT_UPDATE]
    metadata = (await services.api.queries.get_job(result.job_id)).job.metadata
    assert metadata == {"n": 1, "k": "v"} and type(metadata["n"]) is int


async def test_a_snapshot_whose_job_says_otherwise_about_dependencies_is_refused(
    services: Services, retries: list[str], redis_client: Redis, redis_prefix: str
) -> None:
    """What the claim carries of the job's dependencies decides whether its success searches
    for dependents, so the confirmation compares it too: a snapshot saying otherwise than the
    row is refused, and the claim carries what the row says."""
    await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    queue = services.worker.queue
    [task_id] = await queue.pop_many(["default"], timeout=1.0, max_count=1)
    real = queue.carried(task_id)
    assert real is not None and real.job.has_dependencies is False
    forged = CarriedTask(task=real.task, job=replace(real.job, has_dependencies=None))
    entry = carried_entry(forged)
    assert entry is not None
    await redis_client.lpush(KeyLayout(redis_prefix).ready("default"), entry)
    assert await queue.pop_many(["default"], timeout=1.0, max_count=1) == [task_id]

    [claim] = await services.worker.execution.claim_many([task_id], "w")

    assert retries == [CONCURRENT_UPDATE]
    assert claim.job_has_dependencies is False


async def test_a_clock_reading_that_lags_the_tasks_due_time_does_not_cost_a_rerun(
    services: Services, retries: list[str], one_connection: Pool
) -> None:
    """The worker's connection estimates the time from its last reading; one that lags (here
    by 20 ms) would date the claim before the task's due time, which the submit's transaction
    stored before this one began. The estimate is raised to that time (the database checks it
    as any estimate) instead of the claim being refused and re-run."""
    await submit_and_pop(services)  # the connection reads the clock once
    await services.worker.execution.claim_many(
        await services.worker.queue.pop_many(["default"], timeout=0, max_count=1), "w"
    )
    task_id = await submit_and_pop(services)
    due = (await services.api.queries.get_task(task_id)).task.scheduled_at
    async with one_connection.connection() as conn:
        conn.clock.know(due - timedelta(milliseconds=20))  # type: ignore[attr-defined]

    with counting_statements() as sent:
        [claim] = await services.worker.execution.claim_many([task_id], "w")

    assert retries == [] and len(sent) == 1
    assert claim.run.started_at >= due


async def test_a_carried_entry_with_a_naive_time_carries_nothing(
    redis_client: Redis, redis_prefix: str
) -> None:
    """Times without an offset cannot be compared with the database's; such an entry (not one
    the queue wrote) delivers its id, and the claim reads."""
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    one = carried_snapshot()
    entry = carried_entry(one)
    assert entry is not None
    naive = one.task.scheduled_at.replace(tzinfo=None).isoformat().encode()
    aware = one.task.scheduled_at.isoformat().replace("+00:00", "Z").encode()
    assert aware in entry
    await redis_client.lpush(KeyLayout(redis_prefix).ready("default"), entry.replace(aware, naive))

    assert await queue.pop_many(["default"], timeout=0, max_count=1) == [one.task.id]
    assert queue.carried(one.task.id) is None
