-- Spec §4: dependents(task_id) and the ON DELETE CASCADE through depends_on_task_id.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_task_dependencies_depends
    ON task_dependencies (depends_on_task_id);
