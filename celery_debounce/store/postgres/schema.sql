-- The PostgreSQL window store's schema, version 1 (celery_debounce/store/postgres).
--
-- Applied by PostgresStore.migrate() in one transaction under an advisory lock; the
-- version row is written last. Every time is the server's (clock_timestamp()), never a
-- caller's; times leave the functions as epoch milliseconds.
--
-- debounce_open   one row per open window, keyed by its task-scoped ident
--                 ("<task name>:<key>"); debounce_open_due orders them by deadline.
--                 A join rewrites the row (calls, deadline, payload): fillfactor leaves
--                 room on the page for the new version.
-- debounce_taken  windows taken for dispatch: 'dispatching' under a lease until acked
--                 ('queued', kept until expires_at, then swept). A taken window never
--                 goes back to debounce_open: a call after the take opens a new window.

CREATE TABLE debounce_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version integer NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE debounce_open (
    ident text PRIMARY KEY,
    task_id text NOT NULL,
    first_seen timestamptz NOT NULL,
    deadline timestamptz NOT NULL,
    max_wait_ms bigint NOT NULL CHECK (max_wait_ms >= 0),
    calls integer NOT NULL DEFAULT 1,
    content_type text NOT NULL,
    payload bytea NOT NULL,
    options_json text NOT NULL
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX debounce_open_due ON debounce_open (deadline);

CREATE TABLE debounce_taken (
    task_id text PRIMARY KEY,
    ident text NOT NULL,
    first_seen timestamptz NOT NULL,
    deadline timestamptz NOT NULL,
    max_wait_ms bigint NOT NULL,
    calls integer NOT NULL,
    content_type text NOT NULL,
    payload bytea NOT NULL,
    options_json text NOT NULL,
    state text NOT NULL CHECK (state IN ('dispatching', 'queued')),
    taken_at timestamptz NOT NULL,
    -- 'dispatching': the lease's end (then it is taken again); 'queued': when the
    -- record leaves the table (the sweep)
    until timestamptz NOT NULL,
    tries integer NOT NULL DEFAULT 1
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX debounce_taken_until ON debounce_taken (state, until);

CREATE FUNCTION debounce_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $$;

-- One call: open the ident's window, or join the open one. Atomic for racing callers on
-- one ident (INSERT ... ON CONFLICT DO UPDATE). The deadline is
-- least(now + window, first seen + max wait): never past the opener's ceiling. A join
-- counts the call and, with p_replace, replaces the payload; the opener's options stay.
-- opened: the window's id is this call's p_task_id (ids are unique per call).
CREATE FUNCTION debounce_gate(
    p_ident text, p_task_id text, p_window_ms bigint, p_max_wait_ms bigint,
    p_content_type text, p_payload bytea, p_options_json text, p_replace boolean)
RETURNS TABLE (task_id text, opened boolean, deadline_ms bigint, calls integer,
               now_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    INSERT INTO debounce_open AS w (ident, task_id, first_seen, deadline, max_wait_ms,
                                    calls, content_type, payload, options_json)
    VALUES (p_ident, p_task_id, v_now,
            v_now + least(p_window_ms, p_max_wait_ms) * interval '1 millisecond',
            p_max_wait_ms, 1, p_content_type, p_payload, p_options_json)
    ON CONFLICT (ident) DO UPDATE SET
        deadline = least(v_now + p_window_ms * interval '1 millisecond',
                         w.first_seen + w.max_wait_ms * interval '1 millisecond'),
        calls = w.calls + 1,
        content_type = CASE WHEN p_replace THEN excluded.content_type
                            ELSE w.content_type END,
        payload = CASE WHEN p_replace THEN excluded.payload ELSE w.payload END
    RETURNING w.task_id, w.task_id = p_task_id, debounce_ms(w.deadline), w.calls,
              debounce_ms(v_now);
END
$$;

-- Take up to p_batch windows for dispatch under a lease of p_lease_ms: first those whose
-- lease passed (taken again: tries + 1), then the due open windows, earliest deadline
-- first; one statement. FOR UPDATE SKIP LOCKED: concurrent dispatchers take disjoint
-- windows, and a window a gate is joining right now is left for the next take.
-- The taken windows come first; the last row is a header (task_id NULL) with now_ms and
-- next_ms, the earliest deadline or lease end left (NULL: nothing left).
CREATE FUNCTION debounce_take(p_batch integer, p_lease_ms bigint)
RETURNS TABLE (task_id text, ident text, first_seen_ms bigint, deadline_ms bigint,
               max_wait_ms bigint, calls integer, content_type text, payload bytea,
               options_json text, tries integer, now_ms bigint, next_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_until timestamptz := v_now + p_lease_ms * interval '1 millisecond';
    v_next timestamptz;
BEGIN
    RETURN QUERY
    WITH lapsed AS (
        SELECT t.task_id FROM debounce_taken t
        WHERE t.state = 'dispatching' AND t.until <= v_now
        ORDER BY t.until LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), retaken AS (
        UPDATE debounce_taken t SET until = v_until, taken_at = v_now, tries = t.tries + 1
        FROM lapsed WHERE t.task_id = lapsed.task_id
        RETURNING t.*
    ), due AS (
        SELECT o.ident FROM debounce_open o WHERE o.deadline <= v_now
        ORDER BY o.deadline
        LIMIT greatest(p_batch - (SELECT count(*) FROM lapsed), 0)
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM debounce_open o USING due WHERE o.ident = due.ident
        RETURNING o.*
    ), inserted AS (
        INSERT INTO debounce_taken AS n (task_id, ident, first_seen, deadline, max_wait_ms,
                                         calls, content_type, payload, options_json,
                                         state, taken_at, until, tries)
        SELECT m.task_id, m.ident, m.first_seen, m.deadline, m.max_wait_ms, m.calls,
               m.content_type, m.payload, m.options_json, 'dispatching', v_now, v_until, 1
        FROM moved m
        RETURNING n.*
    ), took AS (
        SELECT r.task_id, r.ident, r.first_seen, r.deadline, r.max_wait_ms, r.calls,
               r.content_type, r.payload, r.options_json, r.tries FROM retaken r
        UNION ALL
        SELECT i.task_id, i.ident, i.first_seen, i.deadline, i.max_wait_ms, i.calls,
               i.content_type, i.payload, i.options_json, i.tries FROM inserted i
    )
    SELECT k.task_id, k.ident, debounce_ms(k.first_seen), debounce_ms(k.deadline),
           k.max_wait_ms, k.calls, k.content_type, k.payload, k.options_json, k.tries,
           debounce_ms(v_now), NULL::bigint
    FROM took k ORDER BY k.deadline;

    SELECT least((SELECT min(o.deadline) FROM debounce_open o),
                 (SELECT min(t.until) FROM debounce_taken t
                  WHERE t.state = 'dispatching'))
    INTO v_next;
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint,
                        NULL::integer, NULL::text, NULL::bytea, NULL::text, NULL::integer,
                        debounce_ms(v_now), debounce_ms(v_next);
END
$$;

-- Published: these taken windows are queued, kept for p_ttl_ms (then swept). Idempotent:
-- how many were dispatching and are now queued.
CREATE FUNCTION debounce_ack(p_task_ids text[], p_ttl_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t
    SET state = 'queued', until = v_now + p_ttl_ms * interval '1 millisecond'
    WHERE t.task_id = ANY (p_task_ids) AND t.state = 'dispatching';
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

INSERT INTO debounce_schema (version) VALUES (1);
