-- The PostgreSQL window store's schema, version 1 (celery_debounce/store/postgres).
--
-- Applied by PostgresStore.migrate() in one transaction under an advisory lock; the
-- version row is written last. Every time is the server's (clock_timestamp()), never a
-- caller's; times leave the functions as epoch milliseconds. Each function is one
-- operation of the store, called in one round trip.
--
-- debounce_open   one row per open window, keyed by its task-scoped ident
--                 ("<task name>:<key>"); debounce_open_due orders them by deadline.
--                 A join rewrites the row (calls, deadline, payload): fillfactor leaves
--                 room on the page for the new version.
-- debounce_taken  windows closed to calls: taken for dispatch ('dispatching' under a
--                 lease until acked), then 'queued', 'claimed' by a worker under a claim
--                 lease, 'stale' (that lease passed), 'finished', or 'quarantined'. A
--                 window closed at its call cap or flushed enters as 'dispatching' with
--                 a lease already over and tries 0: the next take takes it. A closed
--                 window never goes back to debounce_open: a later call opens a new one.

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
    options_json text NOT NULL,
    -- debounce_max_calls (NULL: no cap); the call that reaches it closes the window
    max_calls integer,
    capped boolean NOT NULL DEFAULT false,
    -- debounce_exclusive: due while a run of its ident is in progress, it is held
    exclusive boolean NOT NULL DEFAULT false,
    held_since timestamptz,
    -- the callers' fixed ids recorded on the window (aliases.py's JSON texts)
    aliases text[] NOT NULL DEFAULT '{}',
    -- a body that is not JSON: the opener's protocol-2 embed as JSON (a replacing join
    -- of another embed cannot take the body apart from it: refused)
    embed text,
    -- debounce_leading: a leading run (closed at its first call), or a trailing window
    -- (opened during the quiet period that follows a leading run)
    is_leading boolean NOT NULL DEFAULT false,
    is_trailing boolean NOT NULL DEFAULT false
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX debounce_open_due ON debounce_open (deadline);
-- a fixed id already in use is never reused (debounce_gate); unique, so that two calls
-- racing to open windows of two idents under one fixed id cannot both get it
CREATE UNIQUE INDEX debounce_open_task_id ON debounce_open (task_id);

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
    state text NOT NULL CHECK (state IN ('dispatching', 'queued', 'claimed', 'stale',
                                         'finished', 'quarantined')),
    taken_at timestamptz NOT NULL,
    -- 'dispatching': the lease's end (then it is taken again); otherwise when the
    -- record may leave the table: a 'finished' or 'quarantined' one past it is deleted
    -- by the record sweep (debounce_sweep); 'quarantined': never ('infinity', kept for
    -- an operator, as Redis keeps it without a TTL)
    until timestamptz NOT NULL,
    tries integer NOT NULL DEFAULT 1,
    -- publish failures counted against it (debounce_release with counted)
    failures integer NOT NULL DEFAULT 0,
    capped boolean NOT NULL DEFAULT false,
    is_leading boolean NOT NULL DEFAULT false,
    is_trailing boolean NOT NULL DEFAULT false,
    exclusive boolean NOT NULL DEFAULT false,
    held_ms bigint NOT NULL DEFAULT 0,
    aliases text[] NOT NULL DEFAULT '{}',
    -- 'claimed': the claim lease's end (renewed by the running worker)
    claim_until timestamptz,
    -- a duplicate delivery was skipped under this claim: if the claim lapses, the
    -- window is published again instead of left to the skipped delivery
    redelivered boolean NOT NULL DEFAULT false,
    -- claimed on the last delivery its quorum queue allows (debounce_claim p_last): if
    -- the claim lapses, nothing delivers the message again, so the expiry sweep
    -- finishes the window (REVOKED) instead of leaving it stale
    last_delivery boolean NOT NULL DEFAULT false,
    result_state text,
    reason text,
    -- when the window's published message expires (debounce_expiring; NULL: it has no
    -- expires, or the expiry sweep is done with it), and whether that sweep finished
    -- it as REVOKED (returned by every sweep until debounce_expired confirms)
    expires_at timestamptz,
    expired boolean NOT NULL DEFAULT false
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX debounce_taken_until ON debounce_taken (state, until);

-- The quiet period that follows a leading run (debounce_leading), per ident: the run's
-- id, the leading call's time and max wait (the period never outlasts their sum), its
-- end (moved by every edge call that finds it running) and the calls it holds. A row
-- whose quiet_end passed is a period over (the next leading call overwrites it, or the
-- record sweep deletes it).
CREATE TABLE debounce_quiet (
    ident text PRIMARY KEY,
    task_id text NOT NULL,
    first_seen timestamptz NOT NULL,
    max_wait_ms bigint NOT NULL,
    quiet_end timestamptz NOT NULL,
    calls integer NOT NULL DEFAULT 1
) WITH (fillfactor = 70);
CREATE INDEX debounce_taken_claims ON debounce_taken (claim_until)
    WHERE state = 'claimed';
CREATE INDEX debounce_taken_running ON debounce_taken (ident) WHERE exclusive;
CREATE INDEX debounce_taken_expiring ON debounce_taken (expires_at)
    WHERE expires_at IS NOT NULL;

-- Dispatchers' heartbeats (alive) and clean stops (not alive), by name, on the server's
-- clock; rows older than the history TTL go at the next heartbeat.
CREATE TABLE debounce_dispatchers (
    name text PRIMARY KEY,
    alive boolean NOT NULL,
    seen_at timestamptz NOT NULL
);

-- Shard layouts dispatchers took windows under (a changed debounce_shards), by name,
-- with when last written; rows older than the history TTL go at the next write.
CREATE TABLE debounce_layouts (
    name text PRIMARY KEY,
    written_at timestamptz NOT NULL
);

CREATE FUNCTION debounce_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $$;

-- The wake channel of this schema (dispatchers LISTEN on it): NOTIFY when a window
-- becomes the earliest due or is made due now (flush, the cap, a leading run, a held
-- window freed). One per schema, so that two apps in one database wake only their own.
CREATE FUNCTION debounce_wake_channel() RETURNS text
    LANGUAGE sql STABLE
    AS $$ SELECT left('debounce_wake:' || current_schema(), 63) $$;

-- Raise a refusal the store maps to a typed error (SQLSTATE class DB: DBA01 a fixed id
-- past the window's most aliases, DBR01 a replacing join of another content type); the
-- statement that called it is undone, so nothing is written. Typed as p_as, for use in
-- an expression of that type.
CREATE FUNCTION debounce_refuse(p_code text, p_message text, p_as anyelement)
RETURNS anyelement
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$$;

-- True while a debounce_exclusive window of p_ident is in progress (taken, published
-- or claimed, not finished): a due exclusive window of that ident is held.
CREATE FUNCTION debounce_running(p_ident text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM debounce_taken t
                   WHERE t.ident = p_ident AND t.exclusive
                     AND t.state IN ('dispatching', 'queued', 'claimed'))
$$;

-- Close the open window of p_ident (of id p_task_id unless ''): it moves to
-- debounce_taken as 'dispatching' with its lease over and tries 0, so the next take
-- takes it (tries 1); its deadline becomes p_now if later.
CREATE FUNCTION debounce_close(p_ident text, p_task_id text, p_now timestamptz)
RETURNS SETOF debounce_taken
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH moved AS (
        DELETE FROM debounce_open o
        WHERE o.ident = p_ident AND (p_task_id = '' OR o.task_id = p_task_id)
        RETURNING o.*
    )
    INSERT INTO debounce_taken AS n (task_id, ident, first_seen, deadline, max_wait_ms,
                                     calls, content_type, payload, options_json, state,
                                     taken_at, until, tries, capped, is_leading, is_trailing,
                                     exclusive, aliases)
    SELECT m.task_id, m.ident, m.first_seen, least(m.deadline, p_now), m.max_wait_ms,
           m.calls, m.content_type, m.payload, m.options_json, 'dispatching', p_now,
           p_now, 0, m.capped, m.is_leading, m.is_trailing, m.exclusive, m.aliases
    FROM moved m
    RETURNING n.*;
    IF FOUND THEN  -- due now: wake a dispatcher (sent at commit)
        PERFORM pg_notify(debounce_wake_channel(), '');
    END IF;
END
$$;

-- The body a replacing join stores: the call's arguments with the window's embed
-- (callbacks, errbacks, chain, chord: the opener's, never a joiner's). JSON: the call's
-- [args, kwargs] with the window's third element. Another content type: the call's body
-- when its embed is the window's. Otherwise refused (DBR01), as is a call of another
-- content type than the window's: a window runs with its opener's serializer.
CREATE FUNCTION debounce_replacement(
    p_task_id text, p_window_ct text, p_window_payload bytea, p_window_embed text,
    p_ct text, p_payload bytea, p_embed text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_mine json;
    v_theirs json;
BEGIN
    IF p_window_ct <> p_ct THEN
        RETURN debounce_refuse('DBR01', format(
            'window %s was opened with content type %s, this call has %s: a window runs '
            'with its opener''s serializer; call with the same serializer',
            p_task_id, p_window_ct, p_ct), NULL::bytea);
    END IF;
    IF p_ct IN ('', 'application/json') THEN
        BEGIN
            v_mine := convert_from(p_payload, 'UTF8')::json;
            v_theirs := convert_from(p_window_payload, 'UTF8')::json;
        EXCEPTION WHEN data_exception OR invalid_text_representation THEN
            v_mine := NULL;
        END;
        IF v_mine IS NULL OR json_typeof(v_mine) <> 'array'
                OR json_array_length(v_mine) < 2 THEN
            RETURN debounce_refuse('DBR01', format(
                'window %s cannot take this call''s body: not a JSON [args, kwargs, embed]',
                p_task_id), NULL::bytea);
        END IF;
        IF json_typeof(v_theirs) <> 'array' OR json_array_length(v_theirs) < 3 THEN
            RETURN p_payload;  -- no embed to keep
        END IF;
        RETURN convert_to(json_build_array(v_mine -> 0, v_mine -> 1, v_theirs -> 2)::text,
                          'UTF8');
    END IF;
    IF p_window_embed IS NULL OR p_window_embed = coalesce(p_embed, '') THEN
        RETURN p_payload;
    END IF;
    RETURN debounce_refuse('DBR01', format(
        'window %s was opened with other link/link_error/chain/chord options, and a %s '
        'body cannot take this call''s arguments apart from them; call with the opener''s '
        'options, or with serializer=''json''', p_task_id, p_ct), NULL::bytea);
END
$$;

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
CREATE FUNCTION debounce_gate(
    p_ident text, p_task_id text, p_window_ms bigint, p_max_wait_ms bigint,
    p_content_type text, p_payload bytea, p_options_json text, p_replace boolean,
    p_exclusive boolean, p_max_calls integer, p_alias text, p_fallback_id text,
    p_canvas boolean, p_max_aliases integer, p_embed text, p_edge text)
RETURNS TABLE (task_id text, opened boolean, deadline_ms bigint, calls integer,
               now_ms bigint, edge text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_id text := p_task_id;
    v_row record;
    v_quiet record;
    v_qend timestamptz;
    v_leading boolean := false;
    v_first_seen timestamptz := v_now;
    v_max_wait bigint := p_max_wait_ms;
    v_trailing boolean := false;
BEGIN
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
    IF p_alias IS NOT NULL AND (
            EXISTS (SELECT 1 FROM debounce_taken t WHERE t.task_id = p_task_id)
            OR EXISTS (SELECT 1 FROM debounce_open o
                       WHERE o.task_id = p_task_id AND o.ident <> p_ident)) THEN
        v_id := p_fallback_id;
    END IF;
    INSERT INTO debounce_open AS w (ident, task_id, first_seen, deadline, max_wait_ms,
                                    calls, content_type, payload, options_json, max_calls,
                                    capped, exclusive, aliases, embed, is_leading, is_trailing)
    VALUES (p_ident, v_id, v_first_seen,
            CASE WHEN p_max_calls <= 1 OR v_leading THEN v_now
                 WHEN v_trailing THEN v_qend
                 ELSE v_now + least(p_window_ms, p_max_wait_ms) * interval '1 millisecond'
            END,
            v_max_wait, 1, p_content_type, p_payload, p_options_json, p_max_calls,
            coalesce(p_max_calls <= 1, false), p_exclusive,
            CASE WHEN p_alias IS NOT NULL AND (p_canvas OR v_id <> p_task_id)
                 THEN ARRAY[p_alias] ELSE '{}'::text[] END, nullif(p_embed, ''), v_leading,
            v_trailing)
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
            ELSE w.aliases || p_alias END
    RETURNING w.task_id, w.xmax = 0 AS opened, w.deadline, w.calls, w.capped
    INTO v_row;
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
    RETURN QUERY SELECT v_row.task_id, v_row.opened, debounce_ms(v_row.deadline),
                        v_row.calls, debounce_ms(v_now),
                        CASE WHEN v_leading AND v_row.opened THEN 'lead' ELSE '' END;
END
$$;

-- Take up to p_batch windows for dispatch under a lease of p_lease_ms.
-- First the claims whose lease passed (up to p_lapse_upto_ms if given and earlier than
-- now): 'stale', or 'dispatching' with its lease over when a duplicate delivery was
-- skipped under it (published again below), or, claimed on the last delivery
-- (last_delivery), 'queued' and handed to the expiry sweep (expires_at -infinity). A due debounce_exclusive window whose
-- ident has a run in progress is held (held_since), not taken. Then, in one statement,
-- the lapsed leases (taken again: tries + 1) and the due open windows, earliest
-- deadline first, both FOR UPDATE SKIP LOCKED: concurrent dispatchers take disjoint
-- windows, and a window a gate is joining right now is left for the next take.
-- The taken windows come first; the last row is a header (task_id NULL) with now_ms and
-- next_ms, the earliest deadline or lease end left (NULL: nothing left).
CREATE FUNCTION debounce_take(p_batch integer, p_lease_ms bigint, p_lapse_upto_ms bigint)
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
        RETURNING n.*
    ), took AS (
        SELECT r.task_id, r.ident, r.first_seen, r.deadline, r.max_wait_ms, r.calls,
               r.content_type, r.payload, r.options_json, r.tries, r.failures, r.capped,
               r.held_ms, r.is_leading FROM retaken r
        UNION ALL
        SELECT i.task_id, i.ident, i.first_seen, i.deadline, i.max_wait_ms, i.calls,
               i.content_type, i.payload, i.options_json, i.tries, i.failures, i.capped,
               i.held_ms, i.is_leading FROM inserted i
    )
    SELECT k.task_id, k.ident, debounce_ms(k.first_seen), debounce_ms(k.deadline),
           k.max_wait_ms, k.calls, k.content_type, k.payload, k.options_json, k.tries,
           k.failures, k.capped, k.held_ms, k.is_leading, debounce_ms(v_now), NULL::bigint
    FROM took k ORDER BY k.deadline;

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

-- Not published: each (id, tries) window still leased to this dispatcher (still
-- 'dispatching' with those tries: one another dispatcher took again has more) is taken
-- again in p_delay_ms; p_counted also counts a publish failure against it. How many.
CREATE FUNCTION debounce_release(p_task_ids text[], p_tries integer[],
                                 p_counted boolean[], p_delay_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t
    SET until = v_now + p_delay_ms * interval '1 millisecond',
        failures = t.failures + CASE WHEN r.counted THEN 1 ELSE 0 END
    FROM unnest(p_task_ids, p_tries, p_counted) AS r(task_id, tries, counted)
    WHERE t.task_id = r.task_id AND t.state = 'dispatching' AND t.tries = r.tries;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- Set a taken window aside for good: 'dispatching' -> 'quarantined', kept until an
-- operator deletes it (until 'infinity': the record sweep leaves it); its aliases, or
-- no row when it was not dispatching.
CREATE FUNCTION debounce_quarantine(p_task_id text, p_reason text)
RETURNS TABLE (aliases text[])
LANGUAGE sql AS $$
    UPDATE debounce_taken t SET state = 'quarantined', reason = p_reason, until = 'infinity'
    WHERE t.task_id = p_task_id AND t.state = 'dispatching'
    RETURNING t.aliases
$$;

-- A worker is about to run the window's message. A delivery of a finished window, or
-- of one claimed under a live lease (unless p_retry: a retry of the run takes the
-- claim over), is a duplicate: run false (a claimed one is marked redelivered). A
-- 'dispatching', 'queued', 'stale' or lapsed 'claimed' window is claimed for
-- p_lease_ms, marked last_delivery when p_last (the last delivery its quorum queue
-- allows: should that claim lapse, debounce_take hands the window to the expiry
-- sweep). A record that is gone runs (state ''), as does a quarantined one.
CREATE FUNCTION debounce_claim(p_task_id text, p_lease_ms bigint, p_retry boolean,
                               p_last boolean)
RETURNS TABLE (before text, now_ms bigint, run boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_state text;
    v_until timestamptz;
BEGIN
    SELECT t.state, t.claim_until INTO v_state, v_until FROM debounce_taken t
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

-- Extend the live claims of these runs by p_lease_ms: a claim whose lease passed, or
-- that ended, is never brought back. How many were renewed.
CREATE FUNCTION debounce_renew(p_task_ids text[], p_lease_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t
    SET claim_until = v_now + p_lease_ms * interval '1 millisecond'
    WHERE t.task_id = ANY (p_task_ids) AND t.state = 'claimed' AND t.claim_until > v_now;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- End a run's claim now: the next take finds it lapsed ('stale'), and the message's
-- next delivery claims it instead of being skipped as a duplicate.
CREATE FUNCTION debounce_end_claim(p_task_id text) RETURNS integer
LANGUAGE sql AS $$
    WITH ended AS (
        UPDATE debounce_taken t SET claim_until = clock_timestamp()
        WHERE t.task_id = p_task_id AND t.state = 'claimed'
        RETURNING 1
    )
    SELECT count(*)::integer FROM ended
$$;

-- The run's message went back to the queue: 'claimed' -> 'queued' (its claim ends; an
-- exclusive key stays held, a queued window is in progress). False: not claimed.
CREATE FUNCTION debounce_put_back(p_task_id text) RETURNS boolean
LANGUAGE sql AS $$
    WITH back AS (
        UPDATE debounce_taken t SET state = 'queued', claim_until = NULL,
                                    redelivered = false
        WHERE t.task_id = p_task_id AND t.state = 'claimed'
        RETURNING 1
    )
    SELECT count(*) > 0 FROM back
$$;

-- The run ended with Celery state p_state: the window is 'finished' (idempotent), its
-- payload dropped, kept p_ttl_ms; an exclusive window held behind it is due now.
-- No row: no record was there.
CREATE FUNCTION debounce_finish(p_task_id text, p_state text, p_ttl_ms bigint)
RETURNS TABLE (aliases text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_ident text;
    v_exclusive boolean;
    v_aliases text[];
BEGIN
    UPDATE debounce_taken t
    SET state = 'finished', result_state = p_state, payload = '', options_json = '',
        claim_until = NULL, redelivered = false,
        until = v_now + p_ttl_ms * interval '1 millisecond'
    WHERE t.task_id = p_task_id
    RETURNING t.ident, t.exclusive, t.aliases INTO v_ident, v_exclusive, v_aliases;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_exclusive THEN
        UPDATE debounce_open o SET deadline = least(o.deadline, v_now)
        WHERE o.ident = v_ident AND o.held_since IS NOT NULL;
        IF FOUND THEN
            PERFORM pg_notify(debounce_wake_channel(), '');
        END IF;
    END IF;
    RETURN QUERY SELECT v_aliases;
END
$$;

-- Dispatcher p_name runs (p_alive) or stopped cleanly; rows not written for p_keep_ms
-- go. The server's time, ms.
CREATE FUNCTION debounce_heartbeat(p_name text, p_alive boolean, p_keep_ms bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO debounce_dispatchers AS d (name, alive, seen_at)
    VALUES (p_name, p_alive, v_now)
    ON CONFLICT (name) DO UPDATE SET alive = excluded.alive, seen_at = excluded.seen_at;
    DELETE FROM debounce_dispatchers d
    WHERE d.seen_at < v_now - p_keep_ms * interval '1 millisecond';
    RETURN debounce_ms(v_now);
END
$$;

-- Write the layouts p_write (now), drop those not written for p_keep_ms; a first row
-- (name NULL) with the server's time, then every layout with when it was last written.
CREATE FUNCTION debounce_layouts(p_write text[], p_keep_ms bigint)
RETURNS TABLE (now_ms bigint, name text, written_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO debounce_layouts AS l (name, written_at)
    SELECT DISTINCT w.n, v_now FROM unnest(p_write) AS w(n)
    ON CONFLICT (name) DO UPDATE SET written_at = excluded.written_at;
    DELETE FROM debounce_layouts l
    WHERE l.written_at < v_now - p_keep_ms * interval '1 millisecond';
    RETURN QUERY SELECT debounce_ms(v_now), NULL::text, NULL::bigint;
    RETURN QUERY SELECT debounce_ms(v_now), l.name, debounce_ms(l.written_at)
                 FROM debounce_layouts l ORDER BY l.name;
END
$$;

-- The messages of these windows, just published, expire in p_left_ms (from now); a
-- finished or quarantined window is left alone. How many.
CREATE FUNCTION debounce_expiring(p_task_ids text[], p_left_ms bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    UPDATE debounce_taken t SET expires_at = v_now + r.left_ms * interval '1 millisecond'
    FROM unnest(p_task_ids, p_left_ms) AS r(task_id, left_ms)
    WHERE t.task_id = r.task_id AND t.state NOT IN ('finished', 'quarantined');
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- The expiry sweep: up to p_limit windows whose message expired more than p_grace_ms
-- ago on the server's clock and on the caller's (p_caller_ms; a clock stepped ahead
-- alone revokes nothing early), FOR UPDATE SKIP LOCKED. A 'queued' one is finished as
-- REVOKED (expired; an exclusive window held behind it is due now); a 'dispatching'
-- one (published again, not yet acked) is looked at again after the grace; any other
-- (claimed: running; finished by its run) leaves the sweep. Returns the windows it
-- finished, now or before, whose outcome debounce_expired has not confirmed.
-- First, the record sweep: debounce_sweep(p_sweep) (the dispatcher's periodic call).
CREATE FUNCTION debounce_expire(p_grace_ms bigint, p_ttl_ms bigint, p_limit integer,
                                p_caller_ms bigint, p_sweep integer)
RETURNS TABLE (task_id text, aliases text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_upto timestamptz := least(v_now, coalesce(to_timestamp(p_caller_ms / 1000.0), v_now))
                          - p_grace_ms * interval '1 millisecond';
    v_row record;
BEGIN
    PERFORM debounce_sweep(p_sweep);
    FOR v_row IN
        SELECT t.task_id, t.state, t.expired, t.ident, t.exclusive, t.aliases
        FROM debounce_taken t WHERE t.expires_at <= v_upto
        ORDER BY t.expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        IF v_row.state = 'queued' THEN
            UPDATE debounce_taken t
            SET state = 'finished', result_state = 'REVOKED', expired = true, payload = '',
                options_json = '', until = v_now + p_ttl_ms * interval '1 millisecond'
            WHERE t.task_id = v_row.task_id;
            IF v_row.exclusive THEN
                UPDATE debounce_open o SET deadline = least(o.deadline, v_now)
                WHERE o.ident = v_row.ident AND o.held_since IS NOT NULL;
                IF FOUND THEN
                    PERFORM pg_notify(debounce_wake_channel(), '');
                END IF;
            END IF;
        ELSIF v_row.state = 'dispatching' THEN
            UPDATE debounce_taken t SET expires_at = v_now WHERE t.task_id = v_row.task_id;
            CONTINUE;
        ELSIF NOT (v_row.state = 'finished' AND v_row.expired) THEN
            UPDATE debounce_taken t SET expires_at = NULL WHERE t.task_id = v_row.task_id;
            CONTINUE;
        END IF;
        task_id := v_row.task_id;
        aliases := v_row.aliases;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The record sweep: up to p_limit records past their until that are 'finished' (kept
-- for their TTL after the run) or 'quarantined' (never: until 'infinity'), and up to
-- p_limit quiet periods over, are deleted, FOR UPDATE SKIP LOCKED (a row another
-- transaction holds, or a quiet period an edge call of its ident is reading, waits for
-- the next sweep). A window in progress ('dispatching', 'queued', 'claimed', 'stale')
-- and an open window are never deleted. How many rows went (p_limit or more: call
-- again).
CREATE FUNCTION debounce_sweep(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_taken integer;
    v_quiet integer := 0;
    v_ident text;
BEGIN
    WITH gone AS (
        SELECT t.task_id FROM debounce_taken t
        WHERE t.state IN ('finished', 'quarantined') AND t.until <= v_now
        LIMIT p_limit FOR UPDATE SKIP LOCKED
    )
    DELETE FROM debounce_taken t USING gone WHERE t.task_id = gone.task_id;
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    FOR v_ident IN
        SELECT q.ident FROM debounce_quiet q WHERE q.quiet_end <= v_now
        LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        -- an edge call of this ident holds the lock debounce_gate takes: left alone
        IF pg_try_advisory_xact_lock(hashtext('debounce_quiet:' || v_ident)) THEN
            DELETE FROM debounce_quiet q WHERE q.ident = v_ident AND q.quiet_end <= v_now;
            v_quiet := v_quiet + 1;
        END IF;
    END LOOP;
    RETURN v_taken + v_quiet;
END
$$;

-- The outcome of these swept windows is stored: they leave the sweep. How many.
CREATE FUNCTION debounce_expired(p_task_ids text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE debounce_taken t SET expires_at = NULL
    WHERE t.task_id = ANY (p_task_ids) AND t.expired;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

INSERT INTO debounce_schema (version) VALUES (1);
