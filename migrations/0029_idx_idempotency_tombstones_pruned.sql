-- The retention pass deletes expired tombstones oldest first, a bounded page at a time
-- (pruned_at < now() - IDEMPOTENCY_KEY_TTL ORDER BY pruned_at LIMIT n): a range scan here.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_idempotency_tombstones_pruned
    ON idempotency_tombstones (pruned_at, idempotency_key);
