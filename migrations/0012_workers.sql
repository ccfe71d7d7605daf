-- Optional worker registry (spec §4).
-- transactional: false
CREATE TABLE IF NOT EXISTS workers (
    id TEXT NOT NULL PRIMARY KEY,
    hostname TEXT,
    last_heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    metadata JSONB
);
