-- debounce_gate: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- One call: open the ident's window, or join the open one. Atomic for racing callers on
-- one ident (INSERT ... ON CONFLICT DO UPDATE). The deadline is
-- least(now + window, first seen + max wait): never past the opener's ceiling. A join
-- counts the call and, with p_replace, replaces the arguments (debounce_replacement:
-- the opener's embed and serializer stay, or DBR01, nothing written); the opener's
-- options stay. p_embed: a body that is not JSON, its embed as JSON.
-- The call that reaches the window's cap (p_max_calls, the opener's) closes it.
-- A fixed id (p_alias, its JSON, not NULL) opens the window under p_task_id unless that
-- id is in use (then under p_fallback_id); joining, it is recorded as an alias (at most
-- p_max_aliases: past that, refused with DBA01, nothing written); with p_canvas also
-- when it opens. opened: this call inserted the window.
-- p_edge ('' none, 'L' leading only, 'B' leading and trailing): with no quiet period
-- running and no open window, the call is a leading run (edge 'lead': closed at once,
-- the quiet period starts); during the quiet period the call moves its end and is
-- suppressed ('L', folded into the leading run) or joins or opens the trailing window
-- ('B', deadline the period's end, never past the leading call's ceiling).
--
-- A collect call (p_budget not NULL, the call's
-- debounce_max_payload_bytes, with p_collect_embed, its protocol-2 embed JSON; p_payload
-- its JSON [args, kwargs(, id)]) adds its element to debounce_calls. One whose element
-- cannot fit an empty window is refused (DBP01, nothing written). A call the open window
-- cannot take closes it and opens the next: a collect call it does not fit (full:
-- closed as the cap closes), or a call of the other mode (a deploy turned collect on or
-- off: closed as a flush closes). Each call is counted in debounce_stats (i, s).
CREATE OR REPLACE FUNCTION debounce_gate(
    p_ident text, p_task_id text, p_window_ms bigint, p_max_wait_ms bigint,
    p_content_type text, p_payload bytea, p_options_json text, p_replace boolean,
    p_exclusive boolean, p_max_calls integer, p_alias text, p_fallback_id text,
    p_canvas boolean, p_max_aliases integer, p_embed text, p_edge text,
    p_budget integer, p_collect_embed text)
RETURNS TABLE (task_id text, opened boolean, deadline_ms bigint, calls integer,
               now_ms bigint, edge text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_id text;
    v_row record;
    v_quiet record;
    v_qend timestamptz;
    v_leading boolean := false;
    v_first_seen timestamptz := v_now;
    v_max_wait bigint := p_max_wait_ms;
    v_trailing boolean := false;
    v_element bytea;
    v_bytes integer;
BEGIN
    IF p_budget IS NOT NULL THEN
        v_element := convert_to('[' || debounce_ms(v_now) || ',', 'UTF8')
                     || substring(p_payload FROM 2);
        v_bytes := 10 + octet_length(convert_to(p_collect_embed, 'UTF8'))
                   + octet_length(v_element);
        IF v_bytes > p_budget THEN
            PERFORM debounce_refuse('DBP01', format(
                'this call makes a body of %s bytes, above debounce_max_payload_bytes=%s',
                v_bytes, p_budget), NULL::text);
        END IF;
    END IF;
    IF p_edge <> '' THEN
        -- edge calls of one ident are serialized: two racing first calls of a burst
        -- must not both be its leading run
        PERFORM pg_advisory_xact_lock(hashtext('debounce_quiet:' || p_ident));
        SELECT q.task_id, q.first_seen, q.max_wait_ms, q.quiet_end INTO v_quiet
        FROM debounce_quiet q WHERE q.ident = p_ident;
        IF FOUND AND v_quiet.quiet_end > v_now THEN
            v_qend := least(v_now + p_window_ms * interval '1 millisecond',
                            v_quiet.first_seen + v_quiet.max_wait_ms * interval '1 millisecond');
            UPDATE debounce_quiet q SET quiet_end = v_qend, calls = q.calls + 1
            WHERE q.ident = p_ident RETURNING q.calls INTO v_row;
            IF p_edge = 'L' THEN  -- leading only: folded into the leading run
                PERFORM debounce_count_call(p_ident, true, v_now);
                RETURN QUERY SELECT v_quiet.task_id, false, debounce_ms(v_qend),
                                    v_row.calls, debounce_ms(v_now), 'suppressed'::text;
                RETURN;
            END IF;
            -- leading and trailing: the trailing window inherits the period's ceiling
            v_first_seen := v_quiet.first_seen;
            v_max_wait := v_quiet.max_wait_ms;
            v_trailing := true;
        ELSIF NOT EXISTS (SELECT 1 FROM debounce_open o WHERE o.ident = p_ident) THEN
            v_leading := true;
        END IF;
    END IF;
    IF p_alias IS NOT NULL THEN
        -- calls opening under one fixed id are serialized, so that the second one sees
        -- the first one's window (the unique index stands behind it)
        PERFORM pg_advisory_xact_lock(hashtext(p_task_id));
    END IF;
    LOOP
        v_id := p_task_id;
        IF p_alias IS NOT NULL AND (
                EXISTS (SELECT 1 FROM debounce_taken t WHERE t.task_id = p_task_id)
                OR EXISTS (SELECT 1 FROM debounce_open o
                           WHERE o.task_id = p_task_id AND o.ident <> p_ident)) THEN
            v_id := p_fallback_id;
        END IF;
        INSERT INTO debounce_open AS w (ident, task_id, first_seen, deadline, max_wait_ms,
                                        calls, content_type, payload, options_json,
                                        max_calls, capped, exclusive, aliases, embed,
                                        is_leading, is_trailing, collect_bytes,
                                        collect_budget)
        VALUES (p_ident, v_id, v_first_seen,
                CASE WHEN p_max_calls <= 1 OR v_leading THEN v_now
                     WHEN v_trailing THEN v_qend
                     ELSE v_now + least(p_window_ms, p_max_wait_ms) * interval '1 millisecond'
                END,
                v_max_wait, 1, p_content_type,
                CASE WHEN p_budget IS NULL THEN p_payload
                     ELSE convert_to(p_collect_embed, 'UTF8') END,
                p_options_json, p_max_calls,
                coalesce(p_max_calls <= 1 AND NOT v_leading, false), p_exclusive,
                CASE WHEN p_alias IS NOT NULL AND (p_canvas OR v_id <> p_task_id)
                     THEN ARRAY[p_alias] ELSE '{}'::text[] END, nullif(p_embed, ''),
                v_leading, v_trailing, v_bytes, p_budget)
        ON CONFLICT (ident) DO UPDATE SET
            deadline = CASE WHEN w.calls + 1 >= w.max_calls THEN v_now
                            ELSE least(v_now + p_window_ms * interval '1 millisecond',
                                       w.first_seen + w.max_wait_ms * interval '1 millisecond')
                       END,
            calls = w.calls + 1,
            capped = coalesce(w.calls + 1 >= w.max_calls, false),
            payload = CASE WHEN p_replace THEN debounce_replacement(
                               w.task_id, w.content_type, w.payload, w.embed,
                               excluded.content_type, excluded.payload, p_embed)
                           ELSE w.payload END,
            aliases = CASE
                WHEN p_alias IS NULL OR w.task_id = p_task_id THEN w.aliases
                WHEN cardinality(w.aliases) >= p_max_aliases THEN debounce_refuse(
                    'DBA01', format('window %s already records %s caller ids', w.task_id,
                                    cardinality(w.aliases)), NULL::text[])
                ELSE w.aliases || p_alias END,
            collect_bytes = w.collect_bytes + 1 + octet_length(v_element)
        -- the window takes the call: of its mode, and, collecting, with room for it
        WHERE (w.collect_budget IS NULL) = (p_budget IS NULL)
          AND (p_budget IS NULL
               OR w.collect_bytes + 1 + octet_length(v_element) <= w.collect_budget)
        RETURNING w.task_id, w.xmax = 0 AS opened, w.deadline, w.calls, w.capped
        INTO v_row;
        EXIT WHEN FOUND;
        -- it does not (the row is locked now): full, it closes as the cap closes it;
        -- of the other mode, as a flush does. This call opens the next window.
        UPDATE debounce_open o SET capped = true
        WHERE o.ident = p_ident AND o.collect_budget IS NOT NULL AND p_budget IS NOT NULL;
        PERFORM debounce_close(p_ident, '', v_now);
    END LOOP;
    IF p_budget IS NOT NULL THEN
        INSERT INTO debounce_calls (task_id, seq, element)
        VALUES (v_row.task_id, v_row.calls, v_element);
    END IF;
    IF v_row.capped OR (v_leading AND v_row.opened) THEN
        PERFORM debounce_close(p_ident, v_row.task_id, v_now);
    ELSIF v_row.opened AND NOT EXISTS (
            SELECT 1 FROM debounce_open o
            WHERE o.deadline < v_row.deadline AND o.deadline >= v_now - interval '1 second')
    THEN
        -- the earliest deadline now: a dispatcher sleeping until a later one wakes. Only
        -- recent deadlines are looked at: the windows taken while a snapshot is held open
        -- stay in the index until it ends, at its low end, and a scan from the lowest
        -- deadline read every one. A window overdue by more has a dispatcher busy or
        -- gone; at worst this call wakes one for nothing.
        PERFORM pg_notify(debounce_wake_channel(), '');
    END IF;
    IF v_leading AND v_row.opened THEN  -- the quiet period starts
        INSERT INTO debounce_quiet AS q (ident, task_id, first_seen, max_wait_ms, quiet_end,
                                         calls)
        VALUES (p_ident, v_row.task_id, v_now, p_max_wait_ms,
                v_now + least(p_window_ms, p_max_wait_ms) * interval '1 millisecond', 1)
        ON CONFLICT (ident) DO UPDATE SET
            task_id = excluded.task_id, first_seen = excluded.first_seen,
            max_wait_ms = excluded.max_wait_ms, quiet_end = excluded.quiet_end, calls = 1;
    END IF;
    PERFORM debounce_count_call(p_ident, false, v_now);
    RETURN QUERY SELECT v_row.task_id, v_row.opened, debounce_ms(v_row.deadline),
                        v_row.calls, debounce_ms(v_now),
                        CASE WHEN v_leading AND v_row.opened THEN 'lead' ELSE '' END;
END
$$;

-- Version 1's signature, for a process of the previous package still running while
-- its deploy goes on (it checked the schema's version when it started): its calls are
-- never collect calls, and one that finds a collect window open closes it and opens
-- its own, as a call of the other mode does.
CREATE OR REPLACE FUNCTION debounce_gate(
    p_ident text, p_task_id text, p_window_ms bigint, p_max_wait_ms bigint,
    p_content_type text, p_payload bytea, p_options_json text, p_replace boolean,
    p_exclusive boolean, p_max_calls integer, p_alias text, p_fallback_id text,
    p_canvas boolean, p_max_aliases integer, p_embed text, p_edge text)
RETURNS TABLE (task_id text, opened boolean, deadline_ms bigint, calls integer,
               now_ms bigint, edge text)
LANGUAGE sql AS $$
    SELECT * FROM debounce_gate(p_ident, p_task_id, p_window_ms, p_max_wait_ms,
                                p_content_type, p_payload, p_options_json, p_replace,
                                p_exclusive, p_max_calls, p_alias, p_fallback_id, p_canvas,
                                p_max_aliases, p_embed, p_edge, NULL::integer, NULL::text)
$$;
