-- debounce_expiring: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The messages of these windows, just published, expire in p_left_ms (from now); a
-- finished or quarantined window is left alone. How many.
CREATE OR REPLACE FUNCTION debounce_expiring(p_task_ids text[], p_left_ms bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t SET expires_at = v_now + r.left_ms * interval '1 millisecond'
    FROM unnest(p_task_ids, p_left_ms) AS r(task_id, left_ms)
    WHERE t.task_id = r.task_id AND t.state NOT IN ('finished', 'quarantined');
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
