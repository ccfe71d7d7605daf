-- The retention pass lists terminal jobs finished before the retention, keyset-paged on
-- (updated_at, id) per status (status = $1 AND updated_at < $2 AND (updated_at, id) > cursor
-- ORDER BY updated_at, id LIMIT n): a range scan of this index with no sort. Jobs rows are
-- written only when a job's status changes, so the index costs the task hot path nothing.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_jobs_status_updated_id ON jobs (status, updated_at, id);
