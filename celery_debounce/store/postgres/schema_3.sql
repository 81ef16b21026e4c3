-- Schema version 2 -> 3 (PostgresStore.migrate() applies it after schema_2.sql):
-- debounce_collect windows, the counters of `celery debounce stats`, and
-- enqueue_many's chunk in one round trip (debounce_gate_many).
--
-- debounce_open.collect_bytes   a collect window (NULL: not one): bytes of the body
--                               its run gets, 10 + the embed + the elements + commas
-- debounce_open.collect_budget  its byte budget, the opener's
--                               debounce_max_payload_bytes; collect_bytes never
--                               exceeds it. The row's payload is the opener's
--                               protocol-2 embed JSON while the window is open.
-- debounce_calls                a collect window's calls, one row each: the window's
--                               id, the call's number in it (seq) and its element
--                               '[<ms>,' || the call's [args, kwargs(, id)] without
--                               its '[' (producer/collect.py owns the format).
--                               Written by debounce_gate; spliced into the taken
--                               window's body and deleted when the window leaves
--                               debounce_open (debounce_splice, from debounce_close
--                               and debounce_take); deleted by debounce_cancel.
-- debounce_stats                counters per task and kind (records.COUNTER_KINDS):
--                               bumped by debounce_take for each window it takes
--                               for the first time (r runs, c calls, m closed by the
--                               cap or full, e leading runs, f forced by the max wait,
--                               l<b> lateness bucket b, h held and hm ms held) and by
--                               debounce_cancel (x), debounce_claim (d, a duplicate
--                               delivery skipped), and by debounce_gate per call
--                               (i calls in, s suppressed). A counter not changed for the
--                               history TTL starts again from zero (readers skip it).
--                               The TTL and the lateness buckets come from the
--                               connection (debounce.history_ttl_ms,
--                               debounce.late_buckets_ms: the store sets them).
--
-- Why the splice is a statement of its own: a gate that joined a window committed
-- before the take could lock its row, but possibly after the take's statement took
-- its snapshot; the row lock reads the newest row, not the newest debounce_calls.
-- A later statement of the same function has a snapshot that holds every such call.

ALTER TABLE debounce_open ADD COLUMN collect_bytes integer,
                          ADD COLUMN collect_budget integer;

CREATE TABLE debounce_calls (
    task_id text NOT NULL,
    seq integer NOT NULL,
    element bytea NOT NULL,
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE debounce_stats (
    task text NOT NULL,
    kind text NOT NULL,
    -- the calls counted by the gate (i, s) are spread over 16 rows per task and kind,
    -- by ident, so that calls of different keys rarely wait for one another's row
    slot smallint NOT NULL DEFAULT 0,
    n bigint NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (task, kind, slot)
) WITH (fillfactor = 50);

-- The task name in an ident <n>:<task>:<key> (n: the name's UTF-8 bytes, as
-- keys.ident_prefix writes it): the first characters after "<n>:" that make n bytes.
-- NULL for an ident of another shape; never an error (a take counts every window it
-- takes with it: one malformed ident must not fail the take of the others).
CREATE FUNCTION debounce_task_of(p_ident text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_colon integer := position(':' IN p_ident);
    v_n integer;
    v_rest text;
BEGIN
    IF v_colon < 2 OR v_colon > 10 OR left(p_ident, v_colon - 1) !~ '^[0-9]+$' THEN
        RETURN NULL;
    END IF;
    v_n := left(p_ident, v_colon - 1)::integer;
    v_rest := substr(p_ident, v_colon + 1);
    IF octet_length(left(v_rest, v_n)) = v_n THEN  -- one byte a character: the usual
        RETURN left(v_rest, v_n);
    END IF;
    FOR v_c IN 1 .. v_n - 1 LOOP  -- fewer characters than bytes
        IF octet_length(left(v_rest, v_c)) = v_n THEN
            RETURN left(v_rest, v_c);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- How long a counter lives without a change: the connection's debounce.history_ttl_ms
-- (one hour when unset).
CREATE FUNCTION debounce_history_ttl() RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('debounce.history_ttl_ms', true), '')::bigint,
                    3600000) * interval '1 millisecond'
$$;

-- Add each (task, kind, n) to the counters, in (task, kind) order (two takes counting
-- the same tasks lock their rows in the same order: no deadlock); a counter past the
-- history TTL starts again from n.
CREATE FUNCTION debounce_count(p_tasks text[], p_kinds text[], p_ns bigint[],
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

-- A call the gate accepted: i (calls in) + 1, and s + 1 when it was suppressed (a
-- leading-only quiet period folded it into the leading run), in the ident's slot.
-- plpgsql (as every function called per call or per row here): its plans are kept for
-- the session, where a SQL function's would be made again at each call.
CREATE FUNCTION debounce_count_call(p_ident text, p_suppressed boolean, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_task text;
BEGIN
    -- debounce_gate_many counts its calls once, at its end
    IF current_setting('debounce.in_batch', true) = 'on' THEN
        RETURN;
    END IF;
    v_task := debounce_task_of(p_ident);
    IF v_task IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO debounce_stats AS s (task, kind, slot, n, updated_at)
    SELECT v_task, k.kind, abs(hashtext(p_ident) % 16), 1, p_now
    FROM (VALUES ('i'), ('s')) AS k(kind)
    WHERE k.kind = 'i' OR p_suppressed
    ORDER BY k.kind
    ON CONFLICT (task, kind, slot) DO UPDATE SET
        n = CASE WHEN s.updated_at < p_now - debounce_history_ttl() THEN 1 ELSE s.n + 1 END,
        updated_at = p_now;
END
$$;

-- The counters not past the history TTL, as {"<kind>|<task>": n}.
CREATE FUNCTION debounce_counters() RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT coalesce(json_object_agg(c.name, c.n), '{}')
    FROM (SELECT s.kind || '|' || s.task AS name, sum(s.n) AS n FROM debounce_stats s
          WHERE s.updated_at >= clock_timestamp() - debounce_history_ttl()
          GROUP BY s.kind, s.task) AS c
$$;

-- The lateness bucket of a window taken p_late_ms after its deadline: the index
-- (0-based) of the first of the connection's debounce.late_buckets_ms bounds it is
-- within, the number of bounds when above them all; NULL when they are not set.
CREATE FUNCTION debounce_late_bucket(p_late_ms bigint) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_bounds bigint[] := string_to_array(
        nullif(current_setting('debounce.late_buckets_ms', true), ''), ',')::bigint[];
BEGIN
    IF v_bounds IS NULL THEN
        RETURN NULL;
    END IF;
    FOR v_b IN 1 .. cardinality(v_bounds) LOOP
        IF p_late_ms <= v_bounds[v_b] THEN
            RETURN v_b - 1;
        END IF;
    END LOOP;
    RETURN cardinality(v_bounds);
END
$$;

-- The taken collect windows p_task_ids get their run's body, [[[e1,e2,...]],{},embed]
-- (their payload was the embed), and their calls leave debounce_calls. A window
-- without calls is left as it is.
CREATE FUNCTION debounce_splice(p_task_ids text[]) RETURNS void
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

-- One call: open the ident's window, or join the open one (version 1's, see
-- schema.sql, with debounce_collect). A collect call (p_budget not NULL, the call's
-- debounce_max_payload_bytes, with p_collect_embed, its protocol-2 embed JSON; p_payload
-- its JSON [args, kwargs(, id)]) adds its element to debounce_calls. One whose element
-- cannot fit an empty window is refused (DBP01, nothing written). A call the open window
-- cannot take closes it and opens the next: a collect call it does not fit (full:
-- closed as the cap closes), or a call of the other mode (a deploy turned collect on or
-- off: closed as a flush closes).
CREATE FUNCTION debounce_gate(
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
                p_options_json, p_max_calls, coalesce(p_max_calls <= 1, false), p_exclusive,
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
            SELECT 1 FROM debounce_open o WHERE o.deadline < v_row.deadline) THEN
        -- the earliest deadline now: a dispatcher sleeping until a later one wakes
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

-- Many calls in one round trip and one transaction (enqueue_many's chunk): each as
-- debounce_gate, in the order of (ident, position), so that two batches lock the
-- windows they share in the same order; a call's order among those of its ident is
-- kept. A refused call (DBA01, DBR01, DBP01) is undone alone (its subtransaction) and
-- answered with its SQLSTATE and message; the others go on. Every call the batch
-- accepted is counted at its end (i, s), in (task, kind, slot) order, as the take
-- counts: one row per call, k its 1-based position in the arrays.
CREATE FUNCTION debounce_gate_many(
    p_idents text[], p_task_ids text[], p_window_ms bigint[], p_max_wait_ms bigint[],
    p_content_types text[], p_payloads bytea[], p_options_json text[], p_replace boolean[],
    p_exclusive boolean[], p_max_calls integer[], p_aliases text[], p_fallback_ids text[],
    p_canvas boolean[], p_max_aliases integer, p_embeds text[], p_edges text[],
    p_budgets integer[], p_collect_embeds text[])
RETURNS TABLE (k integer, task_id text, opened boolean, deadline_ms bigint, calls integer,
               now_ms bigint, edge text, refused text, message text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_k integer;
    v_row record;
    v_idents text[] := '{}';
    v_suppressed boolean[] := '{}';
    v_now timestamptz;
BEGIN
    PERFORM set_config('debounce.in_batch', 'on', true);
    FOR v_k IN SELECT o.k FROM unnest(p_idents) WITH ORDINALITY AS o(ident, k)
               ORDER BY o.ident, o.k LOOP
        BEGIN
            SELECT * INTO v_row FROM debounce_gate(
                p_idents[v_k], p_task_ids[v_k], p_window_ms[v_k], p_max_wait_ms[v_k],
                p_content_types[v_k], p_payloads[v_k], p_options_json[v_k], p_replace[v_k],
                p_exclusive[v_k], p_max_calls[v_k], p_aliases[v_k], p_fallback_ids[v_k],
                p_canvas[v_k], p_max_aliases, p_embeds[v_k], p_edges[v_k], p_budgets[v_k],
                p_collect_embeds[v_k]);
            v_idents := v_idents || p_idents[v_k];
            v_suppressed := v_suppressed || (v_row.edge = 'suppressed');
            v_now := greatest(v_now, to_timestamp(v_row.now_ms / 1000.0));
            RETURN QUERY SELECT v_k, v_row.task_id, v_row.opened, v_row.deadline_ms,
                                v_row.calls, v_row.now_ms, v_row.edge, NULL::text, NULL::text;
        EXCEPTION WHEN SQLSTATE 'DBA01' OR SQLSTATE 'DBR01' OR SQLSTATE 'DBP01' THEN
            RETURN QUERY SELECT v_k, NULL::text, NULL::boolean, NULL::bigint, NULL::integer,
                                NULL::bigint, NULL::text, SQLSTATE::text, SQLERRM::text;
        END;
    END LOOP;
    PERFORM set_config('debounce.in_batch', '', true);
    IF cardinality(v_idents) > 0 THEN
        WITH counted AS (
            SELECT debounce_task_of(c.ident) AS task, k.kind, abs(hashtext(c.ident) % 16)
                   AS slot
            FROM unnest(v_idents, v_suppressed) AS c(ident, suppressed),
                 LATERAL (VALUES ('i'), ('s')) AS k(kind)
            WHERE k.kind = 'i' OR c.suppressed
        )
        INSERT INTO debounce_stats AS s (task, kind, slot, n, updated_at)
        SELECT c.task, c.kind, c.slot, count(*), v_now FROM counted c
        WHERE c.task IS NOT NULL
        GROUP BY c.task, c.kind, c.slot ORDER BY c.task, c.kind, c.slot
        ON CONFLICT (task, kind, slot) DO UPDATE SET
            n = CASE WHEN s.updated_at < v_now - debounce_history_ttl() THEN excluded.n
                     ELSE s.n + excluded.n END,
            updated_at = v_now;
    END IF;
END
$$;

-- Take up to p_batch windows for dispatch (version 1's, see schema.sql): the due
-- collect windows among them get their bodies spliced, in a statement after the one
-- that moved them (see above).
CREATE OR REPLACE FUNCTION debounce_take(p_batch integer, p_lease_ms bigint,
                                         p_lapse_upto_ms bigint)
RETURNS TABLE (task_id text, ident text, first_seen_ms bigint, deadline_ms bigint,
               max_wait_ms bigint, calls integer, content_type text, payload bytea,
               options_json text, tries integer, failures integer, capped boolean,
               held_ms bigint, is_leading boolean, now_ms bigint, next_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_until timestamptz := v_now + p_lease_ms * interval '1 millisecond';
    v_lapse timestamptz := least(v_now, to_timestamp(p_lapse_upto_ms / 1000.0));
    v_next timestamptz;
    v_took text[];
    v_new text[];
    v_collect text[];
    v_tasks text[];
    v_kinds text[];
    v_ns bigint[];
BEGIN
    WITH lapsed AS (
        SELECT t.task_id FROM debounce_taken t
        WHERE t.state = 'claimed' AND t.claim_until <= coalesce(v_lapse, v_now)
        ORDER BY t.claim_until LIMIT 100 FOR UPDATE SKIP LOCKED
    )
    UPDATE debounce_taken t
    SET state = CASE WHEN t.redelivered THEN 'dispatching'
                     WHEN t.last_delivery THEN 'queued' ELSE 'stale' END,
        until = CASE WHEN t.redelivered THEN v_now ELSE t.until END,
        -- the last delivery's claim lapsed: nothing delivers it again, the expiry
        -- sweep finishes it (REVOKED) and frees its exclusive key
        expires_at = CASE WHEN NOT t.redelivered AND t.last_delivery THEN '-infinity'
                          ELSE t.expires_at END,
        claim_until = NULL, redelivered = false, last_delivery = false
    FROM lapsed WHERE t.task_id = lapsed.task_id;

    UPDATE debounce_open o SET held_since = v_now
    WHERE o.exclusive AND o.held_since IS NULL AND o.deadline <= v_now
      AND debounce_running(o.ident);

    WITH lapsed AS (
        SELECT t.task_id FROM debounce_taken t
        WHERE t.state = 'dispatching' AND t.until <= v_now
        ORDER BY t.until LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), retaken AS (
        UPDATE debounce_taken t SET until = v_until, taken_at = v_now, tries = t.tries + 1
        FROM lapsed WHERE t.task_id = lapsed.task_id
        RETURNING t.task_id, t.tries
    ), due AS (
        SELECT o.ident FROM debounce_open o
        WHERE o.deadline <= v_now AND NOT (o.exclusive AND debounce_running(o.ident))
        ORDER BY o.deadline
        LIMIT greatest(p_batch - (SELECT count(*) FROM lapsed), 0)
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM debounce_open o USING due WHERE o.ident = due.ident
        RETURNING o.*
    ), inserted AS (
        INSERT INTO debounce_taken AS n (task_id, ident, first_seen, deadline, max_wait_ms,
                                         calls, content_type, payload, options_json,
                                         state, taken_at, until, tries, capped, is_leading,
                                         is_trailing, exclusive, held_ms, aliases)
        SELECT m.task_id, m.ident, m.first_seen, m.deadline, m.max_wait_ms, m.calls,
               m.content_type, m.payload, m.options_json, 'dispatching', v_now, v_until, 1,
               m.capped, m.is_leading, m.is_trailing, m.exclusive,
               coalesce(debounce_ms(v_now) - debounce_ms(m.held_since), 0), m.aliases
        FROM moved m
        RETURNING n.task_id
    )
    SELECT array(SELECT r.task_id FROM retaken r UNION ALL SELECT i.task_id FROM inserted i),
           -- taken for the first time: moved now, or closed (a flush, the cap) with
           -- tries 0 and taken now
           array(SELECT i.task_id FROM inserted i
                 UNION ALL SELECT r.task_id FROM retaken r WHERE r.tries = 1),
           array(SELECT m.task_id FROM moved m WHERE m.collect_budget IS NOT NULL)
    INTO v_took, v_new, v_collect;
    IF cardinality(v_collect) > 0 THEN
        PERFORM debounce_splice(v_collect);
    END IF;
    IF cardinality(v_new) > 0 THEN  -- counted once, when first taken
        SELECT array_agg(debounce_task_of(t.ident)), array_agg(k.kind), array_agg(k.n)
        INTO v_tasks, v_kinds, v_ns
        FROM debounce_taken t,
             LATERAL (VALUES
                 ('r', 1::bigint), ('c', t.calls::bigint),
                 ('m', CASE WHEN t.capped THEN 1::bigint END),
                 ('e', CASE WHEN t.is_leading THEN 1::bigint END),
                 ('f', CASE WHEN t.deadline >= t.first_seen
                                 + t.max_wait_ms * interval '1 millisecond'
                            THEN 1::bigint END),
                 ('l' || debounce_late_bucket(debounce_ms(v_now) - debounce_ms(t.deadline)),
                  1::bigint),
                 ('h', CASE WHEN t.held_ms > 0 THEN 1::bigint END),
                 ('hm', nullif(t.held_ms, 0))) AS k(kind, n)
        WHERE t.task_id = ANY (v_new) AND k.kind IS NOT NULL;
        PERFORM debounce_count(v_tasks, v_kinds, v_ns, v_now);
    END IF;

    RETURN QUERY
    SELECT k.task_id, k.ident, debounce_ms(k.first_seen), debounce_ms(k.deadline),
           k.max_wait_ms, k.calls, k.content_type, k.payload, k.options_json, k.tries,
           k.failures, k.capped, k.held_ms, k.is_leading, debounce_ms(v_now), NULL::bigint
    FROM debounce_taken k WHERE k.task_id = ANY (v_took) ORDER BY k.deadline;

    -- a held window is looked at again one lease later (a run whose end is never seen
    -- cannot hold it longer than that between looks)
    SELECT least((SELECT min(o.deadline) FROM debounce_open o WHERE o.held_since IS NULL),
                 (SELECT min(CASE WHEN debounce_running(o.ident)
                                  THEN greatest(o.deadline, v_until) ELSE o.deadline END)
                  FROM debounce_open o WHERE o.held_since IS NOT NULL),
                 (SELECT min(t.until) FROM debounce_taken t
                  WHERE t.state = 'dispatching'))
    INTO v_next;
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint,
                        NULL::integer, NULL::text, NULL::bytea, NULL::text, NULL::integer,
                        NULL::integer, NULL::boolean, NULL::bigint, NULL::boolean,
                        debounce_ms(v_now), debounce_ms(v_next);
END
$$;

-- Claim a window for its run (version 1's, see schema.sql): a duplicate delivery,
-- skipped, is counted (d).
CREATE OR REPLACE FUNCTION debounce_claim(p_task_id text, p_lease_ms bigint, p_retry boolean,
                               p_last boolean)
RETURNS TABLE (before text, now_ms bigint, run boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_state text;
    v_until timestamptz;
    v_ident text;
BEGIN
    SELECT t.state, t.claim_until, t.ident INTO v_state, v_until, v_ident FROM debounce_taken t
    WHERE t.task_id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT ''::text, debounce_ms(v_now), true;
        RETURN;
    END IF;
    IF v_state = 'finished' OR (v_state = 'claimed' AND NOT p_retry AND v_until > v_now)
    THEN
        IF v_state = 'claimed' THEN
            UPDATE debounce_taken t SET redelivered = true WHERE t.task_id = p_task_id;
        END IF;
        PERFORM debounce_count(ARRAY[debounce_task_of(v_ident)], ARRAY['d'],
                               ARRAY[1::bigint], v_now);  -- a duplicate skipped
        RETURN QUERY SELECT v_state, debounce_ms(v_now), false;
        RETURN;
    END IF;
    IF v_state IN ('dispatching', 'queued', 'stale', 'claimed') THEN
        UPDATE debounce_taken t
        SET state = 'claimed', claim_until = v_now + p_lease_ms * interval '1 millisecond',
            redelivered = false, last_delivery = p_last
        WHERE t.task_id = p_task_id;
    END IF;
    RETURN QUERY SELECT v_state, debounce_ms(v_now), true;
END
$$;

-- Drop the open window of p_ident (version 2's, see schema_2.sql): a collect window's
-- calls go with it, and it is counted (x).
CREATE OR REPLACE FUNCTION debounce_cancel(p_ident text, p_task_id text, p_token text,
                                           p_keep_ms bigint)
RETURNS SETOF debounce_cancelled
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY SELECT * FROM debounce_cancelled c WHERE c.token = p_token;
    IF FOUND THEN
        RETURN;
    END IF;
    DELETE FROM debounce_cancelled c WHERE c.until < v_now;
    RETURN QUERY
    WITH gone AS (
        DELETE FROM debounce_open o
        WHERE o.ident = p_ident AND (p_task_id = '' OR o.task_id = p_task_id)
        RETURNING o.*
    )
    INSERT INTO debounce_cancelled AS n
    SELECT p_token, g.task_id, g.ident, g.first_seen, g.deadline, g.max_wait_ms, g.calls,
           g.capped, g.aliases, v_now + p_keep_ms * interval '1 millisecond'
    FROM gone g
    RETURNING n.*;
    -- a statement of its own, as the splice (above): it sees every call of the window
    DELETE FROM debounce_calls c USING debounce_cancelled k
    WHERE k.token = p_token AND c.task_id = k.task_id;
    PERFORM debounce_count(array_agg(debounce_task_of(k.ident)), array_agg('x'::text),
                           array_agg(1::bigint), v_now)
    FROM debounce_cancelled k WHERE k.token = p_token;
END
$$;
