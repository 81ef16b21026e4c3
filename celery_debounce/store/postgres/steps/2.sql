-- Schema version 1 -> 2: cancelling a window (functions/debounce_cancel.sql).
--
-- debounce_cancelled  what each cancel dropped, under the cancel's token, kept
--                     p_keep_ms: a cancel whose reply was lost is sent again with
--                     the same token and gets the first answer instead of acting
--                     twice, and cancelled_by() reads it. Expired rows go at the
--                     next cancel (debounce_cancelled_until).

CREATE TABLE debounce_cancelled (
    token text PRIMARY KEY,
    task_id text NOT NULL,
    ident text NOT NULL,
    first_seen timestamptz NOT NULL,
    deadline timestamptz NOT NULL,
    max_wait_ms bigint NOT NULL,
    calls integer NOT NULL,
    capped boolean NOT NULL,
    -- the callers' fixed ids of the window (debounce_open.aliases): revoked with it
    aliases text[] NOT NULL,
    until timestamptz NOT NULL
);
CREATE INDEX debounce_cancelled_until ON debounce_cancelled (until);
