-- Listing (issue 14 item 5): GET /v1/jobs without name reads one range per wanted status,
-- newest first ((created_at, id) descending after the keyset cursor).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_jobs_status_created ON jobs (status, created_at, id);
