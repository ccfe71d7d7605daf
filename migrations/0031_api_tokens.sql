-- Scoped API tokens (issue 15 item 3). Only the SHA-256 of a secret is stored, never the
-- secret; the API looks a token up by that hash, names are chosen by operators.
-- transactional: false
CREATE TABLE IF NOT EXISTS api_tokens (
    id UUID NOT NULL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    secret_hash TEXT NOT NULL UNIQUE,
    scopes TEXT[] NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ,
    revoked_at TIMESTAMPTZ
);
