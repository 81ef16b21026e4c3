-- debounce_layouts: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Write the layouts p_write (now), drop those not written for p_keep_ms; a first row
-- (name NULL) with the server's time, then every layout with when it was last written.
CREATE OR REPLACE FUNCTION debounce_layouts(p_write text[], p_keep_ms bigint)
RETURNS TABLE (now_ms bigint, name text, written_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO debounce_layouts AS l (name, written_at)
    SELECT DISTINCT w.n, v_now FROM unnest(p_write) AS w(n)
    ON CONFLICT (name) DO UPDATE SET written_at = excluded.written_at;
    DELETE FROM debounce_layouts l
    WHERE l.written_at < v_now - p_keep_ms * interval '1 millisecond';
    RETURN QUERY SELECT debounce_ms(v_now), NULL::text, NULL::bigint;
    RETURN QUERY SELECT debounce_ms(v_now), l.name, debounce_ms(l.written_at)
                 FROM debounce_layouts l ORDER BY l.name;
END
$$;
