-- debounce_release: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Not published: each (id, tries) window still leased to this dispatcher (still
-- 'dispatching' with those tries: one another dispatcher took again has more) is taken
-- again in p_delay_ms; p_counted also counts a publish failure against it. How many.
CREATE OR REPLACE FUNCTION debounce_release(p_task_ids text[], p_tries integer[],
                                 p_counted boolean[], p_delay_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t
    SET until = v_now + p_delay_ms * interval '1 millisecond',
        failures = t.failures + CASE WHEN r.counted THEN 1 ELSE 0 END
    FROM unnest(p_task_ids, p_tries, p_counted) AS r(task_id, tries, counted)
    WHERE t.task_id = r.task_id AND t.state = 'dispatching' AND t.tries = r.tries;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
