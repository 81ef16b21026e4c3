-- debounce_finish: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The run ended with Celery state p_state: the window is 'finished' (idempotent), its
-- payload dropped, kept p_ttl_ms; an exclusive window held behind it is due now.
-- No row: no record was there.
CREATE OR REPLACE FUNCTION debounce_finish(p_task_id text, p_state text, p_ttl_ms bigint)
RETURNS TABLE (aliases text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_ident text;
    v_exclusive boolean;
    v_aliases text[];
BEGIN
    UPDATE debounce_taken t
    SET state = 'finished', result_state = p_state, payload = '', options_json = '',
        claim_until = NULL, redelivered = false,
        until = v_now + p_ttl_ms * interval '1 millisecond'
    WHERE t.task_id = p_task_id
    RETURNING t.ident, t.exclusive, t.aliases INTO v_ident, v_exclusive, v_aliases;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_exclusive THEN
        UPDATE debounce_open o SET deadline = least(o.deadline, v_now)
        WHERE o.ident = v_ident AND o.held_since IS NOT NULL;
        IF FOUND THEN
            PERFORM pg_notify(debounce_wake_channel(), '');
        END IF;
    END IF;
    RETURN QUERY SELECT v_aliases;
END
$$;
