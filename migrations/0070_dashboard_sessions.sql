-- Dashboard login sessions (issue 16 item 3), shared by every orchestrator and kept across
-- restarts. The dtq_session cookie holds a random id; only its SHA-256 is stored (id_hash),
-- with the id of the API token the session logged in with (never its secret: revocation and
-- expiry are read from api_tokens on each lookup) and the session's CSRF token. No foreign key:
-- tokens are revoked, never deleted, and the lookup joins on api_tokens' primary key anyway.
-- transactional: false
CREATE TABLE IF NOT EXISTS dashboard_sessions (
    id_hash TEXT NOT NULL PRIMARY KEY,
    token_id UUID NOT NULL,
    csrf TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
