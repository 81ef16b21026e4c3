-- debounce_running: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- True while a debounce_exclusive window of p_ident is in progress (taken, published
-- or claimed, not finished): a due exclusive window of that ident is held.
CREATE OR REPLACE FUNCTION debounce_running(p_ident text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM debounce_taken t
                   WHERE t.ident = p_ident AND t.exclusive
                     AND t.state IN ('dispatching', 'queued', 'claimed'))
$$;
