-- Spec §4: a task's run history ordered by started_at.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_task_runs_task_id ON task_runs (task_id, started_at DESC);
