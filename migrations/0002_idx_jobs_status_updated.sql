-- Dashboards / listing jobs by status, newest first (spec §4).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_jobs_status_updated ON jobs (status, updated_at DESC);
