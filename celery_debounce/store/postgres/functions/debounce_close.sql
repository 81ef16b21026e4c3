-- debounce_close: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Close the open window of p_ident (of id p_task_id unless ''): it moves to
-- debounce_taken as 'dispatching' with its lease over and tries 0, so the next take
-- takes it (tries 1); its deadline becomes p_now if later; a collect window's body is
-- spliced.
CREATE OR REPLACE FUNCTION debounce_close(p_ident text, p_task_id text, p_now timestamptz)
RETURNS SETOF debounce_taken
LANGUAGE plpgsql AS $$
DECLARE
    v_id text;
    v_collect boolean;
BEGIN
    WITH moved AS (
        DELETE FROM debounce_open o
        WHERE o.ident = p_ident AND (p_task_id = '' OR o.task_id = p_task_id)
        RETURNING o.*
    ), inserted AS (
        INSERT INTO debounce_taken AS n (task_id, ident, first_seen, deadline, max_wait_ms,
                                         calls, content_type, payload, options_json, state,
                                         taken_at, until, tries, capped, is_leading,
                                         is_trailing, exclusive, aliases)
        SELECT m.task_id, m.ident, m.first_seen, least(m.deadline, p_now), m.max_wait_ms,
               m.calls, m.content_type, m.payload, m.options_json, 'dispatching', p_now,
               p_now, 0, m.capped, m.is_leading, m.is_trailing, m.exclusive, m.aliases
        FROM moved m
        RETURNING n.task_id
    )
    SELECT m.task_id, m.collect_budget IS NOT NULL INTO v_id, v_collect
    FROM moved m JOIN inserted i ON i.task_id = m.task_id;
    IF v_id IS NULL THEN
        RETURN;
    END IF;
    IF v_collect THEN
        PERFORM debounce_splice(ARRAY[v_id]);
    END IF;
    PERFORM pg_notify(debounce_wake_channel(), '');  -- due now (sent at commit)
    RETURN QUERY SELECT * FROM debounce_taken t WHERE t.task_id = v_id;
END
$$;
