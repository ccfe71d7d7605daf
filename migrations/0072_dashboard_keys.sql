-- Signing keys every orchestrator shares (issue 16 item 3): the dashboard's login-form CSRF
-- key (name 'login_csrf'), created by the first orchestrator that needs it and read once per
-- process. A few rows, read by primary key.
-- transactional: false
CREATE TABLE IF NOT EXISTS dashboard_keys (
    name TEXT NOT NULL PRIMARY KEY,
    secret TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
