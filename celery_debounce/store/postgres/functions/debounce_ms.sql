-- debounce_ms: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- A time as milliseconds since the epoch. STABLE, as extract() on a timestamptz is:
-- the planner inlines a SQL function only when its body is no more volatile than it is
-- declared, and run as a function each call cost about 10 µs (twice per gate call).
CREATE OR REPLACE FUNCTION debounce_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $$;
