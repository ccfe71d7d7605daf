-- Spec §4: per-kind views for operations.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_kind_status ON tasks (kind, status);
