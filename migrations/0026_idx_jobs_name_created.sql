-- Listing (issue 14 item 5): GET /v1/jobs?name= reads the name's range newest first.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_jobs_name_created ON jobs (name, created_at, id);
