-- Listing (issue 14 item 5): GET /v1/tasks?kind= reads the kind's range newest first; kind,
-- created_at, job_position and id never change after the insert.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_tasks_kind_created ON tasks (kind, created_at, job_position, id);
