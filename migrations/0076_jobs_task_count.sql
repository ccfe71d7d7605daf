-- How many tasks the job has, fixed at submit: the success of the only task of a one-task job
-- settles the job from the row its claim read, without reading what else is unfinished in the
-- job (ARCHITECTURE.md, "A one-task job settles from its claim"). NULL for jobs stored before
-- the column: unknown, so their completions settle as before.
-- transactional: false
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS task_count INT8;
