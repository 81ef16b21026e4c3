-- debounce_expired: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The outcome of these swept windows is stored: they leave the sweep. How many.
CREATE OR REPLACE FUNCTION debounce_expired(p_task_ids text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE debounce_taken t SET expires_at = NULL
    WHERE t.task_id = ANY (p_task_ids) AND t.expired;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
