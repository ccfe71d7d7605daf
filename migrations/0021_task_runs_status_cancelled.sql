-- A run whose task was cancelled while it ran ends 'cancelled' (issue 14 item 1). One ALTER
-- TABLE statement that drops the narrow check and adds the widened one under the same name: atomic
-- on PostgreSQL, and the form CockroachDB documents for replacing a constraint in one statement.
-- Idempotent without IF NOT EXISTS (which ADD CONSTRAINT lacks on PostgreSQL): run again, it
-- drops the widened check IF EXISTS and adds it back. NOT VALID: existing rows (all within the
-- narrower set) are not rescanned under the table lock; every new write is checked.
-- transactional: false
ALTER TABLE task_runs
    DROP CONSTRAINT IF EXISTS task_runs_status_check,
    ADD CONSTRAINT task_runs_status_check
        CHECK (status IN ('running', 'succeeded', 'failed', 'dead', 'cancelled')) NOT VALID;
