-- A task's result: its handler's return value (issue 13), written with the success that ends
-- the run. Nullable: SQL NULL until the task completes, and for a handler that returned None.
-- transactional: false
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS result JSONB;
