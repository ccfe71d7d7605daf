-- tasks (spec §4) plus priority, reclaims (crash budget), current_run_id (fencing) and version.
-- current_run_id has no foreign key on purpose: tasks -> task_runs -> tasks would be a cycle,
-- and without DEFERRABLE (refused on CockroachDB) the claim could not write both rows.
-- transactional: false
CREATE TABLE IF NOT EXISTS tasks (
    id UUID NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    job_id UUID NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    payload JSONB,
    priority TEXT NOT NULL DEFAULT 'default',
    max_attempts BIGINT NOT NULL DEFAULT 3,
    attempt BIGINT NOT NULL DEFAULT 0,
    reclaims BIGINT NOT NULL DEFAULT 0,
    current_run_id UUID,
    scheduled_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    last_error TEXT,
    version BIGINT NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT tasks_status_check
        CHECK (status IN ('pending', 'queued', 'running', 'completed', 'failed', 'cancelled'))
);
