"""The statements of an idle task's claim and completion on PostgreSQL (issue 17 item 4).

A lone claim is on the task's submit-to-start path; the completion of a one-task job runs
while the next task is submitted and claimed and competes with them for the cores, so both
are pinned here by the requests they send (each ``execute`` is one round trip: ``BEGIN`` goes
with ``SELECT now()``, the outbox insert with ``COMMIT``).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from redis.asyncio import Redis

from dtq.adapters.cockroach import CockroachStore, sql
from dtq.adapters.cockroach.store import open_pool
from dtq.adapters.redis import RedisQueue
from dtq.application.commands import ReportOutcome, SubmitJob, TaskSpec
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import (
    OUTBOX_WITH_COMMIT,
    counting_statements,
    guarded,
    opened_with,
    services_on,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def services(pg_store: CockroachStore, redis_client: Redis, redis_prefix: str) -> Services:
    return services_on(pg_store, queue=RedisQueue(redis_client, prefix=redis_prefix))


def label(query: str) -> str:
    return " ".join(query.split())


async def test_a_lone_claim_reads_its_task_and_job_in_one_statement(services: Services) -> None:
    """Task and job from one statement, sent with the BEGIN; then the task write, the run
    insert, the job write, the outbox and the COMMIT in one request: two round trips (seven
    before the sixth pass, four before the seventh). Both writes compare-and-set rows the try
    has just read, so they are queued, wrapped to fail the transaction if they match no row."""
    result = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    task_id = result.task_ids["a"]

    with counting_statements() as sent:
        claims = await services.worker.execution.claim_many([task_id], "w")

    assert [c.task.id for c in claims] == [task_id]
    writes = [guarded(sql.UPDATE_TASK), label(sql.INSERT_RUN), guarded(sql.UPDATE_JOB)]
    assert sent == [
        opened_with(sql.GET_TASK_WITH_JOB),
        "; ".join([*writes, OUTBOX_WITH_COMMIT]),
    ]
    job = await services.api.queries.get_job(result.job_id)
    assert job.job.status is JobStatus.RUNNING
    task = (await services.api.queries.get_task(task_id)).task
    assert task.status is TaskStatus.RUNNING and task.version == 1


async def test_settling_a_finished_job_reads_it_with_its_endings_in_one_statement(
    services: Services,
) -> None:
    """The last tasks' completion asks "anything unfinished?" and reads the job with "any
    failed?" and "any cancelled?" in one statement (not a probe, a job read and two more).
    A job of two tasks: a one-task job settles from its claim (no read at all)."""
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k")))
    )
    claims = await services.worker.execution.claim_many(list(result.task_ids.values()), "w")
    assert len(claims) == 2

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    assert sum(label(sql.GET_FINISHED_JOBS) in request for request in sent) == 1
    assert label(sql.JOB_HAS_STATUS) not in sent
    assert label(sql.GET_JOB) not in sent
    job = await services.api.queries.get_job(result.job_id)
    assert job.job.status is JobStatus.COMPLETED


async def test_a_batch_settles_its_jobs_in_as_many_round_trips_whatever_their_number(
    services: Services,
) -> None:
    """A batch of successes of one-task jobs (what single submits make) settles every job with
    one write from its claims, no read: its round trips do not grow with the number of jobs."""
    round_trips = {}
    for jobs in (2, 8):
        results = [
            await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
            for _ in range(jobs)
        ]
        task_ids = [result.task_ids["a"] for result in results]
        claims = await services.worker.execution.claim_many(task_ids, "w")
        assert len(claims) == jobs

        with counting_statements() as sent:
            await services.worker.execution.complete_many(claims)

        assert not any(label(sql.GET_FINISHED_JOBS) in request for request in sent)
        assert sum(label(sql.UPDATE_JOBS) in request for request in sent) == 1
        round_trips[jobs] = len(sent)
        for result in results:
            job = await services.api.queries.get_job(result.job_id)
            assert job.job.status is JobStatus.COMPLETED
    assert round_trips[8] == round_trips[2]


async def test_a_completion_learns_the_time_with_begin_and_commits_with_its_outbox(
    services: Services,
) -> None:
    """A one-task job's completion: 3 round trips (BEGIN and COMMIT were 2 more, the time a
    ``SELECT now()`` of its own, settling the job two, and the search for dependents one).
    Its first statement needs the time, so the BEGIN goes alone, with ``SELECT now()``. The
    task write compares the version of the claim (read by an earlier transaction), so it waits
    for its row count; the run write (its task just written), the check that the job is still
    as its claim left it and the job write ride with the COMMIT. The claim read that the job
    has no dependencies, so no dependents are searched for, and that it has one task, so the
    job is settled from the claim's row, not read."""
    result = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    claims = await services.worker.execution.claim_many([result.task_ids["a"]], "w")
    assert [claim.job_has_dependencies for claim in claims] == [False]

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    assert sent == [
        label(sql.BEGIN_WITH_NOW),
        label(sql.UPDATE_TASK),
        f"{guarded(sql.UPDATE_RUN)}; {label(sql.CONFIRM_JOB)}; {guarded(sql.UPDATE_JOB)};"
        f" {OUTBOX_WITH_COMMIT}",
    ]
    assert label(sql.NOW) not in sent
    view = await services.api.queries.get_task(result.task_ids["a"])
    assert view.task.status is TaskStatus.COMPLETED
    assert [run.status for run in view.runs] == [RunStatus.SUCCEEDED]


async def test_a_job_stores_whether_it_has_dependencies(services: Services, pg_dsn: str) -> None:
    flat = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    dag = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k", depends_on=("a",))))
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        stored: dict[object, object] = dict(
            conn.execute(
                "SELECT id, has_dependencies FROM jobs WHERE id = ANY(%s)",
                ([flat.job_id, dag.job_id],),
            ).fetchall()
        )
    assert stored == {flat.job_id: False, dag.job_id: True}
    assert (await services.api.queries.get_job(dag.job_id)).job.has_dependencies is True


async def test_a_batch_of_a_flat_jobs_successes_searches_for_no_dependents(
    services: Services,
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "k") for i in range(4)))
    )
    claims = await services.worker.execution.claim_many(list(result.task_ids.values()), "w")
    assert [claim.job_has_dependencies for claim in claims] == [False] * 4

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    assert not any("task_dependencies" in request for request in sent)
    job = await services.api.queries.get_job(result.job_id)
    assert job.job.status is JobStatus.COMPLETED


async def test_the_successes_of_a_dag_job_still_promote_its_dependents(
    services: Services,
) -> None:
    result = await services.api.submit.submit_job(
        SubmitJob(
            tasks=(
                TaskSpec("a", "k"),
                TaskSpec("b", "k"),
                TaskSpec("c", "k", depends_on=("a", "b")),
            )
        )
    )
    roots = [result.task_ids["a"], result.task_ids["b"]]
    claims = await services.worker.execution.claim_many(roots, "w")
    assert [claim.job_has_dependencies for claim in claims] == [True, True]

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    assert any(label(sql.DEPENDENTS_MANY) in request for request in sent)
    child = (await services.api.queries.get_task(result.task_ids["c"])).task
    assert child.status is TaskStatus.QUEUED


async def test_a_job_stored_before_its_dependencies_were_recorded_is_searched(
    services: Services, pg_dsn: str
) -> None:
    """``has_dependencies`` NULL (a row older than migration 0075): unknown, searched."""
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k", depends_on=("a",))))
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobs SET has_dependencies = NULL WHERE id = %s", (result.job_id,))
    claims = await services.worker.execution.claim_many([result.task_ids["a"]], "w")
    assert [claim.job_has_dependencies for claim in claims] == [None]

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    assert any(label(sql.DEPENDENTS_ONE) in request for request in sent)
    child = (await services.api.queries.get_task(result.task_ids["b"])).task
    assert child.status is TaskStatus.QUEUED


async def test_a_job_stores_its_task_count(services: Services, pg_dsn: str) -> None:
    one = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    three = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(name, "k") for name in "abc"))
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, task_count FROM jobs WHERE id = ANY(%s)", ([one.job_id, three.job_id],)
        ).fetchall()
    assert dict(rows) == {one.job_id: 1, three.job_id: 3}


@pytest.mark.parametrize("jobs", [1, 3])
async def test_a_one_task_job_changed_since_its_claim_is_read_on_the_re_run(
    services: Services, pg_dsn: str, jobs: int
) -> None:
    """The claim's copy of the job is stale (another writer moved its version and metadata):
    the first try's compare-and-set fails, the re-run reads the job and settles it as stored,
    keeping the other writer's change. One job: the check that rides with the COMMIT; several:
    the batch write."""
    results = [
        await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
        for _ in range(jobs)
    ]
    claims = await services.worker.execution.claim_many(
        [result.task_ids["a"] for result in results], "w"
    )
    assert [claim.job.task_count for claim in claims if claim.job] == [1] * jobs
    changed = results[-1].job_id
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            'UPDATE jobs SET metadata = \'{"by": "other"}\', version = version + 1 WHERE id = %s',
            (changed,),
        )

    with counting_statements() as sent:
        outcomes = await services.worker.execution.complete_many(claims)

    assert outcomes == [ReportOutcome.RECORDED] * jobs
    assert sum(label(sql.GET_FINISHED_JOBS) in request for request in sent) == 1
    for result in results:
        job = (await services.api.queries.get_job(result.job_id)).job
        assert job.status is JobStatus.COMPLETED
    assert (await services.api.queries.get_job(changed)).job.metadata == {"by": "other"}


async def test_a_job_stored_before_its_task_count_was_recorded_is_read(
    services: Services, pg_dsn: str
) -> None:
    """``task_count`` NULL (a row older than migration 0076): unknown, read as before."""
    result = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobs SET task_count = NULL WHERE id = %s", (result.job_id,))
    claims = await services.worker.execution.claim_many([result.task_ids["a"]], "w")
    assert [claim.job.task_count for claim in claims if claim.job] == [None]

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    assert sum(label(sql.GET_FINISHED_JOBS) in request for request in sent) == 1
    assert not any(label(sql.CONFIRM_JOB) in request for request in sent)
    job = (await services.api.queries.get_job(result.job_id)).job
    assert job.status is JobStatus.COMPLETED


async def test_a_batch_of_one_task_jobs_and_a_larger_job_reads_only_the_larger(
    services: Services,
) -> None:
    singles = [
        await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
        for _ in range(2)
    ]
    pair = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k")))
    )
    ids = [r.task_ids["a"] for r in singles] + list(pair.task_ids.values())
    claims = await services.worker.execution.claim_many(ids, "w")
    assert len(claims) == 4

    with counting_statements() as sent:
        await services.worker.execution.complete_many(claims)

    finished = [request for request in sent if label(sql.GET_FINISHED_JOBS) in request]
    assert len(finished) == 1
    assert sum(label(sql.UPDATE_JOBS) in request for request in sent) == 1
    for result in [*singles, pair]:
        job = (await services.api.queries.get_job(result.job_id)).job
        assert job.status is JobStatus.COMPLETED


async def test_a_submission_sends_its_inserts_with_its_commit(
    services: Services,
) -> None:
    """A one-task job without an idempotency key, on a connection that has not read the
    database clock yet: two round trips (six before the sixth pass), the BEGIN with the time
    its rows are dated by, then the job and task inserts, the outbox insert and the COMMIT in
    one request (no insert's answer is read). Once the connection has read the clock, one
    request (``test_estimated_time.py``)."""
    with counting_statements() as sent:
        await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))

    inserts = f"{label(sql.INSERT_JOB)}; {label(sql.INSERT_TASK)}"
    assert sent == [label(sql.BEGIN_WITH_NOW), f"{inserts}; {OUTBOX_WITH_COMMIT}"]


async def test_a_lone_claim_writes_its_lease_and_drops_its_marker_in_one_redis_command(
    services: Services, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's Redis side after its commit: one script call (it was a DEL beside it)."""
    result = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    task_id = result.task_ids["a"]
    sent: list[str] = []
    real = redis_client.execute_command

    async def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return await real(*args, **kwargs)

    monkeypatch.setattr(redis_client, "execute_command", counted)
    claims = await services.worker.execution.claim_many([task_id], "w")

    assert [c.task.id for c in claims] == [task_id]
    assert sent == ["EVALSHA"]
    assert await services.queue.leases_present([task_id]) == {task_id}


async def test_a_keyed_submission_reads_its_job_insert_before_going_on(
    services: Services,
) -> None:
    """With an Idempotency-Key the job insert's answer decides (``ON CONFLICT`` may skip it):
    it is read before anything else is sent; the task insert rides with the COMMIT."""
    with counting_statements() as sent:
        await services.api.submit.submit_job(
            SubmitJob(tasks=(TaskSpec("a", "k"),), idempotency_key="key-1")
        )

    assert sent == [
        opened_with(sql.GET_JOB_BY_KEY),  # the replay lookups, then the keyed insert
        label(sql.GET_TOMBSTONE),
        label(sql.INSERT_JOB),
        f"{label(sql.INSERT_TASK)}; {OUTBOX_WITH_COMMIT}",
    ]


async def test_a_lone_claim_and_completion_run_cached_generic_plans(
    pg_dsn: str, redis_client: Redis, redis_prefix: str
) -> None:
    """PostgreSQL plans a prepared statement afresh for each execution while the plan for the
    parameters at hand looks cheaper than its generic plan; for ``= ANY($1)`` (an array of
    unknown length) it always does, so a lone claim's read and a lone completion's dependents
    read (a job with dependencies has one) were planned on every call (~0.1 ms of the
    database's CPU each). By equality for one id, every statement of an idle task's path runs a
    cached generic plan after five calls."""
    pool = await open_pool(pg_dsn, min_size=1, max_size=1)  # one session: its statements
    try:
        async with pool.connection() as conn:
            version = await (await conn.execute("SELECT version()")).fetchone()
        if version is not None and "CockroachDB" in str(version[0]):
            pytest.skip("generic and custom plan counts are PostgreSQL's")
        store = CockroachStore(pool, base_backoff=0.001)
        svc = services_on(store, queue=RedisQueue(redis_client, prefix=redis_prefix))
        for _ in range(8):
            dag = (TaskSpec("a", "k"), TaskSpec("b", "k", depends_on=("a",)))
            result = await svc.api.submit.submit_job(SubmitJob(tasks=dag))
            claims = await svc.worker.execution.claim_many([result.task_ids["a"]], "w")
            assert len(claims) == 1
            await svc.worker.execution.complete_many(claims)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            plans = {" ".join(row[0].split()): (row[1], row[2]) for row in await cur.fetchall()}
    finally:
        await pool.close()

    def plans_of(query: str) -> tuple[int, int]:
        tail = label(query).replace("%s", "$1").replace("%b", "$1")
        found = [counts for text, counts in plans.items() if text.endswith(tail)]
        assert len(found) == 1, f"not prepared: {tail}"
        return found[0]

    for query in (sql.GET_TASK_WITH_JOB, sql.DEPENDENTS_ONE):
        generic, custom = plans_of(query)
        assert custom <= 5 and generic >= 2, (query, generic, custom)  # PostgreSQL tries 5
