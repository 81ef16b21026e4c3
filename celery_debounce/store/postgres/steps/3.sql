-- Schema version 2 -> 3:
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
