-- Replaced by the partial idx_tasks_queued_scheduled (0055).
-- transactional: false
DROP INDEX IF EXISTS idx_tasks_status_scheduled;
