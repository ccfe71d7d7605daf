-- Whether some task of the job depends on another, fixed at submit: a worker that claimed a task
-- of a job without dependencies records its success without looking for dependents to promote
-- (ARCHITECTURE.md, "A flat job's completion looks for no dependents"). NULL for jobs stored
-- before the column: unknown, so their completions look as before.
-- transactional: false
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS has_dependencies BOOL;
