-- A task's own retry backoff (issue 14 item 3): {"backoff": "fixed"|"exponential",
-- "delay_ms"?, "max_delay_ms"?, "jitter"}, set at submit and never changed; SQL NULL means the
-- deployment's fixed RETRY_BACKOFF. Read by the failure report to schedule the retry.
-- transactional: false
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS retry_policy JSONB;
