-- GET /v1/workers: workers with last_heartbeat_at >= since, most recent first.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_workers_last_heartbeat ON workers (last_heartbeat_at);
