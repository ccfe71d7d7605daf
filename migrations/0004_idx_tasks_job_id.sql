-- Spec §4 idx_tasks_job_id, extended with status: serves list_by_job, the ON DELETE CASCADE
-- from jobs, and the job_has_status EXISTS probe (job_id = $1 AND status = ANY($2)).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_job_id ON tasks (job_id, status);
