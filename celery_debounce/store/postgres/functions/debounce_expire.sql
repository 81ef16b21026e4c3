-- debounce_expire: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The expiry sweep: up to p_limit windows whose message expired more than p_grace_ms
-- ago on the server's clock and on the caller's (p_caller_ms; a clock stepped ahead
-- alone revokes nothing early), FOR UPDATE SKIP LOCKED. A 'queued' one is finished as
-- REVOKED (expired; an exclusive window held behind it is due now); a 'dispatching'
-- one (published again, not yet acked) is looked at again after the grace; any other
-- (claimed: running; finished by its run) leaves the sweep. Returns the windows it
-- finished, now or before, whose outcome debounce_expired has not confirmed.
-- First, the record sweep: debounce_sweep(p_sweep) (the dispatcher's periodic call).
CREATE OR REPLACE FUNCTION debounce_expire(p_grace_ms bigint, p_ttl_ms bigint, p_limit integer,
                                p_caller_ms bigint, p_sweep integer)
RETURNS TABLE (task_id text, aliases text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_upto timestamptz := least(v_now, coalesce(to_timestamp(p_caller_ms / 1000.0), v_now))
                          - p_grace_ms * interval '1 millisecond';
    v_row record;
BEGIN
    PERFORM debounce_sweep(p_sweep);
    FOR v_row IN
        SELECT t.task_id, t.state, t.expired, t.ident, t.exclusive, t.aliases
        FROM debounce_taken t WHERE t.expires_at <= v_upto
        ORDER BY t.expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        IF v_row.state = 'queued' THEN
            UPDATE debounce_taken t
            SET state = 'finished', result_state = 'REVOKED', expired = true, payload = '',
                options_json = '', until = v_now + p_ttl_ms * interval '1 millisecond'
            WHERE t.task_id = v_row.task_id;
            IF v_row.exclusive THEN
                UPDATE debounce_open o SET deadline = least(o.deadline, v_now)
                WHERE o.ident = v_row.ident AND o.held_since IS NOT NULL;
                IF FOUND THEN
                    PERFORM pg_notify(debounce_wake_channel(), '');
                END IF;
            END IF;
        ELSIF v_row.state = 'dispatching' THEN
            UPDATE debounce_taken t SET expires_at = v_now WHERE t.task_id = v_row.task_id;
            CONTINUE;
        ELSIF NOT (v_row.state = 'finished' AND v_row.expired) THEN
            UPDATE debounce_taken t SET expires_at = NULL WHERE t.task_id = v_row.task_id;
            CONTINUE;
        END IF;
        task_id := v_row.task_id;
        aliases := v_row.aliases;
        RETURN NEXT;
    END LOOP;
END
$$;
