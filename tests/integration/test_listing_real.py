"""Listing and counts on PostgreSQL (issue 14 item 5): the plans of every listing shape on
ANALYZE'd data, and the routes over the real SQL (pages with ties, counts, 400s).

The plan test uses its own database, 20,000 tasks in 1,000 jobs, mostly ``completed`` as in a
long-running deployment, plus one job of 3,000 tasks, and a plain connection with the planner's
defaults (the pool turns sequential scans off for its sessions; that is not the proof here). It
asserts that each shape reads the index docs/SQL.md names for it and that no plan scans a whole
table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest

from dtq.adapters.cockroach import apply_migrations, listing_sql
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.filters import JobFilter, TaskFilter
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready

pytestmark = pytest.mark.integration

FAILED = frozenset({TaskStatus.FAILED})
BIG = uuid.UUID("00000000-0000-4000-8000-00000000b16b")

SEED = (
    "INSERT INTO jobs (id, name, status, created_at, updated_at)"
    " SELECT gen_random_uuid(), 'job' || (g % 50),"
    " (ARRAY['completed', 'completed', 'completed', 'failed', 'running'])[1 + g % 5],"
    " now() - make_interval(mins => g), now() FROM generate_series(1, 1000) AS g",
    "INSERT INTO tasks (id, job_id, name, kind, status, priority, created_at, updated_at,"
    " job_position)"
    " SELECT gen_random_uuid(), j.id, 't' || p, 'kind' || ((p + abs(hashtext(j.id::text))) % 20),"
    " CASE WHEN p % 97 = 0 THEN 'failed' WHEN p % 89 = 0 THEN 'queued'"
    " WHEN p % 83 = 0 THEN 'running' ELSE 'completed' END,"
    " CASE WHEN p % 50 = 0 THEN 'high' ELSE 'default' END, j.created_at, now(), p"
    " FROM jobs AS j, generate_series(0, 19) AS p",
    # one big job, created first: its own range is larger than a sort should take
    "INSERT INTO jobs (id, name, status, created_at, updated_at)"
    " VALUES ('00000000-0000-4000-8000-00000000b16b', 'big', 'running', now(), now())",
    "INSERT INTO tasks (id, job_id, name, kind, status, created_at, updated_at, job_position)"
    " SELECT gen_random_uuid(), '00000000-0000-4000-8000-00000000b16b', 't' || p, 'bulk',"
    " 'completed', now(), now(), p FROM generate_series(0, 2999) AS p",
    "ANALYZE",
)


@pytest.fixture
def analyzed(pg_empty_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to a migrated database holding the seed, statistics gathered."""
    apply_migrations(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for statement in SEED:
            conn.execute(statement)
        yield conn


def plan(conn: psycopg.Connection[Any], shape: tuple[str, list[Any]]) -> str:
    query, params = shape
    rows = conn.execute("EXPLAIN (COSTS OFF) " + query, params).fetchall()
    return "\n".join(row[0] for row in rows)


def test_every_listing_shape_reads_its_index_and_no_whole_table(
    analyzed: psycopg.Connection[Any],
) -> None:
    row = analyzed.execute(
        "SELECT id, now() FROM jobs WHERE name <> 'big' ORDER BY id LIMIT 1"
    ).fetchone()
    assert row is not None
    job_id, now = row
    after = (now - timedelta(days=1), 5, uuid.UUID(int=2**127))
    window = TaskFilter(
        statuses=frozenset({TaskStatus.FAILED, TaskStatus.QUEUED}),
        since=now - timedelta(days=3),
        until=now - timedelta(days=1),
    )
    shapes = {
        "idx_tasks_status_created": [
            listing_sql.task_page(TaskFilter(), None, 51),
            listing_sql.task_page(TaskFilter(statuses=FAILED), after, 51),
            listing_sql.task_page(window, None, 51),
            listing_sql.task_page(TaskFilter(priority="high"), after, 51),
            listing_sql.task_page(TaskFilter(statuses=FAILED), after, 500, keys_only=True),
        ],
        "idx_tasks_kind_created": [
            listing_sql.task_page(TaskFilter(kind="kind7"), None, 51),
            listing_sql.task_page(TaskFilter(kind="kind7"), after, 51),
        ],
        "idx_tasks_job_position": [
            listing_sql.task_page(TaskFilter(job_id=BIG), None, 51),
            listing_sql.task_page(TaskFilter(job_id=BIG), (now, 2000, uuid.UUID(int=0)), 51),
        ],
        "idx_jobs_status_created": [
            listing_sql.job_page(JobFilter(), None, 51),
            listing_sql.job_page(
                JobFilter(statuses=frozenset({JobStatus.FAILED})),
                (now - timedelta(hours=5), uuid.UUID(int=0)),
                51,
            ),
        ],
        "idx_jobs_name_created": [listing_sql.job_page(JobFilter(name="job7"), None, 51)],
    }

    for index, queries in shapes.items():
        for shape in queries:
            text = plan(analyzed, shape)
            assert index in text, text
            assert "Seq Scan" not in text, text
    # a job of 20 tasks (and the counts of any job): the job's range of either job index
    for shape in (
        listing_sql.task_page(TaskFilter(job_id=job_id), None, 51),
        (listing_sql.COUNT_TASKS_BY_STATUS, [job_id]),
        (listing_sql.COUNT_TASKS_BY_STATUS, [BIG]),
    ):
        small = plan(analyzed, shape)
        assert "idx_tasks_job_id" in small or "idx_tasks_job_position" in small, small
        assert "Seq Scan" not in small, small
    # the plain shapes read in key order: no sort above the range of the big job or the kind
    for ordered in (TaskFilter(job_id=BIG), TaskFilter(kind="kind7")):
        text = plan(analyzed, listing_sql.task_page(ordered, None, 51))
        assert "Sort" not in text, text
    # combined filters: residual conditions on an index range (or a bitmap of two ranges)
    combined = [
        TaskFilter(kind="kind3", statuses=FAILED),
        TaskFilter(job_id=job_id, kind="kind3", statuses=frozenset({TaskStatus.COMPLETED})),
        TaskFilter(kind="kind3", priority="high"),
    ]

    for where in combined:
        text = plan(analyzed, listing_sql.task_page(where, None, 51))
        assert "Index" in text, text
        assert "Seq Scan" not in text, text
    jobs = plan(
        analyzed,
        listing_sql.job_page(
            JobFilter(name="job7", statuses=frozenset({JobStatus.FAILED})), None, 9
        ),
    )
    assert "Seq Scan" not in jobs


async def test_the_routes_page_filter_and_count_on_postgres(
    services: Services, client: httpx.AsyncClient
) -> None:
    submit = services.api.submit.submit_job
    first = await submit(
        SubmitJob(name="etl", tasks=tuple(TaskSpec(f"t{i}", "load") for i in range(7)))
    )
    second = await submit(
        SubmitJob(name="etl", tasks=(TaskSpec("x", "load"), TaskSpec("y", "send")))
    )
    claims = await claim_ready(services)
    done = [c for c in claims if c.task.job_id == first.job_id][:3]
    await services.worker.execution.complete_many(done, [None] * len(done))

    pages: list[dict[str, Any]] = []
    params: dict[str, str] = {"kind": "load", "limit": "3"}
    while True:
        response = await client.get("/v1/tasks", params=params)
        assert response.status_code == 200, response.text
        pages.append(response.json())
        if pages[-1]["next_cursor"] is None:
            break
        params = {**params, "cursor": pages[-1]["next_cursor"]}
    listed = [t["id"] for page in pages for t in page["tasks"]]
    second_ids = [str(second.task_ids["x"])]
    first_ids = [str(first.task_ids[f"t{i}"]) for i in reversed(range(7))]
    assert listed == second_ids + first_ids  # newest job first, then last submitted first
    assert [len(p["tasks"]) for p in pages] == [3, 3, 2]
    assert "payload" not in pages[0]["tasks"][0]

    completed = (await client.get("/v1/tasks?status=completed,failed")).json()
    assert sorted(t["id"] for t in completed["tasks"]) == sorted(str(c.task.id) for c in done)
    jobs = (await client.get("/v1/jobs", params={"name": "etl", "limit": "1"})).json()
    assert [j["id"] for j in jobs["jobs"]] == [str(second.job_id)]
    rest = await client.get("/v1/jobs", params={"name": "etl", "cursor": jobs["next_cursor"]})
    assert [j["id"] for j in rest.json()["jobs"]] == [str(first.job_id)]
    assert rest.json()["next_cursor"] is None

    job = (await client.get(f"/v1/jobs/{first.job_id}")).json()
    assert job["counts"] == {
        "pending": 0,
        "queued": 0,
        "running": 4,
        "completed": 3,
        "failed": 0,
        "cancelled": 0,
    }
    assert (len(job["tasks"]), job["next_cursor"]) == (7, None)
    page = (await client.get(f"/v1/jobs/{first.job_id}", params={"limit": "5"})).json()
    assert [t["name"] for t in page["tasks"]] == ["t0", "t1", "t2", "t3", "t4"]
    assert page["next_cursor"] is not None
    for bad, field in [("status=done", "status"), ("cursor=1.2", "cursor"), ("limit=0", "limit")]:
        response = await client.get(f"/v1/tasks?{bad}")
        assert (response.status_code, response.json()["error"]["field"]) == (400, field)
