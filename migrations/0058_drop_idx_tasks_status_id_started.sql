-- Replaced by the partial idx_tasks_running_id_started (0056).
-- transactional: false
DROP INDEX IF EXISTS idx_tasks_status_id_started;
