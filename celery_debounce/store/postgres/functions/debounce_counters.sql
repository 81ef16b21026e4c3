-- debounce_counters: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The counters not past the history TTL, as {"<kind>|<task>": n}.
CREATE OR REPLACE FUNCTION debounce_counters() RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT coalesce(json_object_agg(c.name, c.n), '{}')
    FROM (SELECT s.kind || '|' || s.task AS name, sum(s.n) AS n FROM debounce_stats s
          WHERE s.updated_at >= clock_timestamp() - debounce_history_ttl()
          GROUP BY s.kind, s.task) AS c
$$;
