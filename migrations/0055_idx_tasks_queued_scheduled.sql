-- due_queued's keyset (status = 'queued' AND (scheduled_at, id) > cursor ORDER BY scheduled_at,
-- id) on a partial index of queued tasks only. Replaces idx_tasks_status_scheduled (0005, spec
-- §4): that one held an entry for every task in every status, and on PostgreSQL every claim and
-- every completion (never a HOT update: status is indexed) inserted a new entry into it. Here a
-- claim or completion writes none: the rows it leaves are not queued (issue 17 item 1, fewer
-- indexes touched per transition; CockroachDB has partial indexes since 20.2 and uses one when
-- the query's filter names the predicate's literal, as the statement does).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_queued_scheduled ON tasks (scheduled_at, id)
    WHERE status = 'queued';
