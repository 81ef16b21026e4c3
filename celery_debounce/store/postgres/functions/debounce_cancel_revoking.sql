-- debounce_cancel_revoking: applied with CREATE OR REPLACE by every migrate, after the
-- steps (schema.py FUNCTIONS gives the order).

-- debounce_cancel for a caller that cannot reach the result backend (a producer in
-- another language): the open window of p_ident (of p_task_id unless '') is dropped
-- and never runs, and its outcome is handed to the dispatchers' expiry sweep. It moves
-- to debounce_taken 'finished' as REVOKED (reason 'cancelled', payload and options
-- gone, kept p_ttl_ms: the record TTL, as long as a window's record waits for its run,
-- so a dispatcher outage does not outlive it), expired, expires_at '-infinity': the next debounce_expire
-- returns it until debounce_expired confirms that REVOKED was stored for its id and
-- aliases. A collect window's calls go with it, and it is counted (x). No row:
-- nothing (matching) was open.
CREATE OR REPLACE FUNCTION debounce_cancel_revoking(p_ident text, p_task_id text,
                                                    p_ttl_ms bigint)
RETURNS SETOF debounce_taken
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_id text;
BEGIN
    WITH gone AS (
        DELETE FROM debounce_open o
        WHERE o.ident = p_ident AND (p_task_id = '' OR o.task_id = p_task_id)
        RETURNING o.*
    )
    INSERT INTO debounce_taken AS n (task_id, ident, first_seen, deadline, max_wait_ms,
                                     calls, content_type, payload, options_json, state,
                                     taken_at, until, tries, capped, is_leading,
                                     is_trailing, exclusive, aliases, result_state,
                                     reason, expires_at, expired)
    SELECT g.task_id, g.ident, g.first_seen, g.deadline, g.max_wait_ms, g.calls,
           g.content_type, '', '', 'finished', v_now,
           v_now + p_ttl_ms * interval '1 millisecond', 0, g.capped, g.is_leading,
           g.is_trailing, g.exclusive, g.aliases, 'REVOKED', 'cancelled', '-infinity', true
    FROM gone g
    RETURNING n.task_id INTO v_id;
    IF v_id IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM debounce_calls c WHERE c.task_id = v_id;
    PERFORM debounce_count(ARRAY[debounce_task_of(p_ident)], ARRAY['x'::text],
                           ARRAY[1::bigint], v_now);
    RETURN QUERY SELECT * FROM debounce_taken t WHERE t.task_id = v_id;
END
$$;
