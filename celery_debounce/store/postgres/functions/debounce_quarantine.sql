-- debounce_quarantine: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Set a taken window aside for good: 'dispatching' -> 'quarantined', kept until an
-- operator deletes it (until 'infinity': the record sweep leaves it); its aliases, or
-- no row when it was not dispatching.
CREATE OR REPLACE FUNCTION debounce_quarantine(p_task_id text, p_reason text)
RETURNS TABLE (aliases text[])
LANGUAGE sql AS $$
    UPDATE debounce_taken t SET state = 'quarantined', reason = p_reason, until = 'infinity'
    WHERE t.task_id = p_task_id AND t.state = 'dispatching'
    RETURNING t.aliases
$$;
