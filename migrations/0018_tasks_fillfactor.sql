-- Keep 30 % of each tasks heap page free. Every claim and completion rewrites the whole row;
-- once job_position, result, progress, retry_policy and timeout_ms widened it, the dead versions those rewrites leave behind were
-- no longer pruned as before and each completion's settle probe walked them all
-- (benchmarks/PROFILE.md, third pass). A PostgreSQL heap setting; CockroachDB accepts
-- fillfactor as a no-op. Idempotent without IF NOT EXISTS: setting it again changes nothing.
-- transactional: false
ALTER TABLE tasks SET (fillfactor = 70);
