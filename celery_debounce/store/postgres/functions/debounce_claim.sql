-- debounce_claim: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- A worker is about to run the window's message. A delivery of a finished window, or
-- of one claimed under a live lease (unless p_retry: a retry of the run takes the
-- claim over), is a duplicate: run false (a claimed one is marked redelivered). A
-- 'dispatching', 'queued', 'stale' or lapsed 'claimed' window is claimed for
-- p_lease_ms, marked last_delivery when p_last (the last delivery its quorum queue
-- allows: should that claim lapse, debounce_take hands the window to the expiry
-- sweep). A record that is gone runs (state ''), as does a quarantined one.
-- A duplicate delivery, skipped, is counted (d).
CREATE OR REPLACE FUNCTION debounce_claim(p_task_id text, p_lease_ms bigint, p_retry boolean,
                               p_last boolean)
RETURNS TABLE (before text, now_ms bigint, run boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_state text;
    v_until timestamptz;
    v_ident text;
BEGIN
    SELECT t.state, t.claim_until, t.ident INTO v_state, v_until, v_ident FROM debounce_taken t
    WHERE t.task_id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT ''::text, debounce_ms(v_now), true;
        RETURN;
    END IF;
    IF v_state = 'finished' OR (v_state = 'claimed' AND NOT p_retry AND v_until > v_now)
    THEN
        IF v_state = 'claimed' THEN
            UPDATE debounce_taken t SET redelivered = true WHERE t.task_id = p_task_id;
        END IF;
        PERFORM debounce_count(ARRAY[debounce_task_of(v_ident)], ARRAY['d'],
                               ARRAY[1::bigint], v_now);  -- a duplicate skipped
        RETURN QUERY SELECT v_state, debounce_ms(v_now), false;
        RETURN;
    END IF;
    IF v_state IN ('dispatching', 'queued', 'stale', 'claimed') THEN
        UPDATE debounce_taken t
        SET state = 'claimed', claim_until = v_now + p_lease_ms * interval '1 millisecond',
            redelivered = false, last_delivery = p_last
        WHERE t.task_id = p_task_id;
    END IF;
    RETURN QUERY SELECT v_state, debounce_ms(v_now), true;
END
$$;
