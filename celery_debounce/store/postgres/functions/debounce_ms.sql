-- debounce_ms: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

CREATE OR REPLACE FUNCTION debounce_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $$;
