-- The retention pass deletes expired dashboard sessions oldest first, a bounded page at a
-- time (expires_at <= now() ORDER BY expires_at LIMIT n): a range scan here.
-- transactional: false
CREATE INDEX IF NOT EXISTS idx_dashboard_sessions_expires
    ON dashboard_sessions (expires_at, id_hash);
