-- debounce_take: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

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
--
-- The due collect windows among them get their bodies spliced (debounce_splice), in a
-- statement after the one that moved them: a gate that joined a window committed
-- before the take could lock its row, but possibly after the take's statement took its
-- snapshot; the row lock reads the newest row, not the newest debounce_calls. A later
-- statement of the same function has a snapshot that holds every such call.
--
-- The windows it leases stop at p_max_bytes of bodies (NULL: no bound), the first one
-- whatever its size: the lease-lapsed 'dispatching' rows of debounce_taken
-- (octet_length(payload)), then the due rows of debounce_open (a collect window:
-- collect_bytes, the body its run gets). A take is one reply: 500 windows of 1 MB (a
-- full collect window reaches that by design) is a reply of 500 MB that no link
-- carries within the call's timeout. Each window taken for the first time is counted
-- in debounce_stats.
CREATE OR REPLACE FUNCTION debounce_take(p_batch integer, p_lease_ms bigint,
                                         p_lapse_upto_ms bigint, p_max_bytes bigint)
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
        ORDER BY t.claim_until, t.task_id COLLATE "C" LIMIT 100 FOR UPDATE SKIP LOCKED
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

    -- ties go by id (ident) in bytes, as a Redis sorted set orders them: one batch
    -- takes the same windows whichever store holds them
    WITH leased AS (
        SELECT t.task_id, t.until, octet_length(t.payload) AS bytes FROM debounce_taken t
        WHERE t.state = 'dispatching' AND t.until <= v_now
        ORDER BY t.until, t.task_id COLLATE "C" LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), lapsed AS (  -- within the byte budget, the first one whatever its size
        SELECT l.task_id, l.bytes FROM (
            SELECT l.*, sum(l.bytes) OVER (ORDER BY l.until, l.task_id COLLATE "C"
                                           ROWS UNBOUNDED PRECEDING) - l.bytes AS before
            FROM leased l) l
        WHERE p_max_bytes IS NULL OR l.before < p_max_bytes
    ), retaken AS (
        UPDATE debounce_taken t SET until = v_until, taken_at = v_now, tries = t.tries + 1
        FROM lapsed WHERE t.task_id = lapsed.task_id
        RETURNING t.task_id, t.tries
    ), candidates AS (
        -- a collect window's body is its calls spliced (collect_bytes), not its payload
        SELECT o.ident, o.deadline,
               coalesce(o.collect_bytes, octet_length(o.payload)) AS bytes
        FROM debounce_open o
        WHERE o.deadline <= v_now AND NOT (o.exclusive AND debounce_running(o.ident))
        ORDER BY o.deadline, o.ident COLLATE "C"
        LIMIT greatest(p_batch - (SELECT count(*) FROM lapsed), 0)
        FOR UPDATE SKIP LOCKED
    ), due AS (  -- within what the retaken ones left of the budget
        SELECT c.ident FROM (
            SELECT c.*, sum(c.bytes) OVER (ORDER BY c.deadline, c.ident COLLATE "C"
                                           ROWS UNBOUNDED PRECEDING) - c.bytes AS before
            FROM candidates c) c
        WHERE p_max_bytes IS NULL
           OR c.before < p_max_bytes - (SELECT coalesce(sum(l.bytes), 0) FROM lapsed l)
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

-- The signature of versions 1 to 3, kept for a dispatcher of an older package during
-- an upgrade: the take with no byte bound.
CREATE OR REPLACE FUNCTION debounce_take(p_batch integer, p_lease_ms bigint,
                                         p_lapse_upto_ms bigint)
RETURNS TABLE (task_id text, ident text, first_seen_ms bigint, deadline_ms bigint,
               max_wait_ms bigint, calls integer, content_type text, payload bytea,
               options_json text, tries integer, failures integer, capped boolean,
               held_ms bigint, is_leading boolean, now_ms bigint, next_ms bigint)
LANGUAGE sql AS $$
    SELECT * FROM debounce_take(p_batch, p_lease_ms, p_lapse_upto_ms, NULL::bigint)
$$;
