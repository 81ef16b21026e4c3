-- debounce_put_back: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The run's message went back to the queue: 'claimed' -> 'queued' (its claim ends; an
-- exclusive key stays held, a queued window is in progress). False: not claimed.
CREATE OR REPLACE FUNCTION debounce_put_back(p_task_id text) RETURNS boolean
LANGUAGE sql AS $$
    WITH back AS (
        UPDATE debounce_taken t SET state = 'queued', claim_until = NULL,
                                    redelivered = false
        WHERE t.task_id = p_task_id AND t.state = 'claimed'
        RETURNING 1
    )
    SELECT count(*) > 0 FROM back
$$;
