-- idx_jobs_status_updated (0002, spec §4: status, updated_at DESC) is covered by
-- idx_jobs_status_updated_id (0030: status, updated_at, id), which retention's keyset reads and
-- which serves either direction of updated_at; no statement reads 0002's index (docs/SQL.md).
-- Every job insert and job status change wrote an entry into both (issue 17: fewer index
-- entries per write; found by the submit pass).
-- transactional: false
DROP INDEX IF EXISTS idx_jobs_status_updated;
