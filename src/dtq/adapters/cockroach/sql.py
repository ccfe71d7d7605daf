"""Every SQL statement the CockroachDB/PostgreSQL store issues (see docs/SQL.md).

Rules (CRDB.md): columns listed explicitly (never ``SELECT *``), every value a bound parameter
with an explicit cast where its type could be ambiguous (arrays, JSONB), JSONB read back as
text and decoded with msgspec, ``INSERT ... ON CONFLICT`` (never ``UPSERT``), keyset pagination
on indexed columns. The SELECT column lists below and the row mappers in ``repositories.py``
agree by position.

Array parameters use psycopg's binary placeholder (``%b::uuid[]``), far cheaper to encode than
text (ARCHITECTURE.md, "Figures behind the hot-path choices"). psycopg still sends an empty or
all-NULL list as text with an unknown type, which the explicit cast resolves. Scalars keep ``%s``.
"""

from __future__ import annotations

from typing import Final

#: The array condition a statement of several ids ends its WHERE with (``_by_equality``).
_ANY_IDS: Final = "= ANY(%b::uuid[])"


def _by_equality(statement: str) -> str:
    """``statement`` for one id: its ``= ANY(%b::uuid[])`` made ``= %s`` (see
    ``GET_TASK_WITH_JOB``). Raises ValueError at import if the statement has no such
    condition, so the two forms cannot drift apart silently."""
    if statement.count(_ANY_IDS) != 1:
        raise ValueError(f"expected one {_ANY_IDS!r} in {statement!r}")
    return statement.replace(_ANY_IDS, "= %s")


# --- clock ------------------------------------------------------------------------------------

# Only for a transaction whose BEGIN did not bring its time (BEGIN_WITH_NOW below).
NOW: Final = "SELECT now()"
# A store try opens with this simple query (two statements, no parameters): the transaction
# and its timestamp in one round trip.
BEGIN_WITH_NOW: Final = "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT now()"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
PING: Final = "SELECT 1"
# A queued compare-and-set (txconn.TryConnection.send_guarded) is a bound single-row UPDATE
# between these two: the request fails with SQLSTATE 22012 (division by zero) when the UPDATE
# wrote no row. A top-level data-modifying CTE, one table modified (CRDB.md); the division is
# cast, CockroachDB's integer division being decimal.
GUARD_OPEN: Final = "WITH written AS ("
GUARD_CLOSE: Final = " RETURNING 1) SELECT CAST(1 / count(*) AS BIGINT) FROM written"

# A try that stamps its new rows with an estimate of its timestamp instead of reading it first
# (txconn.TryConnection.estimate_now) sends this right after its BEGIN: SQLSTATE 22012 unless
# the estimate lies within [now() - tolerance, now()]. Parameters: the estimate, and the
# estimate plus the tolerance. Cast as the guard's division is.
CHECK_ESTIMATED_NOW: Final = (
    "SELECT CAST(1 / (CASE WHEN now() >= %s AND now() <= %s THEN 1 ELSE 0 END) AS BIGINT)"
)

# --- jobs -------------------------------------------------------------------------------------

# ON CONFLICT on the idempotency key: a duplicate returns no row instead of aborting the
# transaction; any other conflict (a primary-key clash) still raises.
INSERT_JOB: Final = (
    "INSERT INTO jobs (id, name, status, metadata, idempotency_key, request_hash, version,"
    " created_at, updated_at, trace_context, has_dependencies, task_count)"
    " VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id"
)

# INSERT_JOB for several jobs in one statement (group commit); RETURNING names the jobs
# written, so a job whose key another job holds is found missing.
INSERT_JOBS: Final = (
    "INSERT INTO jobs (id, name, status, metadata, idempotency_key, request_hash, version,"
    " created_at, updated_at, trace_context, has_dependencies, task_count)"
    " SELECT u.id, u.name, u.status, u.metadata::jsonb, u.idempotency_key, u.request_hash,"
    " u.version, u.created_at, u.updated_at, u.trace_context, u.has_dependencies::bool,"
    " u.task_count"
    " FROM unnest(%b::uuid[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
    " %b::bigint[], %b::timestamptz[], %b::timestamptz[], %b::text[], %b::text[],"
    " %b::bigint[])"
    " AS u(id, name, status, metadata, idempotency_key, request_hash, version, created_at,"
    " updated_at, trace_context, has_dependencies, task_count)"
    " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id"
)

GET_JOB: Final = (
    "SELECT id, name, status, metadata::text, idempotency_key, request_hash, version,"
    " created_at, updated_at, trace_context, has_dependencies, task_count FROM jobs"
    " WHERE id = %s"
)

# A job row carried from outside the try (a claim's ``CarriedTask``), checked to be exactly
# the stored row by the request that carries the try's writes (``PgJobRepository.confirm``):
# SQLSTATE 22012 when it is not (changed or gone). JSON columns compare as the database prints
# them, not as JSONB values (which take 1 and 1.0 for equal): the claim writes the row back from
# the snapshot. Parameters in ``INSERT_JOB``'s order.
CONFIRM_JOB: Final = (
    "WITH matched AS (SELECT 1 FROM jobs WHERE id = %s AND name = %s AND status = %s"
    " AND metadata::text IS NOT DISTINCT FROM %s::jsonb::text"
    " AND idempotency_key IS NOT DISTINCT FROM %s"
    " AND request_hash IS NOT DISTINCT FROM %s AND version = %s AND created_at = %s"
    " AND updated_at = %s AND trace_context IS NOT DISTINCT FROM %s"
    " AND has_dependencies IS NOT DISTINCT FROM %s AND task_count IS NOT DISTINCT FROM %s)"
    " SELECT CAST(1 / count(*) AS BIGINT) FROM matched"
)

GET_JOB_BY_KEY: Final = (
    "SELECT id, name, status, metadata::text, idempotency_key, request_hash, version,"
    " created_at, updated_at, trace_context, has_dependencies, task_count FROM jobs"
    " WHERE idempotency_key = %s"
)

GET_JOBS: Final = (
    "SELECT id, name, status, metadata::text, idempotency_key, request_hash, version,"
    " created_at, updated_at, trace_context, has_dependencies, task_count FROM jobs"
    " WHERE id = ANY(%b::uuid[])"
)

# What settling the jobs of a batch reads (transitions.settle_jobs), in one round trip: of the
# given job ids, those with no unfinished task (per id and status one point probe of
# idx_tasks_job_id (job_id, status), stopping at the first hit), and for each of them the job
# as GET_JOB plus whether some task is failed, then cancelled (two more probes). The probes
# filter the ids before the join, so a job with work left is not read: a batch that leaves
# work in every job of it reads no job row.
GET_FINISHED_JOBS: Final = (
    "SELECT j.id, j.name, j.status, j.metadata::text, j.idempotency_key, j.request_hash,"
    " j.version, j.created_at, j.updated_at, j.trace_context, j.has_dependencies,"
    " j.task_count,"
    " EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.status = %s),"
    " EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.status = %s)"
    " FROM unnest(%b::uuid[]) AS f(id) JOIN jobs j ON j.id = f.id"
    " WHERE NOT EXISTS (SELECT 1 FROM unnest(%b::text[]) AS s(status)"
    " WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = f.id AND t.status = s.status))"
)

# idempotency_key and request_hash are fixed at creation and never rewritten.
UPDATE_JOB: Final = (
    "UPDATE jobs SET name = %s, status = %s, metadata = %s::jsonb, updated_at = %s,"
    " version = version + 1"
    " WHERE id = %s AND version = %s"
)

# Compare-and-set of many rows in one statement, all or nothing: the batch (one unnest row per
# job, metadata as text cast per row) is joined on id AND the version read, and the NOT EXISTS
# anti-join refuses the whole batch when any job's stored version differs, so a stale batch
# writes no row even if the caller goes on with the transaction. RETURNING lists the rows
# written: fewer than sent means stale. Same columns as UPDATE_JOB.
UPDATE_JOBS: Final = (
    "WITH v AS (SELECT u.id, u.version, u.name, u.status, u.metadata, u.updated_at"
    " FROM unnest(%b::uuid[], %b::bigint[], %b::text[], %b::text[], %b::text[],"
    " %b::timestamptz[]) AS u(id, version, name, status, metadata, updated_at))"
    " UPDATE jobs AS j SET name = v.name, status = v.status, metadata = v.metadata::jsonb,"
    " updated_at = v.updated_at, version = j.version + 1"
    " FROM v WHERE j.id = v.id AND j.version = v.version"
    " AND NOT EXISTS (SELECT 1 FROM v AS s WHERE NOT EXISTS"
    " (SELECT 1 FROM jobs AS c WHERE c.id = s.id AND c.version = s.version))"
    " RETURNING j.id"
)

# --- tasks ------------------------------------------------------------------------------------


# One statement for all tasks of a job: parallel arrays unnested into rows. job_id is a scalar.
INSERT_TASKS: Final = (
    "INSERT INTO tasks (id, job_id, name, kind, payload, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, job_position, result, progress, retry_policy,"
    " timeout_ms)"
    " SELECT u.id, %s::uuid, u.name, u.kind, u.payload::jsonb, u.status, u.scheduled_at,"
    " u.created_at, u.updated_at, u.priority, u.max_attempts, u.attempt, u.reclaims,"
    " u.started_at, u.finished_at, u.last_error, u.current_run_id, u.version, u.job_position,"
    " u.result::jsonb, u.progress::jsonb, u.retry_policy::jsonb, u.timeout_ms"
    " FROM unnest(%b::uuid[], %b::text[], %b::text[], %b::text[], %b::text[],"
    " %b::timestamptz[], %b::timestamptz[], %b::timestamptz[], %b::text[], %b::bigint[],"
    " %b::bigint[], %b::bigint[], %b::timestamptz[], %b::timestamptz[], %b::text[],"
    " %b::uuid[], %b::bigint[], %b::bigint[], %b::text[], %b::text[], %b::text[],"
    " %b::bigint[])"
    " AS u(id, name, kind, payload, status, scheduled_at, created_at, updated_at, priority,"
    " max_attempts, attempt, reclaims, started_at, finished_at, last_error, current_run_id,"
    " version, job_position, result, progress, retry_policy, timeout_ms)"
)

# INSERT_TASKS for tasks of several jobs (a group commit of submissions, issue 17 item 3):
# the job id is a column of the unnest instead of one parameter.
INSERT_TASKS_OF_JOBS: Final = (
    "INSERT INTO tasks (id, job_id, name, kind, payload, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, job_position, result, progress, retry_policy,"
    " timeout_ms)"
    " SELECT u.id, u.job_id, u.name, u.kind, u.payload::jsonb, u.status, u.scheduled_at,"
    " u.created_at, u.updated_at, u.priority, u.max_attempts, u.attempt, u.reclaims,"
    " u.started_at, u.finished_at, u.last_error, u.current_run_id, u.version, u.job_position,"
    " u.result::jsonb, u.progress::jsonb, u.retry_policy::jsonb, u.timeout_ms"
    " FROM unnest(%b::uuid[], %b::uuid[], %b::text[], %b::text[], %b::text[], %b::text[],"
    " %b::timestamptz[], %b::timestamptz[], %b::timestamptz[], %b::text[], %b::bigint[],"
    " %b::bigint[], %b::bigint[], %b::timestamptz[], %b::timestamptz[], %b::text[],"
    " %b::uuid[], %b::bigint[], %b::bigint[], %b::text[], %b::text[], %b::text[],"
    " %b::bigint[])"
    " AS u(id, job_id, name, kind, payload, status, scheduled_at, created_at, updated_at,"
    " priority, max_attempts, attempt, reclaims, started_at, finished_at, last_error,"
    " current_run_id, version, job_position, result, progress, retry_policy, timeout_ms)"
)

# INSERT_TASKS for a job of one task (every POST /v1/tasks): plain VALUES, no arrays.
INSERT_TASK: Final = (
    "INSERT INTO tasks (id, job_id, name, kind, payload, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, job_position, result, progress, retry_policy,"
    " timeout_ms)"
    " VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
    " %s, %s::jsonb, %s::jsonb, %s::jsonb, %s)"
)

INSERT_EDGES: Final = (
    "INSERT INTO task_dependencies (task_id, depends_on_task_id)"
    " SELECT e.task_id, e.depends_on_task_id"
    " FROM unnest(%b::uuid[], %b::uuid[]) AS e(task_id, depends_on_task_id)"
)

GET_TASK: Final = (
    "SELECT id, job_id, name, kind, payload::text, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, result::text, job_position,"
    " progress::text, retry_policy::text, timeout_ms FROM tasks"
    " WHERE id = %s"
)

GET_TASKS: Final = (
    "SELECT id, job_id, name, kind, payload::text, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, result::text, job_position,"
    " progress::text, retry_policy::text, timeout_ms FROM tasks"
    " WHERE id = ANY(%b::uuid[])"
)
# GET_TASKS with the rows locked until the transaction ends (a cancel's read: its writes then
# cannot lose to a transition that commits after it; the claim or completion waits instead)
GET_TASKS_FOR_UPDATE: Final = GET_TASKS + " FOR UPDATE"

# GET_TASKS with each task's job, for the claim of a lone id (issue 17 item 4: one round trip
# fewer than GET_TASKS then GET_JOBS on an idle task's submit-to-start path): the task
# columns as in GET_TASKS, then the job columns as in GET_JOB. Served by the two
# primary keys. Not for batches: their tasks mostly share a job, whose columns every row
# would repeat (measured: no gain in the drain).
GET_TASKS_WITH_JOBS: Final = (
    "SELECT t.id, t.job_id, t.name, t.kind, t.payload::text, t.status, t.scheduled_at,"
    " t.created_at, t.updated_at, t.priority, t.max_attempts, t.attempt, t.reclaims,"
    " t.started_at, t.finished_at, t.last_error, t.current_run_id, t.version, t.result::text,"
    " t.job_position, t.progress::text, t.retry_policy::text, t.timeout_ms,"
    " j.id, j.name, j.status, j.metadata::text, j.idempotency_key, j.request_hash, j.version,"
    " j.created_at, j.updated_at, j.trace_context, j.has_dependencies, j.task_count"
    " FROM tasks AS t JOIN jobs AS j ON j.id = t.job_id WHERE t.id = ANY(%b::uuid[])"
)

# GET_TASKS_WITH_JOBS for one id (a lone claim), by equality: PostgreSQL plans a prepared
# statement for each execution while its plan for the parameter's value is estimated cheaper
# than the generic one, which for ``= ANY($1)`` (an array of unknown length) is always the
# case, so the array form is planned afresh on every lone claim (~0.1 ms of the database's
# CPU, three times its execution); ``= $1`` runs its cached generic plan after five.
GET_TASK_WITH_JOB: Final = _by_equality(GET_TASKS_WITH_JOBS)

# A task row carried from outside the try, checked as ``CONFIRM_JOB`` is, every column but the
# payload (``PgTaskRepository.confirm``); the one row it answers brings the stored payload,
# found among the request's results by its first column's name, ``CONFIRMED_COLUMN``.
# Parameters in ``INSERT_TASK``'s order without the payload.
CONFIRMED_COLUMN: Final = "dtq_confirmed"
CONFIRM_TASK: Final = (
    "WITH matched AS (SELECT payload::text AS payload FROM tasks WHERE id = %s AND job_id = %s"
    " AND name = %s AND kind = %s AND status = %s AND scheduled_at = %s AND created_at = %s"
    " AND updated_at = %s AND priority = %s AND max_attempts = %s AND attempt = %s"
    " AND reclaims = %s AND started_at IS NOT DISTINCT FROM %s"
    " AND finished_at IS NOT DISTINCT FROM %s AND last_error IS NOT DISTINCT FROM %s"
    " AND current_run_id IS NOT DISTINCT FROM %s AND version = %s AND job_position = %s"
    " AND result::text IS NOT DISTINCT FROM %s::jsonb::text"
    " AND progress::text IS NOT DISTINCT FROM %s::jsonb::text"
    " AND retry_policy::text IS NOT DISTINCT FROM %s::jsonb::text"
    " AND timeout_ms IS NOT DISTINCT FROM %s)"
    " SELECT CAST(1 / count(*) AS BIGINT) AS dtq_confirmed, max(payload) FROM matched"
)

LIST_TASKS_BY_JOB: Final = (
    "SELECT id, job_id, name, kind, payload::text, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, result::text, job_position,"
    " progress::text, retry_policy::text, timeout_ms FROM tasks"
    " WHERE job_id = %s ORDER BY created_at, name, id"
)

# GET /v1/jobs/{id}/results: served by idx_tasks_job_position (job_id, job_position, id), a range
# scan after the keyset cursor, no sort. Same columns as GET_TASK.
RESULTS_PAGE_FIRST: Final = (
    "SELECT id, job_id, name, kind, payload::text, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, result::text, job_position,"
    " progress::text, retry_policy::text, timeout_ms FROM tasks"
    " WHERE job_id = %s ORDER BY job_position, id LIMIT %s"
)
RESULTS_PAGE_AFTER: Final = (
    "SELECT id, job_id, name, kind, payload::text, status, scheduled_at, created_at,"
    " updated_at, priority, max_attempts, attempt, reclaims, started_at, finished_at,"
    " last_error, current_run_id, version, result::text, job_position,"
    " progress::text, retry_policy::text, timeout_ms FROM tasks"
    " WHERE job_id = %s AND (job_position, id) > (%s::bigint, %s::uuid)"
    " ORDER BY job_position, id LIMIT %s"
)
# the two RESULTS_PAGE statements with the page's rows locked (a job cancel's page)
RESULTS_PAGE_FIRST_FOR_UPDATE: Final = RESULTS_PAGE_FIRST + " FOR UPDATE"
RESULTS_PAGE_AFTER_FOR_UPDATE: Final = RESULTS_PAGE_AFTER + " FOR UPDATE"

# id, job_id, name, kind, payload and created_at never change after the insert; priority and
# max_attempts are written anyway (cheap, and keeps save() the whole mutable state).
UPDATE_TASK: Final = (
    "UPDATE tasks SET status = %s, scheduled_at = %s, updated_at = %s, priority = %s,"
    " max_attempts = %s, attempt = %s, reclaims = %s, started_at = %s, finished_at = %s,"
    " last_error = %s, current_run_id = %s, result = %s::jsonb, progress = %s::jsonb,"
    " version = version + 1 WHERE id = %s AND version = %s"
)

# UPDATE_TASK for many rows in one statement, all or nothing (see UPDATE_JOBS): same columns.
UPDATE_TASKS: Final = (
    "WITH v AS (SELECT u.id, u.version, u.status, u.scheduled_at, u.updated_at, u.priority,"
    " u.max_attempts, u.attempt, u.reclaims, u.started_at, u.finished_at, u.last_error,"
    " u.current_run_id, u.result, u.progress"
    " FROM unnest(%b::uuid[], %b::bigint[], %b::text[], %b::timestamptz[], %b::timestamptz[],"
    " %b::text[], %b::bigint[], %b::bigint[], %b::bigint[], %b::timestamptz[],"
    " %b::timestamptz[], %b::text[], %b::uuid[], %b::text[], %b::text[])"
    " AS u(id, version, status, scheduled_at, updated_at, priority, max_attempts, attempt,"
    " reclaims, started_at, finished_at, last_error, current_run_id, result, progress))"
    " UPDATE tasks AS t SET status = v.status, scheduled_at = v.scheduled_at,"
    " updated_at = v.updated_at, priority = v.priority, max_attempts = v.max_attempts,"
    " attempt = v.attempt, reclaims = v.reclaims, started_at = v.started_at,"
    " finished_at = v.finished_at, last_error = v.last_error,"
    " current_run_id = v.current_run_id, result = v.result::jsonb,"
    " progress = v.progress::jsonb, version = t.version + 1"
    " FROM v WHERE t.id = v.id AND t.version = v.version"
    " AND NOT EXISTS (SELECT 1 FROM v AS s WHERE NOT EXISTS"
    " (SELECT 1 FROM tasks AS c WHERE c.id = s.id AND c.version = s.version))"
    " RETURNING t.id"
)

# Progress of the held claims (task.progress), one statement per lease renewal tick: each row
# fenced on the run still being live (current_run_id and status 'running'), so a stale run's
# value changes nothing; RETURNING lists the rows written. Plain UPDATE ... FROM unnest (no
# UPSERT); version is not bumped: progress is not part of the task's state machine, and a
# concurrent outcome write of the same row is a serialization conflict (retried) anyway.
UPDATE_PROGRESS: Final = (
    "UPDATE tasks AS t SET progress = v.progress::jsonb"
    " FROM unnest(%b::uuid[], %b::uuid[], %b::text[]) AS v(id, run_id, progress)"
    " WHERE t.id = v.id AND t.current_run_id = v.run_id AND t.status = %s"
    " RETURNING t.id"
)

# Served by idx_task_dependencies_depends (depends_on_task_id).
DEPENDENTS: Final = (
    "SELECT task_id FROM task_dependencies WHERE depends_on_task_id = %s ORDER BY task_id"
)

# A task's direct dependencies (explain): the task_dependencies primary key (task_id, ...), one
# range proportional to the in-degree.
DEPENDENCIES: Final = (
    "SELECT depends_on_task_id FROM task_dependencies WHERE task_id = %s"
    " ORDER BY depends_on_task_id"
)

# (parent, child) edges out of several tasks; same index, one probe per parent. No ORDER BY:
# the port promises no order.
DEPENDENTS_MANY: Final = (
    "SELECT depends_on_task_id, task_id FROM task_dependencies"
    " WHERE depends_on_task_id = ANY(%b::uuid[])"
)

# DEPENDENTS_MANY for one id (a lone completion), by equality: see GET_TASK_WITH_JOB.
DEPENDENTS_ONE: Final = _by_equality(DEPENDENTS_MANY)

# Fan-in at claim (task.parents): the direct dependencies' names and results of a claim batch.
# Served by the task_dependencies primary key (task_id, depends_on_task_id), a range per
# claimed task, then one tasks primary-key lookup per edge: proportional to the in-degree.
PARENT_RESULTS: Final = (
    "SELECT d.task_id, p.name, p.result::text FROM task_dependencies d"
    " JOIN tasks p ON p.id = d.depends_on_task_id WHERE d.task_id = ANY(%b::uuid[])"
)

# Served by the task_dependencies primary key (task_id, depends_on_task_id), then the tasks
# primary key per edge; NOT EXISTS stops at the first unfinished dependency.
DEPENDENCIES_COMPLETED: Final = (
    "SELECT NOT EXISTS ("
    "SELECT 1 FROM task_dependencies d JOIN tasks t ON t.id = d.depends_on_task_id"
    " WHERE d.task_id = %s AND t.status <> %s)"
)

# Manual retry (issue 14 item 4): is some direct dependency failed or cancelled? Served like
# DEPENDENCIES_COMPLETED (task_dependencies primary key, then tasks by primary key per edge);
# EXISTS stops at the first hit.
DEPENDENCY_HAS_STATUS: Final = (
    "SELECT EXISTS ("
    "SELECT 1 FROM task_dependencies d JOIN tasks t ON t.id = d.depends_on_task_id"
    " WHERE d.task_id = %s AND t.status = ANY(%b::text[]))"
)

# One point probe of idx_tasks_job_id (job_id, status) per wanted status (a semi-join over the
# unnested list), stopping at the first hit: the cost does not grow with the job's size. The
# plainer "status = ANY($2)" becomes a filter over the whole job range in generic plans.
JOB_HAS_STATUS: Final = (
    "SELECT EXISTS (SELECT 1 FROM unnest(%b::text[]) AS s(status)"
    " WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = %s AND t.status = s.status))"
)

# Served by the partial idx_tasks_queued_scheduled (scheduled_at, id) WHERE status = 'queued':
# range scan, no sort. The status is a literal, not a parameter, so that both databases prove
# the predicate (a generic plan could not use the partial index for "status = $1").
DUE_QUEUED_FIRST: Final = (
    "SELECT id, priority, scheduled_at, kind FROM tasks"
    " WHERE status = 'queued' AND scheduled_at <= %s"
    " ORDER BY scheduled_at, id LIMIT %s"
)
DUE_QUEUED_AFTER: Final = (
    "SELECT id, priority, scheduled_at, kind FROM tasks"
    " WHERE status = 'queued' AND scheduled_at <= %s"
    " AND (scheduled_at, id) > (%s::timestamptz, %s::uuid)"
    " ORDER BY scheduled_at, id LIMIT %s"
)

# Served by the partial idx_tasks_running_id_started (id, started_at) WHERE status = 'running':
# walks running tasks in id order and filters started_at inside the index.
STALE_RUNNING_FIRST: Final = (
    "SELECT id, current_run_id, priority, started_at FROM tasks"
    " WHERE status = 'running' AND started_at < %s AND current_run_id IS NOT NULL"
    " ORDER BY id LIMIT %s"
)
STALE_RUNNING_AFTER: Final = (
    "SELECT id, current_run_id, priority, started_at FROM tasks"
    " WHERE status = 'running' AND id > %s AND started_at < %s AND current_run_id IS NOT NULL"
    " ORDER BY id LIMIT %s"
)

# --- task_runs --------------------------------------------------------------------------------

INSERT_RUN: Final = (
    "INSERT INTO task_runs (id, task_id, attempt_number, worker_id, status, started_at, error,"
    " finished_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)

# INSERT_RUN for many rows in one statement: parallel arrays unnested into rows.
INSERT_RUNS: Final = (
    "INSERT INTO task_runs (id, task_id, attempt_number, worker_id, status, started_at, error,"
    " finished_at)"
    " SELECT u.id, u.task_id, u.attempt_number, u.worker_id, u.status, u.started_at, u.error,"
    " u.finished_at"
    " FROM unnest(%b::uuid[], %b::uuid[], %b::bigint[], %b::text[], %b::text[],"
    " %b::timestamptz[], %b::text[], %b::timestamptz[])"
    " AS u(id, task_id, attempt_number, worker_id, status, started_at, error, finished_at)"
)

GET_RUN: Final = (
    "SELECT id, task_id, attempt_number, worker_id, status, started_at, error, finished_at"
    " FROM task_runs WHERE id = %s"
)

GET_RUNS: Final = (
    "SELECT id, task_id, attempt_number, worker_id, status, started_at, error, finished_at"
    " FROM task_runs WHERE id = ANY(%b::uuid[])"
)

# A run ends once: the write is fenced on the stored status still being 'running'.
UPDATE_RUN: Final = (
    "UPDATE task_runs SET status = %s, error = %s, finished_at = %s WHERE id = %s AND status = %s"
)

# UPDATE_RUN for many rows in one statement, all or nothing (see UPDATE_JOBS): each row fenced
# on its stored status still being 'running' (the two last parameters), and no row written
# unless every run of the batch still is.
UPDATE_RUNS: Final = (
    "WITH v AS (SELECT u.id, u.status, u.error, u.finished_at"
    " FROM unnest(%b::uuid[], %b::text[], %b::text[], %b::timestamptz[])"
    " AS u(id, status, error, finished_at))"
    " UPDATE task_runs AS r SET status = v.status, error = v.error, finished_at = v.finished_at"
    " FROM v WHERE r.id = v.id AND r.status = %s"
    " AND NOT EXISTS (SELECT 1 FROM v AS s WHERE NOT EXISTS"
    " (SELECT 1 FROM task_runs AS c WHERE c.id = s.id AND c.status = %s))"
    " RETURNING r.id"
)

# Served by idx_task_runs_task_id (task_id, started_at DESC), read backwards.
LIST_RUNS_FOR_TASK: Final = (
    "SELECT id, task_id, attempt_number, worker_id, status, started_at, error, finished_at"
    " FROM task_runs WHERE task_id = %s ORDER BY started_at, id"
)

# --- workers ----------------------------------------------------------------------------------

UPSERT_WORKER: Final = (
    "INSERT INTO workers (id, hostname, last_heartbeat_at, metadata, redis_key_prefix)"
    " VALUES (%s, %s, %s, %s::jsonb, %s)"
    " ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname,"
    " last_heartbeat_at = excluded.last_heartbeat_at, metadata = excluded.metadata,"
    " redis_key_prefix = excluded.redis_key_prefix"
)

# Served by idx_workers_last_heartbeat, read backwards.
LIST_ACTIVE_WORKERS: Final = (
    "SELECT id, hostname, last_heartbeat_at, metadata::text, redis_key_prefix FROM workers"
    " WHERE last_heartbeat_at >= %s ORDER BY last_heartbeat_at DESC, id"
)

GET_WORKER: Final = (
    "SELECT id, hostname, last_heartbeat_at, metadata::text, redis_key_prefix FROM workers"
    " WHERE id = %s"
)

DELETE_WORKER: Final = "DELETE FROM workers WHERE id = %s RETURNING id"

# --- api tokens (issue 15 item 3) -------------------------------------------------------------
# Every read returns the columns of rows.token_from_row, in this order:
# id, name, secret_hash, scopes, created_at, expires_at, revoked_at.

# ON CONFLICT without a target: a taken name (the only constraint a caller can hit; the id and
# the hash are random) inserts nothing and returns no row.
API_TOKENS_INSERT: Final = (
    "INSERT INTO api_tokens (id, name, secret_hash, scopes, created_at, expires_at, revoked_at)"
    " VALUES (%s, %s, %s, %s::text[], %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id"
)

# Served by the unique index on secret_hash (api_tokens_secret_hash_key).
API_TOKENS_BY_HASH: Final = (
    "SELECT id, name, secret_hash, scopes, created_at, expires_at, revoked_at"
    " FROM api_tokens WHERE secret_hash = %s"
)

# Served by the unique index on name (api_tokens_name_key).
API_TOKENS_BY_NAME: Final = (
    "SELECT id, name, secret_hash, scopes, created_at, expires_at, revoked_at"
    " FROM api_tokens WHERE name = %s"
)

# Read in name order from api_tokens_name_key: an operator's command, never on a request path.
API_TOKENS_LIST: Final = (
    "SELECT id, name, secret_hash, scopes, created_at, expires_at, revoked_at"
    " FROM api_tokens ORDER BY name"
)

API_TOKENS_REVOKE: Final = (
    "UPDATE api_tokens SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL RETURNING id"
)


# --- retention (issue 14 item 8) ----------------------------------------------------------------

# Served by idx_jobs_status_updated_id (status, updated_at, id): range scan, no sort.
FINISHED_JOBS_FIRST: Final = (
    "SELECT id, updated_at FROM jobs WHERE status = %s AND updated_at < %s"
    " ORDER BY updated_at, id LIMIT %s"
)
FINISHED_JOBS_AFTER: Final = (
    "SELECT id, updated_at FROM jobs WHERE status = %s AND updated_at < %s"
    " AND (updated_at, id) > (%s::timestamptz, %s::uuid)"
    " ORDER BY updated_at, id LIMIT %s"
)

# idx_tasks_job_id (job_id, status): an index-only count per job.
TASK_COUNTS: Final = (
    "SELECT job_id, count(*) FROM tasks WHERE job_id = ANY(%b::uuid[]) GROUP BY job_id"
)

# The jobs among the batch that still qualify: the status read, finished before the cutoff,
# and no task of theirs unfinished or finished at or after it (the NOT EXISTS walks each job's
# tasks through idx_tasks_job_id; the job is about to be deleted whole anyway). Read in the
# deleting transaction, so under SERIALIZABLE a concurrent retry or cancel either commits
# first (the job no longer qualifies) or conflicts.
PRUNABLE_JOBS: Final = (
    "SELECT j.id, j.idempotency_key, j.request_hash FROM jobs AS j"
    " WHERE j.id = ANY(%b::uuid[]) AND j.status = %s AND j.updated_at < %s"
    " AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.job_id = j.id"
    " AND (t.status IN ('pending', 'queued', 'running')"
    " OR COALESCE(t.finished_at, t.updated_at) >= %s))"
)

# name -> id of the tasks of the jobs that leave a tombstone.
TASK_NAMES_OF_JOBS: Final = "SELECT job_id, name, id FROM tasks WHERE job_id = ANY(%b::uuid[])"

# Children first, each bounded by the batch's tasks (idx_task_runs_task_id, the edges' primary
# key, idx_tasks_job_id); the ON DELETE CASCADE foreign keys then find nothing left to do.
DELETE_RUNS_OF_JOBS: Final = (
    "DELETE FROM task_runs WHERE task_id IN (SELECT id FROM tasks WHERE job_id = ANY(%b::uuid[]))"
)
DELETE_EDGES_OF_JOBS: Final = (
    "DELETE FROM task_dependencies WHERE task_id IN"
    " (SELECT id FROM tasks WHERE job_id = ANY(%b::uuid[]))"
)
DELETE_TASKS_OF_JOBS: Final = "DELETE FROM tasks WHERE job_id = ANY(%b::uuid[])"
DELETE_JOBS: Final = "DELETE FROM jobs WHERE id = ANY(%b::uuid[])"

# One row per pruned job holding a key; a tombstone of the same key left by an earlier job of
# that key (its tombstone outlived the TTL pass by a moment) is replaced.
INSERT_TOMBSTONES: Final = (
    "INSERT INTO idempotency_tombstones"
    " (idempotency_key, request_hash, job_id, task_ids, pruned_at)"
    " SELECT u.k, u.h, u.j, u.t::jsonb, %s::timestamptz"
    " FROM unnest(%b::text[], %b::text[], %b::uuid[], %b::text[]) AS u(k, h, j, t)"
    " ON CONFLICT (idempotency_key) DO UPDATE SET request_hash = excluded.request_hash,"
    " job_id = excluded.job_id, task_ids = excluded.task_ids, pruned_at = excluded.pruned_at"
)

GET_TOMBSTONE: Final = (
    "SELECT idempotency_key, request_hash, job_id, task_ids::text, pruned_at"
    " FROM idempotency_tombstones WHERE idempotency_key = %s"
)

# Served by idx_idempotency_tombstones_pruned (pruned_at, idempotency_key): oldest first.
DELETE_TOMBSTONES: Final = (
    "DELETE FROM idempotency_tombstones WHERE idempotency_key IN"
    " (SELECT idempotency_key FROM idempotency_tombstones WHERE pruned_at < %s"
    " ORDER BY pruned_at LIMIT %s)"
)

# --- events (the transition outbox, issue 16 item 1) ------------------------------------------

# The try's whole buffer in one statement, sent last before COMMIT. created_at is the database
# clock at this statement (clock_timestamp(), read once: a CTE holding a volatile function is
# evaluated once on both databases) plus the event's position in the buffer in microseconds,
# so one transaction's events keep their order and differ in time.
INSERT_EVENTS: Final = (
    "WITH c AS (SELECT clock_timestamp() AS ts)"
    " INSERT INTO events (created_at, id, job_id, task_id, type, data)"
    " SELECT c.ts + u.n * INTERVAL '1 microsecond', gen_random_uuid(), (u.e->>0)::uuid,"
    " (u.e->>1)::uuid, u.e->>2, u.e->3"
    " FROM c, jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS u(e, n)"
)

# A page of the stream: the keyset after (created_at, id), below the visibility horizon (the
# database clock minus the settle margin, in seconds). The primary key serves the whole-table
# order, idx_events_job_created one job's. {where} adds the optional filters (constant
# fragments, parameters bound).
EVENTS_PAGE: Final = (
    "SELECT created_at, id, job_id, task_id, type, data::text FROM events"
    " WHERE created_at < clock_timestamp() - %s::float8 * INTERVAL '1 second'"
    " AND (created_at, id) > (%s::timestamptz, %s::uuid){where}"
    " ORDER BY created_at, id LIMIT %s"
)
EVENTS_PAGE_JOB: Final = " AND job_id = %s::uuid"
EVENTS_PAGE_TYPES: Final = " AND type = ANY(%b::text[])"

# Retention: the events of the jobs it deletes (idx_events_job_created).
DELETE_EVENTS_OF_JOBS: Final = "DELETE FROM events WHERE job_id = ANY(%b::uuid[])"


# --- webhooks (issue 16 item 2) -------------------------------------------------------------------

_WEBHOOK_COLUMNS: Final = (
    "id, url, events, secret, created_at, cursor_at, cursor_id, attempts, next_attempt_at,"
    " last_status, last_error, last_attempt_at, delivered"
)

WEBHOOKS_INSERT: Final = (
    f"INSERT INTO webhooks ({_WEBHOOK_COLUMNS})"  # noqa: S608  (constant column list)
    " VALUES (%s, %s, %s::text[], %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)

# Primary-key point read.
WEBHOOKS_GET: Final = f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks WHERE id = %s"  # noqa: S608

# A full scan of a table of a few rows: the API's list and the delivery loop's refresh.
WEBHOOKS_LIST: Final = f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks ORDER BY created_at, id"  # noqa: S608

WEBHOOKS_DELETE: Final = "DELETE FROM webhooks WHERE id = %s RETURNING id"

# The delivery state's compare-and-set: a primary-key point write, conditioned on the cursor and
# next_attempt_at as the writer read them.
WEBHOOKS_REPLACE: Final = (
    "UPDATE webhooks SET cursor_at = %s, cursor_id = %s, attempts = %s, next_attempt_at = %s,"
    " last_status = %s, last_error = %s, last_attempt_at = %s, delivered = %s"
    " WHERE id = %s AND cursor_at = %s AND cursor_id = %s"
    " AND next_attempt_at IS NOT DISTINCT FROM %s RETURNING id"
)
