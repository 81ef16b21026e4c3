-- debounce_gate_many: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Many calls in one round trip and one transaction (enqueue_many's chunk): each as
-- debounce_gate, in the order of (ident, position), so that two batches lock the
-- windows they share in the same order; a call's order among those of its ident is
-- kept. A refused call (DBA01, DBR01, DBP01) is undone alone (its subtransaction) and
-- answered with its SQLSTATE and message; the others go on. Every call the batch
-- accepted is counted at its end (i, s), in (task, kind, slot) order, as the take
-- counts: one row per call, k its 1-based position in the arrays.
CREATE OR REPLACE FUNCTION debounce_gate_many(
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
