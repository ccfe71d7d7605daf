-- The Redis key prefix (its hash-tagged form) a worker's leases live under, written by each
-- registry heartbeat: a reconciler whose queue uses another prefix finds none of that worker's
-- leases, and leaves its runs alone while the worker is live (ARCHITECTURE.md, "Another prefix is
-- not a dead worker"). NULL for rows of workers older than the column: reclaimed as before.
-- transactional: false
ALTER TABLE workers ADD COLUMN IF NOT EXISTS redis_key_prefix TEXT;
