-- GET /v1/jobs/{id}/results: one job's tasks in submission order, keyset-paged on
-- (job_position, id) after the cursor; a range scan of this index, no sort.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_job_position ON tasks (job_id, job_position, id);
