-- The transition outbox (issue 16 item 1): one row per task or job status change, written in
-- the transaction of the change. Ordered by (created_at, id), the primary key: created_at is
-- the database clock at the statement that writes the row, the last one before COMMIT (see
-- ARCHITECTURE.md "Outbox and event stream"). No foreign key to jobs: the insert on the hot
-- path stays one statement with no parent lookups; retention deletes a job's events with it.
-- transactional: false
CREATE TABLE IF NOT EXISTS events (
    created_at TIMESTAMPTZ NOT NULL,
    id UUID NOT NULL,
    job_id UUID NOT NULL,
    task_id UUID,
    type TEXT NOT NULL,
    data JSONB NOT NULL,
    PRIMARY KEY (created_at, id)
);
