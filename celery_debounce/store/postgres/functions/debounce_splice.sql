-- debounce_splice: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The taken collect windows p_task_ids get their run's body, [[[e1,e2,...]],{},embed]
-- (their payload was the embed), and their calls leave debounce_calls. A window
-- without calls is left as it is.
CREATE OR REPLACE FUNCTION debounce_splice(p_task_ids text[]) RETURNS void
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM debounce_calls c WHERE c.task_id = ANY (p_task_ids) RETURNING c.*
    ), bodies AS (
        SELECT g.task_id, string_agg(g.element, '\x2c'::bytea ORDER BY g.seq) AS calls
        FROM gone g GROUP BY g.task_id
    )
    UPDATE debounce_taken t
    SET payload = '\x5b5b5b'::bytea || b.calls || '\x5d5d2c7b7d2c'::bytea || t.payload
                  || '\x5d'::bytea
    FROM bodies b WHERE t.task_id = b.task_id
$$;
