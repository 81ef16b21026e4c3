-- debounce_count: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Add each (task, kind, n) to the counters, in (task, kind) order (two takes counting
-- the same tasks lock their rows in the same order: no deadlock); a counter past the
-- history TTL starts again from n.
CREATE OR REPLACE FUNCTION debounce_count(p_tasks text[], p_kinds text[], p_ns bigint[],
                               p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO debounce_stats AS s (task, kind, n, updated_at)
    SELECT c.task, c.kind, sum(c.n), p_now
    FROM unnest(p_tasks, p_kinds, p_ns) AS c(task, kind, n)
    WHERE c.task IS NOT NULL AND c.n IS NOT NULL
    GROUP BY c.task, c.kind ORDER BY c.task, c.kind
    ON CONFLICT (task, kind, slot) DO UPDATE SET
        n = CASE WHEN s.updated_at < p_now - debounce_history_ttl() THEN excluded.n
                 ELSE s.n + excluded.n END,
        updated_at = p_now;
END
$$;
