-- debounce_cancel: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Drop the open window of p_ident (of p_task_id unless ''): it never runs. Only an
-- open window can be cancelled: once taken, a window is the broker's. A held exclusive
-- window is an open one (held_since): it goes, held no more. What was dropped is kept
-- under p_token for p_keep_ms, and a call with a token already used returns that row
-- without acting. No row: nothing (matching) was open.
-- A collect window's calls go with it, and it is counted (x).
CREATE OR REPLACE FUNCTION debounce_cancel(p_ident text, p_task_id text, p_token text,
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
    -- a statement of its own, as the splice (above): it sees every call of the window
    DELETE FROM debounce_calls c USING debounce_cancelled k
    WHERE k.token = p_token AND c.task_id = k.task_id;
    PERFORM debounce_count(array_agg(debounce_task_of(k.ident)), array_agg('x'::text),
                           array_agg(1::bigint), v_now)
    FROM debounce_cancelled k WHERE k.token = p_token;
END
$$;
