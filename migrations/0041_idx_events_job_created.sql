-- One job's events in stream order (GET /v1/events?job_id=), and retention's delete of a
-- pruned job's events: a range scan of the job's prefix.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_events_job_created ON events (job_id, created_at, id);
