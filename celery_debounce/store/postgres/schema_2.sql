-- Schema version 1 -> 2 (schema.sql creates version 1; PostgresStore.migrate() applies
-- this after it, on a new database as on one of version 1): cancelling a window.
--
-- debounce_cancelled  what each cancel dropped, under the cancel's token, kept
--                     p_keep_ms: a cancel whose reply was lost is sent again with
--                     the same token and gets the first answer instead of acting
--                     twice, and cancelled_by() reads it. Expired rows go at the
--                     next cancel (debounce_cancelled_until).
-- debounce_cancel     reads debounce_cancelled (token), deletes from debounce_open
--                     (ident, task id), inserts into debounce_cancelled.

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

-- Drop the open window of p_ident (of p_task_id unless ''): it never runs. Only an
-- open window can be cancelled: once taken, a window is the broker's. A held exclusive
-- window is an open one (held_since): it goes, held no more. What was dropped is kept
-- under p_token for p_keep_ms, and a call with a token already used returns that row
-- without acting. No row: nothing (matching) was open.
CREATE FUNCTION debounce_cancel(p_ident text, p_task_id text, p_token text,
                                p_keep_ms bigint)
RETURNS SETOF debounce_cancelled
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY SELECT * FROM debounce_cancelled c WHERE c.token = p_token;
    IF FOUND THEN
        RETURN;
    END IF;
    DELETE FROM debounce_cancelled c WHERE c.until < v_now;
    RETURN QUERY
    WITH gone AS (
        DELETE FROM debounce_open o
        WHERE o.ident = p_ident AND (p_task_id = '' OR o.task_id = p_task_id)
        RETURNING o.*
    )
    INSERT INTO debounce_cancelled AS n
    SELECT p_token, g.task_id, g.ident, g.first_seen, g.deadline, g.max_wait_ms, g.calls,
           g.capped, g.aliases, v_now + p_keep_ms * interval '1 millisecond'
    FROM gone g
    RETURNING n.*;
END
$$;
