-- Idempotency tombstones (issue 14 item 8): what is left of a pruned job created under an
-- Idempotency-Key, written in the transaction that deletes the job, so a replay of the key
-- still answers the original ids (task_ids: {"name": "task uuid", ...}) until the tombstone
-- is IDEMPOTENCY_KEY_TTL old. No foreign key: the job row is gone by design.
-- transactional: false
CREATE TABLE IF NOT EXISTS idempotency_tombstones (
    idempotency_key TEXT NOT NULL PRIMARY KEY,
    request_hash TEXT,
    job_id UUID NOT NULL,
    task_ids JSONB NOT NULL,
    pruned_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
