-- debounce_history_ttl: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- How long a counter lives without a change: the connection's debounce.history_ttl_ms
-- (one hour when unset).
CREATE OR REPLACE FUNCTION debounce_history_ttl() RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('debounce.history_ttl_ms', true), '')::bigint,
                    3600000) * interval '1 millisecond'
$$;
