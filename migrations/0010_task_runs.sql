-- Run history (spec §4). (task_id, attempt_number) is intentionally NOT unique: a reclaimed
-- run (status 'dead') and its successor share the attempt number.
-- transactional: false
CREATE TABLE IF NOT EXISTS task_runs (
    id UUID NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    task_id UUID NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    attempt_number BIGINT NOT NULL,
    worker_id TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    CONSTRAINT task_runs_status_check
        CHECK (status IN ('running', 'succeeded', 'failed', 'dead'))
);
