-- A task's index in its job's submission (0-based): GET /v1/jobs/{id}/results lists the job
-- in submission order. Tasks stored before this migration read 0 (then ordered by id).
-- transactional: false
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS job_position BIGINT NOT NULL DEFAULT 0;
