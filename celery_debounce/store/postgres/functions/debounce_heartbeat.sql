-- debounce_heartbeat: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Dispatcher p_name runs (p_alive) or stopped cleanly; rows not written for p_keep_ms
-- go. The server's time, ms.
CREATE OR REPLACE FUNCTION debounce_heartbeat(p_name text, p_alive boolean, p_keep_ms bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO debounce_dispatchers AS d (name, alive, seen_at)
    VALUES (p_name, p_alive, v_now)
    ON CONFLICT (name) DO UPDATE SET alive = excluded.alive, seen_at = excluded.seen_at;
    DELETE FROM debounce_dispatchers d
    WHERE d.seen_at < v_now - p_keep_ms * interval '1 millisecond';
    RETURN debounce_ms(v_now);
END
$$;
