-- jobs: one row per submitted job (spec §4), plus request_hash and the optimistic-lock version.
-- transactional: false
CREATE TABLE IF NOT EXISTS jobs (
    id UUID NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata JSONB,
    idempotency_key TEXT,
    request_hash TEXT,
    version BIGINT NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT jobs_idempotency_key_key UNIQUE (idempotency_key),
    CONSTRAINT jobs_status_check
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled'))
);
