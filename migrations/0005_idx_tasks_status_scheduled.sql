-- Spec §4 idx_tasks_status_scheduled, extended with id: serves due_queued's keyset
-- (status = 'queued' AND (scheduled_at, id) > cursor ORDER BY scheduled_at, id).
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_status_scheduled ON tasks (status, scheduled_at, id);
