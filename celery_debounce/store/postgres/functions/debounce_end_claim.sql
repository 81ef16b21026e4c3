-- debounce_end_claim: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- End a run's claim now: the next take finds it lapsed ('stale'), and the message's
-- next delivery claims it instead of being skipped as a duplicate.
CREATE OR REPLACE FUNCTION debounce_end_claim(p_task_id text) RETURNS integer
LANGUAGE sql AS $$
    WITH ended AS (
        UPDATE debounce_taken t SET claim_until = clock_timestamp()
        WHERE t.task_id = p_task_id AND t.state = 'claimed'
        RETURNING 1
    )
    SELECT count(*)::integer FROM ended
$$;
