-- A task's own handler timeout in milliseconds (issue 14 item 3), set at submit; it wins over
-- the kind's timeout given to runtime.register(). SQL NULL: the kind's (or none).
-- transactional: false
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS timeout_ms BIGINT;
