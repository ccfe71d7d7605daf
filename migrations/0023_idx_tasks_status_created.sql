-- Listing (issue 14 item 5): GET /v1/tasks without kind or job_id reads one range per wanted
-- status, newest first ((created_at, job_position, id) descending after the keyset cursor).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_status_created ON tasks (status, created_at, job_position, id);
