-- debounce_sweep: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The record sweep: up to p_limit records past their until that are 'finished' (kept
-- for their TTL after the run) or 'quarantined' (never: until 'infinity'), and up to
-- p_limit quiet periods over, are deleted, FOR UPDATE SKIP LOCKED (a row another
-- transaction holds, or a quiet period an edge call of its ident is reading, waits for
-- the next sweep). A window in progress ('dispatching', 'queued', 'claimed', 'stale')
-- and an open window are never deleted. How many rows went (p_limit or more: call
-- again).
CREATE OR REPLACE FUNCTION debounce_sweep(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_taken integer;
    v_quiet integer := 0;
    v_ident text;
BEGIN
    WITH gone AS (
        SELECT t.task_id FROM debounce_taken t
        WHERE t.state IN ('finished', 'quarantined') AND t.until <= v_now
        LIMIT p_limit FOR UPDATE SKIP LOCKED
    )
    DELETE FROM debounce_taken t USING gone WHERE t.task_id = gone.task_id;
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    FOR v_ident IN
        SELECT q.ident FROM debounce_quiet q WHERE q.quiet_end <= v_now
        LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        -- an edge call of this ident holds the lock debounce_gate takes: left alone
        IF pg_try_advisory_xact_lock(hashtext('debounce_quiet:' || v_ident)) THEN
            DELETE FROM debounce_quiet q WHERE q.ident = v_ident AND q.quiet_end <= v_now;
            v_quiet := v_quiet + 1;
        END IF;
    END LOOP;
    RETURN v_taken + v_quiet;
END
$$;
