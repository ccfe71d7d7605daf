-- A task's progress (issue 13 item 5): the latest JSON value its handler reported with
-- task.progress(), written by the lease renewal fenced to the live run, and read by the next
-- attempt as task.checkpoint. Nullable: SQL NULL until a handler reports something.
-- transactional: false
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS progress JSONB;
