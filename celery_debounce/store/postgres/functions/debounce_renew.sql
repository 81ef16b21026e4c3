-- debounce_renew: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Extend the live claims of these runs by p_lease_ms: a claim whose lease passed, or
-- that ended, is never brought back. How many were renewed.
CREATE OR REPLACE FUNCTION debounce_renew(p_task_ids text[], p_lease_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t
    SET claim_until = v_now + p_lease_ms * interval '1 millisecond'
    WHERE t.task_id = ANY (p_task_ids) AND t.state = 'claimed' AND t.claim_until > v_now;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
