-- Webhooks (issue 16 item 2): a subscription to outbox event types and its delivery state.
-- cursor_at/cursor_id is the outbox position ((created_at, id) of events) delivered up to;
-- attempts, next_attempt_at, last_status, last_error and last_attempt_at are the delivery log
-- of the event after it. The secret is stored because it signs every delivery (it is not an
-- API token). A handful of rows, read by primary key: no secondary index.
-- transactional: false
CREATE TABLE IF NOT EXISTS webhooks (
    id UUID NOT NULL PRIMARY KEY,
    url TEXT NOT NULL,
    events TEXT[] NOT NULL,
    secret TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    cursor_at TIMESTAMPTZ NOT NULL,
    cursor_id UUID NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ,
    last_status BIGINT,
    last_error TEXT,
    last_attempt_at TIMESTAMPTZ,
    delivered BIGINT NOT NULL DEFAULT 0
);
