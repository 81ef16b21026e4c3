-- The PostgreSQL window store's schema, version 1 (celery_debounce/store/postgres).
--
-- Applied by PostgresStore.migrate() in one transaction under an advisory lock, then
-- every later step, then every function (functions/, in schema.py's FUNCTIONS order)
-- with CREATE OR REPLACE; the version is written last. Every time is the server's
-- (clock_timestamp()), never a caller's; times leave the functions as epoch
-- milliseconds. Each function is one operation of the store, called in one round trip.
-- A step holds table changes only.
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

INSERT INTO debounce_schema (version) VALUES (1);
