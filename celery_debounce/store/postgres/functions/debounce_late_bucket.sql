-- debounce_late_bucket: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The lateness bucket of a window taken p_late_ms after its deadline: the index
-- (0-based) of the first of the connection's debounce.late_buckets_ms bounds it is
-- within, the number of bounds when above them all; NULL when they are not set.
CREATE OR REPLACE FUNCTION debounce_late_bucket(p_late_ms bigint) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_bounds bigint[] := string_to_array(
        nullif(current_setting('debounce.late_buckets_ms', true), ''), ',')::bigint[];
BEGIN
    IF v_bounds IS NULL THEN
        RETURN NULL;
    END IF;
    FOR v_b IN 1 .. cardinality(v_bounds) LOOP
        IF p_late_ms <= v_bounds[v_b] THEN
            RETURN v_b - 1;
        END IF;
    END LOOP;
    RETURN cardinality(v_bounds);
END
$$;
