-- Reclaimer: stale_running pages running tasks by id and filters started_at inside the index
-- (status = 'running' AND id > cursor AND started_at < threshold ORDER BY id).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_status_id_started ON tasks (status, id, started_at);
