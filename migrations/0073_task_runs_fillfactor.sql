-- Keep half of each task_runs heap page free so that a run's end (status, finished_at, error:
-- no indexed column) is a HOT update on the page its start was inserted on, instead of a new
-- tuple elsewhere plus an entry in each of the table's two indexes (benchmarks/PROFILE.md,
-- "fifth pass"). A PostgreSQL heap setting; CockroachDB accepts fillfactor as a no-op.
-- Setting it again changes nothing.
-- transactional: false
ALTER TABLE IF EXISTS task_runs SET (fillfactor = 50);
