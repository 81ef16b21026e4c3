-- debounce_count_call: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- A call the gate accepted: i (calls in) + 1, and s + 1 when it was suppressed (a
-- leading-only quiet period folded it into the leading run), in the ident's slot.
-- plpgsql (as every function called per call or per row here): its plans are kept for
-- the session, where a SQL function's would be made again at each call.
CREATE OR REPLACE FUNCTION debounce_count_call(p_ident text, p_suppressed boolean, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_task text;
    v_kind text;
BEGIN
    -- debounce_gate_many counts its calls once, at its end
    IF current_setting('debounce.in_batch', true) = 'on' THEN
        RETURN;
    END IF;
    v_task := debounce_task_of(p_ident);
    IF v_task IS NULL THEN
        RETURN;
    END IF;
    -- a row per kind, i before s (one lock order), each a one-row VALUES: this runs
    -- once per call, and a filtered, sorted set of kinds cost it about 15% more
    FOREACH v_kind IN ARRAY CASE WHEN p_suppressed THEN '{i,s}'::text[] ELSE '{i}'::text[] END
    LOOP
        INSERT INTO debounce_stats AS s (task, kind, slot, n, updated_at)
        VALUES (v_task, v_kind, abs(hashtext(p_ident) % 16), 1, p_now)
        ON CONFLICT (task, kind, slot) DO UPDATE SET
            n = CASE WHEN s.updated_at < p_now - debounce_history_ttl() THEN 1 ELSE s.n + 1 END,
            updated_at = p_now;
    END LOOP;
END
$$;
