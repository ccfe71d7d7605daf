"""A submission dates its rows by an estimate of its transaction's timestamp, checked by the
database, instead of reading the clock first (``Transaction.write_time``,
``txconn.ClockAnchor``, issue 17 item 4): one request instead of two, and a refused estimate
re-runs the try on the clock it reads."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from dtq.adapters.cockroach import sql, txconn
from dtq.adapters.cockroach.store import ESTIMATE_REFUSED, CockroachStore, Pool
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.submit import ESTIMATED_TIME_MAX_TASKS
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import OUTBOX_WITH_COMMIT, counting_statements, services_on

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("estimates_on")]

_ONE_TASK = SubmitJob(tasks=(TaskSpec("a", "k"),))


def label(query: str) -> str:
    return " ".join(query.split())


@pytest.fixture
def services(one_connection: Pool, retries: list[str]) -> Services:
    return services_on(CockroachStore(one_connection, base_backoff=0.001, on_retry=retries.append))


async def _database_now(pool: Pool) -> datetime:
    async with pool.connection() as conn:
        row = await (await conn.execute(sql.NOW)).fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


async def _read_clock_as(pool: Pool, reading: datetime) -> None:
    """Make the pool's one connection hold ``reading`` as its last reading of the clock."""
    async with pool.connection() as conn:
        anchor = conn.clock  # type: ignore[attr-defined]
        assert isinstance(anchor, txconn.ClockAnchor)
        anchor.know(reading)


async def test_a_submission_after_a_reading_of_the_clock_sends_one_request(
    services: Services, one_connection: Pool, retries: list[str]
) -> None:
    first = await services.api.submit.submit_job(_ONE_TASK)  # the connection reads the clock
    with counting_statements() as sent:
        second = await services.api.submit.submit_job(_ONE_TASK)
    after = await _database_now(one_connection)

    inserts = f"{label(sql.INSERT_JOB)}; {label(sql.INSERT_TASK)}"
    check = label(sql.CHECK_ESTIMATED_NOW)
    assert sent == [f"{label(sql.BEGIN_WITH_NOW)}; {check}; {inserts}; {OUTBOX_WITH_COMMIT}"]
    assert retries == []
    one = await services.api.queries.get_job(first.job_id)
    two = await services.api.queries.get_job(second.job_id)
    assert one.job.created_at < two.job.created_at < after
    task = await services.api.queries.get_task(second.task_ids["a"])
    assert task.task.created_at == task.task.scheduled_at == two.job.created_at


@pytest.mark.parametrize("off", [timedelta(seconds=1), -txconn.ESTIMATE_TOLERANCE * 2])
async def test_an_estimate_ahead_of_the_clock_or_too_far_behind_is_refused_and_the_try_reads_it(
    services: Services, one_connection: Pool, retries: list[str], off: timedelta
) -> None:
    await _read_clock_as(one_connection, await _database_now(one_connection) + off)

    with counting_statements() as sent:
        result = await services.api.submit.submit_job(_ONE_TASK)
    after = await _database_now(one_connection)

    assert retries == [ESTIMATE_REFUSED]
    assert txconn.ClockAnchor.refusals == 1
    inserts = f"{label(sql.INSERT_JOB)}; {label(sql.INSERT_TASK)}; {OUTBOX_WITH_COMMIT}"
    begin, check = label(sql.BEGIN_WITH_NOW), label(sql.CHECK_ESTIMATED_NOW)
    assert sent == [f"{begin}; {check}; {inserts}", label(sql.ROLLBACK), begin, inserts]
    view = await services.api.queries.get_job(result.job_id)
    assert after - timedelta(seconds=1) < view.job.created_at < after  # the clock read, not off


async def test_estimates_stop_for_a_while_after_repeated_refusals(
    services: Services, one_connection: Pool, retries: list[str]
) -> None:
    for _ in range(txconn.MAX_REFUSALS):
        await _read_clock_as(one_connection, await _database_now(one_connection) + timedelta(1))
        await services.api.submit.submit_job(_ONE_TASK)
    assert retries == [ESTIMATE_REFUSED] * txconn.MAX_REFUSALS

    with counting_statements() as sent:
        await services.api.submit.submit_job(_ONE_TASK)
    assert sent[0] == label(sql.BEGIN_WITH_NOW)  # the clock is read again, though just read
    assert len(retries) == txconn.MAX_REFUSALS

    txconn.ClockAnchor.off_until = 0.0  # the while is over
    with counting_statements() as sent:
        await services.api.submit.submit_job(_ONE_TASK)
    assert len(sent) == 1


async def test_a_submission_on_a_connection_the_database_closed_is_still_written_once(
    services: Services, one_connection: Pool, pg_dsn: str
) -> None:
    """Its one request carries the COMMIT, so the lost connection leaves the outcome unknown:
    the job is read back, found absent and written again under the same ids."""
    for _ in range(3):  # every statement prepared: the next try sends nothing before its BEGIN
        await services.api.submit.submit_job(_ONE_TASK)
    async with one_connection.connection() as conn:
        pid = conn.info.backend_pid
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    result = await services.api.submit.submit_job(_ONE_TASK)

    view = await services.api.queries.get_job(result.job_id)
    assert result.created and view.job.id == result.job_id
    async with one_connection.connection() as conn:
        row = await (await conn.execute("SELECT count(*) FROM jobs")).fetchone()
    assert row == (4,)


async def test_a_slow_request_leaves_no_reading_to_estimate_from(
    services: Services, one_connection: Pool, retries: list[str]
) -> None:
    """The reading of a request that took longer than ``READING_MAX_WAIT`` would lag the
    clock by as much: it is not kept, and the submission after it reads the clock."""

    async def slow(tx: Any) -> None:  # its first request: BEGIN, now() and a sleep
        await tx.conn.execute("SELECT pg_sleep(%s)", (0.1,))

    await CockroachStore(one_connection).run(slow)
    with counting_statements() as sent:
        await services.api.submit.submit_job(_ONE_TASK)
    assert retries == []
    assert sent[0] == label(sql.BEGIN_WITH_NOW)  # the clock is read: no reading was kept

    with counting_statements() as sent:
        await services.api.submit.submit_job(_ONE_TASK)  # that read was quick: kept
    assert len(sent) == 1


async def test_a_large_job_reads_the_clock_before_binding_its_rows(
    services: Services, one_connection: Pool, retries: list[str]
) -> None:
    await services.api.submit.submit_job(_ONE_TASK)
    tasks = tuple(TaskSpec(f"t{i}", "k") for i in range(ESTIMATED_TIME_MAX_TASKS + 1))
    with counting_statements() as sent:
        await services.api.submit.submit_job(SubmitJob(tasks=tasks))
    assert sent[0] == label(sql.BEGIN_WITH_NOW)
    assert retries == []
