-- debounce_ack: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Published: these taken windows are queued, kept for p_ttl_ms (then swept). Idempotent:
-- how many were dispatching and are now queued.
CREATE OR REPLACE FUNCTION debounce_ack(p_task_ids text[], p_ttl_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t
    SET state = 'queued', until = v_now + p_ttl_ms * interval '1 millisecond'
    WHERE t.task_id = ANY (p_task_ids) AND t.state = 'dispatching';
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
