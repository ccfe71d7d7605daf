-- stale_running's walk (status = 'running' AND id > cursor AND started_at < threshold ORDER BY
-- id) on a partial index of running tasks only. Replaces idx_tasks_status_id_started (0007):
-- a claim writes one entry here, a completion none (see 0055).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_running_id_started ON tasks (id, started_at)
    WHERE status = 'running';
