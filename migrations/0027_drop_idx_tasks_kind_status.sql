-- idx_tasks_kind_created (0024) is the per-kind view for operations now: (kind, created_at,
-- job_position, id) serves GET /v1/tasks?kind= in key order. No statement reads
-- idx_tasks_kind_status (kind, status), and on PostgreSQL every claim and completion (never a HOT
-- update: status is indexed) wrote an entry into it: dropping it keeps the listing's net cost on
-- the hot path at one tasks index (ARCHITECTURE.md "Listing and counts").
-- transactional: false
DROP INDEX IF EXISTS idx_tasks_kind_status;
