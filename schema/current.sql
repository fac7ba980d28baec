-- awa_pool: the current schema, in one file.
--
-- This is the database that schema/migrations/*.sql build, written as it
-- stands after the last of them: each table with its final columns,
-- options and indexes, each function with its final body and settings (the
-- last CREATE OR REPLACE wins, later ALTERs are folded in). Read it to learn
-- the schema; the migrations are its history.
--
-- Applied to an empty database (psql -1 -v ON_ERROR_STOP=1 -f current.sql)
-- it gives the same catalog as `awa-pool migrate` and records every
-- migration version, so `awa-pool migrate --check` accepts it and `migrate`
-- finds nothing to do. Existing databases are upgraded by the migrations
-- only, never from this file.
--
-- Rule: a new migration must update this file in the same commit (objects,
-- and the version list at the end). tests/test_schema_current.py builds one
-- database from the migrations and one from this file and fails, naming the
-- object, when their catalogs differ.
--
-- Contents
--   1. Schema, version table, types, sequences
--   2. Tables: hot jobs, deferred jobs, terminal history (the done ring and
--      its running counts), the awa.jobs view and its inbox, queues, unique keys,
--      supervisors, task defaults, batches, cron, waiters, retired callbacks
--   3. Producer functions, INSERT INTO awa.jobs
--   4. Claim, completion and the other outcomes of an attempt
--   5. Callbacks
--   6. Leader maintenance: promotion, rescue, retention, cron
--   7. Admin and operator statistics
--   8. Privileges: batch guard, grant/revoke helpers, no PUBLIC execute
--   9. Migration versions


-- ===========================================================================
-- 1. Schema, version table, types, sequences
-- ===========================================================================

CREATE SCHEMA awa;

-- One row per applied migration (awa_pool/migrate.py creates it the same
-- way before the first one); section 9 fills it.
CREATE TABLE awa.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- A job's state decides its table (SPEC §7):
--   awa.jobs_hot       available, running            (the claim path reads only this)
--   awa.jobs_deferred  scheduled, retryable, waiting_external
--   awa.jobs_done      completed, failed, cancelled  (a ring of list partitions)
-- A job keeps its id when it moves between them.
CREATE TYPE awa.job_state AS ENUM (
    'scheduled', 'available', 'running', 'retryable', 'waiting_external',
    'completed', 'failed', 'cancelled'
);

-- Shared by the three job tables, so an id never changes with the table.
CREATE SEQUENCE awa.job_id_seq;


-- ===========================================================================
-- 2. Tables
-- ===========================================================================

-- 2.1 Hot jobs: available and running. The claim updates rows here and
-- completion deletes them, so the table churns: pages keep 15% free so a
-- claim's UPDATE can stay on its page (HOT), autovacuum runs early so dead
-- tuples on the claim path stay few, and vacuum never truncates (giving
-- empty end pages back to the operating system takes an ACCESS EXCLUSIVE
-- lock that stalls every claim; the table refills with the next burst).
--
-- Column order matters: the three job tables share it, so rows move between
-- them with INSERT ... SELECT. Only jobs_done's rows have a segment
-- (awa.apply_outcome and awa.put_job set it as a job becomes terminal).
CREATE TABLE awa.jobs_hot (
    id                  bigint      NOT NULL DEFAULT nextval('awa.job_id_seq'),
    kind                text        NOT NULL,
    queue               text        NOT NULL DEFAULT 'default',
    args                jsonb       NOT NULL DEFAULT '{}',
    state               awa.job_state NOT NULL DEFAULT 'available',
    priority            smallint    NOT NULL DEFAULT 2,
    run_at              timestamptz NOT NULL DEFAULT now(),
    created_at          timestamptz NOT NULL DEFAULT now(),
    attempt             integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL DEFAULT 25,
    lease               bigint      NOT NULL DEFAULT 0,
    timeout_s           double precision,
    tags                text[]      NOT NULL DEFAULT '{}',
    metadata            jsonb       NOT NULL DEFAULT '{}',
    unique_key          bytea,
    lane                smallint    NOT NULL DEFAULT 0,
    ordering_key        text,
    batch_id            bigint,
    supervisor_id       bigint,
    attempted_at        timestamptz,
    deadline            timestamptz,
    finalized_at        timestamptz,
    crashes             integer     NOT NULL DEFAULT 0,
    errors              jsonb,
    attempt_log         jsonb,
    wall_s              real,
    cpu_s               real,
    peak_rss            bigint,
    progress            jsonb,
    result              jsonb,
    callback_id         uuid,
    callback_timeout_at timestamptz,
    callback_result     jsonb,
    dead_lettered       boolean     NOT NULL DEFAULT false,
    -- the ring segment of a terminal job; NULL in this table and in
    -- awa.jobs_deferred (migration 0027: one row shape for the three tables)
    segment             smallint,
    retry_policy        jsonb,          -- how a failed attempt backs off (NULL: 2^n s)
    expires_at          timestamptz,    -- not started by then: cancelled as expired
    -- copied to the other two job tables by LIKE ... INCLUDING CONSTRAINTS
    CONSTRAINT jobs_kind_len CHECK (length(kind) BETWEEN 1 AND 200),
    CONSTRAINT jobs_queue_len CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT jobs_priority CHECK (priority BETWEEN 1 AND 4),
    CONSTRAINT jobs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT jobs_args_object CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT jobs_metadata_object CHECK (jsonb_typeof(metadata) = 'object'),
    -- this table's own
    CONSTRAINT jobs_hot_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_hot_state CHECK (state IN ('available', 'running'))
) WITH (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);

-- The claim index: exactly the claim query's predicate and order.
CREATE INDEX jobs_hot_claim ON awa.jobs_hot (queue, lane, priority, run_at, id)
    WHERE state = 'available';
-- Running rows by owner: rescue of dead supervisors and deadline scans.
CREATE INDEX jobs_hot_running ON awa.jobs_hot (supervisor_id)
    WHERE state = 'running';
CREATE INDEX jobs_hot_callback ON awa.jobs_hot (callback_id)
    WHERE callback_id IS NOT NULL;
-- Jobs that may expire before they start (awa.expire_jobs), and the
-- earlier attempts of retried jobs (awa.kind_stats): only rows that have
-- one are indexed, so jobs with neither cost nothing here.
CREATE INDEX jobs_hot_expiring ON awa.jobs_hot (expires_at)
    WHERE state = 'available' AND expires_at IS NOT NULL;
CREATE INDEX jobs_hot_retried ON awa.jobs_hot (kind)
    WHERE attempt_log IS NOT NULL;

-- 2.2 Deferred jobs: scheduled (run_at in the future, or held at
-- 'infinity' as a batch follow-up), retryable, waiting_external. Promotion
-- moves due rows to the hot table. No vacuum truncation, as for jobs_hot.
CREATE TABLE awa.jobs_deferred (
    LIKE awa.jobs_hot INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    CONSTRAINT jobs_deferred_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_deferred_state CHECK (state IN ('scheduled', 'retryable', 'waiting_external'))
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    vacuum_truncate = false
);
-- LIKE copied the hot table's state check and default too.
ALTER TABLE awa.jobs_deferred DROP CONSTRAINT jobs_hot_state;
ALTER TABLE awa.jobs_deferred ALTER COLUMN state SET DEFAULT 'scheduled';

-- Promotion scans due rows in time order.
CREATE INDEX jobs_deferred_due ON awa.jobs_deferred (run_at, id)
    WHERE state IN ('scheduled', 'retryable');
CREATE INDEX jobs_deferred_callback ON awa.jobs_deferred (callback_id)
    WHERE callback_id IS NOT NULL;
CREATE INDEX jobs_deferred_callback_due ON awa.jobs_deferred (callback_timeout_at)
    WHERE state = 'waiting_external';
CREATE INDEX jobs_deferred_batch ON awa.jobs_deferred (batch_id)
    WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_deferred_expiring ON awa.jobs_deferred (expires_at)
    WHERE state IN ('scheduled', 'retryable') AND expires_at IS NOT NULL;
CREATE INDEX jobs_deferred_retried ON awa.jobs_deferred (kind)
    WHERE attempt_log IS NOT NULL;

-- 2.3 Terminal history: a ring of 8 list partitions by segment. New
-- terminal rows go to segment awa.done_ring.current; retention
-- (awa.rotate_done_ring) carries the few rows still inside their retention
-- forward and TRUNCATEs the oldest segment, so history is never
-- mass-DELETEd (no dead tuples, no vacuum debt).
CREATE TABLE awa.jobs_done (
    LIKE awa.jobs_hot INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    CONSTRAINT jobs_done_state CHECK (state IN ('completed', 'failed', 'cancelled'))
) PARTITION BY LIST (segment);
ALTER TABLE awa.jobs_done ALTER COLUMN segment SET NOT NULL;
ALTER TABLE awa.jobs_done DROP CONSTRAINT jobs_hot_state;
ALTER TABLE awa.jobs_done ALTER COLUMN state SET DEFAULT 'completed';

-- Segments are written once and truncated whole: pack them full.
CREATE TABLE awa.jobs_done_0 PARTITION OF awa.jobs_done FOR VALUES IN (0)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_1 PARTITION OF awa.jobs_done FOR VALUES IN (1)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_2 PARTITION OF awa.jobs_done FOR VALUES IN (2)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_3 PARTITION OF awa.jobs_done FOR VALUES IN (3)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_4 PARTITION OF awa.jobs_done FOR VALUES IN (4)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_5 PARTITION OF awa.jobs_done FOR VALUES IN (5)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_6 PARTITION OF awa.jobs_done FOR VALUES IN (6)
    WITH (autovacuum_enabled = true, fillfactor = 100);
CREATE TABLE awa.jobs_done_7 PARTITION OF awa.jobs_done FOR VALUES IN (7)
    WITH (autovacuum_enabled = true, fillfactor = 100);

-- Lookups by id (admin, take_job), queue statistics, the dead-letter view,
-- batch fan-in and callback checks; each is created on every segment.
CREATE INDEX jobs_done_id ON awa.jobs_done (id);
CREATE INDEX jobs_done_queue ON awa.jobs_done (queue, state, finalized_at);
CREATE INDEX jobs_done_dlq ON awa.jobs_done (queue, kind) WHERE dead_lettered;
CREATE INDEX jobs_done_batch ON awa.jobs_done (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_done_callback ON awa.jobs_done (callback_id) WHERE callback_id IS NOT NULL;
-- The dashboard's kinds page (0017) and awa.kind_stats: each kind's latest runs
-- (their counts are in awa.done_kinds).
CREATE INDEX jobs_done_kind ON awa.jobs_done (kind, finalized_at);

-- The ring's position: one row, locked by the rotation that turns it.
CREATE TABLE awa.done_ring (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    current     smallint NOT NULL DEFAULT 0,
    segments    smallint NOT NULL DEFAULT 8,
    rotated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO awa.done_ring DEFAULT VALUES;

-- Running counts of terminal history, so that operator reads never count
-- it row by row: terminal jobs per ring segment, queue and state
-- (queue_stats), and those jobs and their attempts per segment, kind and
-- the minute they finished in (kind_stats, the dashboard's kinds page).
-- The triggers of section 4 keep them exact in the writer's transaction;
-- each session writes its own rows (slot = its backend pid), so completion
-- flushes never wait on each other; the rotation forgets the truncated
-- segment's rows and folds the others into slot 0.
CREATE TABLE awa.done_counts (
    segment   smallint      NOT NULL,
    slot      integer       NOT NULL,   -- the writing backend's pid; 0 = folded by the rotation
    queue     text          NOT NULL,
    state     awa.job_state NOT NULL,
    jobs      bigint        NOT NULL,
    CONSTRAINT done_counts_pkey PRIMARY KEY (segment, slot, queue, state)
) WITH (
    -- updated by every completion flush: room on the page for HOT updates
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE awa.done_kinds (
    segment   smallint      NOT NULL,
    slot      integer       NOT NULL,
    kind      text          NOT NULL,
    minute    timestamptz   NOT NULL,   -- the minute the jobs finished in
    runs      bigint        NOT NULL,   -- attempts with an outcome (kind_stats' runs)
    ok        bigint        NOT NULL,
    failures  bigint        NOT NULL,
    crashes   bigint        NOT NULL,
    timeouts  bigint        NOT NULL,
    finished  bigint        NOT NULL,   -- terminal jobs, run or not (the dashboard's kinds page)
    CONSTRAINT done_kinds_pkey PRIMARY KEY (segment, slot, kind, minute)
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);
-- The kinds page reads every kind's minutes of its window.
CREATE INDEX done_kinds_minute ON awa.done_kinds (minute);

-- Live jobs per queue and state as of one snapshot, retaken by the leader
-- (awa.take_live_census): what awa.live_counts() reads above a backlog of
-- exact_below live jobs, so that operator reads stay flat as it grows.
CREATE TABLE awa.live_census (
    queue  text   NOT NULL,
    state  text   NOT NULL,
    jobs   bigint NOT NULL,
    oldest timestamptz,         -- the oldest available job's run_at
    CONSTRAINT live_census_pkey PRIMARY KEY (queue, state)
);

CREATE TABLE awa.live_census_meta (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    counted_at  timestamptz,    -- when the census's snapshot was taken
    took_s      double precision,
    jobs        bigint,         -- its total
    exact_below bigint NOT NULL DEFAULT 100000 CHECK (exact_below >= 0)
);
INSERT INTO awa.live_census_meta DEFAULT VALUES;

-- 2.4 Every job wherever it is, for admin queries. Read-only but for
-- INSERT, which producers in any language may use (section 3, migration
-- 0028); unique_opts is write-only (reads show NULL).
CREATE VIEW awa.jobs AS
    SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_hot
    UNION ALL
    SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_deferred
    UNION ALL
    SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_done;

-- The rows of an INSERT INTO awa.jobs pass through here within the
-- statement (section 3): unlogged, and empty between statements.
CREATE UNLOGGED TABLE awa.jobs_inbox (
    id            bigint   NOT NULL DEFAULT nextval('awa.job_id_seq'),
    kind          text,
    args          jsonb,
    queue         text,
    priority      smallint,
    run_at        timestamptz,
    max_attempts  integer,
    timeout_s     double precision,
    tags          text[],
    metadata      jsonb,
    ordering_key  text,
    retry_policy  jsonb,
    expires_at    timestamptz,
    unique_opts   jsonb,
    -- how many of the columns awa_pool sets itself (id, state, attempt...) the INSERT gave
    foreign_cols  integer  NOT NULL DEFAULT 0,
    -- a unique row is placed at once, by awa.insert_job: the id it returned
    -- (an existing job's for a duplicate) and that job's state
    placed_id     bigint,
    placed_state  awa.job_state
) WITH (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
-- The statement's rows are deleted by their id range.
CREATE INDEX jobs_inbox_id ON awa.jobs_inbox (id);

-- 2.5 Queue settings shared by every supervisor and producer: pause, shards
-- (strict-FIFO lanes), dead-lettering, and the token bucket of a rate limit.
-- The claim reads (and a rate-limited claim updates) a row on every call:
-- no vacuum truncation here either.
CREATE TABLE awa.queues (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    shards      smallint NOT NULL DEFAULT 1 CHECK (shards BETWEEN 1 AND 64),
    dlq         boolean,             -- NULL: nobody set it (no dead-lettering; 0029)
    rate_per_s  double precision CHECK (rate_per_s IS NULL OR rate_per_s > 0),
    tokens      double precision NOT NULL DEFAULT 0,
    tokens_at   timestamptz NOT NULL DEFAULT now(),
    next_lane   bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- at most this many of the queue's jobs running across the fleet (0029)
    global_max  integer CHECK (global_max IS NULL OR global_max > 0)
) WITH (vacuum_truncate = false);

-- 2.6 Unique keys: one row per key, pointing at the job that holds it.
-- Whether the holder still blocks a newcomer is decided at insert time from
-- the holder's current state, so no trigger runs on the hot path.
CREATE TABLE awa.unique_keys (
    key     bytea PRIMARY KEY,
    job_id  bigint NOT NULL
);

-- 2.7 Supervisors: registration and heartbeat; rescue finds lost ones here.
CREATE TABLE awa.supervisors (
    id            bigserial PRIMARY KEY,
    hostname      text NOT NULL,
    pid           integer NOT NULL,
    version       text NOT NULL,
    queues        text[] NOT NULL DEFAULT '{}',
    workers       integer NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at    timestamptz,
    is_leader     boolean NOT NULL DEFAULT false,
    leader_pid    integer,         -- backend holding the leader lock, while leader
    stats         jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX supervisors_alive ON awa.supervisors (heartbeat_at) WHERE stopped_at IS NULL;

-- 2.8 Task defaults: the timeout each task declares (@task(timeout=...)),
-- recorded by supervisors at start. The claim falls back to it for a job
-- without its own timeout, so a job enqueued without the task registry (the
-- CLI without --app, raw SQL awa.insert_job) still gets a deadline.
-- Supervisors running different versions of a task: the last to start wins.
CREATE TABLE awa.task_defaults (
    kind       text PRIMARY KEY,
    timeout_s  double precision CHECK (timeout_s > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- 2.9 Batches (fan-in): members count `remaining` down as they finish
-- (awa.batch_members_done); the last one releases the held follow-up.
CREATE TABLE awa.batches (
    id          bigserial PRIMARY KEY,
    total       integer NOT NULL,
    remaining   integer NOT NULL,
    then_id     bigint,
    -- set by enqueue_batch once its members are in: no job can join after
    sealed      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    done_at     timestamptz
);
-- Retention forgets done batches in bounded chunks.
CREATE INDEX batches_done_at ON awa.batches (done_at) WHERE done_at IS NOT NULL;

-- 2.10 Periodic jobs: declared schedules, and one row per fired tick (the
-- idempotency guard that makes a double fire impossible even with two
-- leaders by accident).
CREATE TABLE awa.cron_jobs (
    name                text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    expression          text NOT NULL,
    timezone            text NOT NULL DEFAULT 'UTC',
    kind                text NOT NULL,
    queue               text NOT NULL DEFAULT 'default',
    args                jsonb NOT NULL DEFAULT '{}',
    priority            smallint NOT NULL DEFAULT 2,
    max_attempts        integer NOT NULL DEFAULT 25,
    tags                text[] NOT NULL DEFAULT '{}',
    metadata            jsonb NOT NULL DEFAULT '{}',
    missed_fire_policy  text NOT NULL DEFAULT 'coalesce'
                        CHECK (missed_fire_policy IN ('coalesce', 'catch_up')),
    last_fire_at        timestamptz,
    paused              boolean NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE awa.cron_fires (
    name     text NOT NULL,
    fire_at  timestamptz NOT NULL,
    job_id   bigint NOT NULL,
    PRIMARY KEY (name, fire_at)
);
-- Retention forgets old ticks in bounded chunks.
CREATE INDEX cron_fires_fire_at ON awa.cron_fires (fire_at);

-- 2.11 Sessions blocked in awa_pool.wait(): while any is listed, terminal
-- transitions send a NOTIFY on awa_done (and only then).
CREATE TABLE awa.waiters (
    pid    integer PRIMARY KEY,
    since  timestamptz NOT NULL DEFAULT now()
);

-- 2.12 Callback ids a job replaced by registering a new one (a later
-- attempt): remembered so that a late call with an old id says "already
-- used", not "unknown". The leader forgets them after 30 days.
CREATE TABLE awa.callbacks_retired (
    callback_id uuid PRIMARY KEY,
    job_id      bigint NOT NULL,
    retired_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX callbacks_retired_at ON awa.callbacks_retired (retired_at);


-- ===========================================================================
-- 3. Producer functions: the stable SQL API any language can call
-- ===========================================================================
--
-- Waking supervisors: every function that makes jobs available in
-- awa.jobs_hot sends pg_notify('awa_jobs', <queue>) itself, once per queue
-- and statement (insert_job, insert_jobs, insert_ready_jobs,
-- insert_uniform_jobs, put_job, settle_jobs, promote_due). A NOTIFY is
-- delivered at commit, so a rolled-back enqueue wakes nobody.
--
-- A priority-1 job also wakes them on awa_urgent (payload: its queue), by a
-- trigger, so that a supervisor whose children hold less urgent jobs queued
-- claims it at once and lets it overtake them (migration 0022).
CREATE FUNCTION awa.notify_urgent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('awa_urgent', NEW.queue);
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_hot_urgent AFTER INSERT ON awa.jobs_hot
    FOR EACH ROW WHEN (NEW.priority = 1 AND NEW.state = 'available')
    EXECUTE FUNCTION awa.notify_urgent();

-- The entry points a producer role may call (section 8) run as their owner
-- (SECURITY DEFINER) with search_path pinned to pg_catalog, pg_temp: every
-- name they use is schema-qualified and nothing can shadow a built-in.

-- Unique key: kind (+ queue) (+ canonical args) (+ period bucket). jsonb's
-- text form is canonical (keys sorted, whitespace fixed), so Python and raw
-- SQL producers derive identical keys.
CREATE FUNCTION awa.unique_key(
    p_kind text, p_queue text, p_args jsonb,
    by_args boolean, by_queue boolean, period_s double precision,
    at_time timestamptz DEFAULT now()
) RETURNS bytea LANGUAGE sql STABLE AS $$
    SELECT substring(sha256(convert_to(
        p_kind
        || CASE WHEN by_queue THEN E'\x1f' || p_queue ELSE '' END
        || CASE WHEN by_args THEN E'\x1e' || p_args::text ELSE '' END
        || CASE WHEN period_s IS NOT NULL AND period_s > 0
                THEN E'\x1d' || floor(extract(epoch FROM at_time) / period_s)::bigint::text
                ELSE '' END,
        'UTF8')) FROM 1 FOR 16)
$$;

-- Where a job is now, across the three tables (NULL when it no longer exists).
CREATE FUNCTION awa.job_state_of(p_id bigint) RETURNS awa.job_state
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT state FROM awa.jobs_hot WHERE id = p_id),
        (SELECT state FROM awa.jobs_deferred WHERE id = p_id),
        (SELECT state FROM awa.jobs_done WHERE id = p_id LIMIT 1))
$$;

-- Shard lane for a new job: a key pins it to one lane; without one, jobs
-- spread at random across lanes. One lane (0) when the queue is not sharded.
-- Plain SQL so the planner can inline it into bulk inserts.
CREATE FUNCTION awa.lane_of(p_shards smallint, p_ordering_key text) RETURNS smallint
LANGUAGE sql VOLATILE AS $$
    SELECT (CASE
        WHEN p_shards IS NULL OR p_shards <= 1 THEN 0
        WHEN p_ordering_key IS NOT NULL THEN abs(hashtextextended(p_ordering_key, 7)) % p_shards
        ELSE floor(random() * p_shards)
    END)::smallint
$$;

-- Take the unique key for a new job. Returns NULL when the caller may insert
-- (the key now points at p_new_id), or the id of the job that holds the key
-- in one of p_states (the caller then inserts nothing and returns that id).
-- Concurrent producers of the same key serialize on the key's row.
CREATE FUNCTION awa.take_unique_key(p_key bytea, p_new_id bigint, p_states text[])
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_holder bigint;
    v_state  awa.job_state;
BEGIN
    LOOP
        INSERT INTO awa.unique_keys (key, job_id) VALUES (p_key, p_new_id)
            ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        SELECT u.job_id INTO v_holder FROM awa.unique_keys u WHERE u.key = p_key FOR UPDATE;
        IF FOUND THEN
            v_state := awa.job_state_of(v_holder);
            IF v_state IS NOT NULL AND v_state::text = ANY (p_states) THEN
                RETURN v_holder;
            END IF;
            UPDATE awa.unique_keys SET job_id = p_new_id WHERE key = p_key;
            RETURN NULL;
        END IF;
        -- the key row vanished between the two statements: try again
    END LOOP;
END $$;

-- The states in which a key's holder blocks a newcomer (default: all but
-- failed and cancelled).
CREATE FUNCTION awa.unique_states(p_unique_opts jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_unique_opts ? 'states'
        THEN ARRAY(SELECT jsonb_array_elements_text(p_unique_opts->'states'))
        ELSE ARRAY['scheduled','available','running','retryable','waiting_external','completed']
    END
$$;

-- A job may join a batch only while the batch is open: created in this
-- transaction (another transaction's batch is invisible until it commits,
-- and sealed by then) and not yet sealed by enqueue_batch.
CREATE FUNCTION awa.require_open_batch(p_batch bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_sealed boolean;
BEGIN
    SELECT b.sealed INTO v_sealed FROM awa.batches b WHERE b.id = p_batch;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown batch %', p_batch USING ERRCODE = 'foreign_key_violation';
    ELSIF v_sealed THEN
        RAISE EXCEPTION 'batch % is sealed: no job can join it after enqueue_batch', p_batch
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- A retry policy as a producer gives it (awa_pool.RetryPolicy writes all
-- four keys): {"backoff": "exponential" | "linear" | "constant", "base": s,
-- "max_delay": s, "jitter": fraction}, every key optional. Returns it, or
-- raises one clear error naming what is wrong, so that a bad policy is
-- refused at enqueue and never reaches awa.backoff_s.
CREATE FUNCTION awa.check_retry_policy(p_policy jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_key     text;
    v_backoff text := coalesce(p_policy ->> 'backoff', 'exponential');
BEGIN
    IF p_policy IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_policy) <> 'object' THEN
        RAISE EXCEPTION 'retry_policy must be a JSON object like {"backoff": "linear", "base": 10}, not %',
            p_policy USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR v_key IN SELECT jsonb_object_keys(p_policy) LOOP
        IF v_key NOT IN ('backoff', 'base', 'max_delay', 'jitter') THEN
            RAISE EXCEPTION 'retry_policy has an unknown key "%" (it takes backoff, base, max_delay, jitter)',
                v_key USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_key <> 'backoff' AND jsonb_typeof(p_policy -> v_key) <> 'number' THEN
            RAISE EXCEPTION 'retry_policy % must be a number of seconds, not %', v_key, p_policy -> v_key
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    IF v_backoff NOT IN ('exponential', 'linear', 'constant') OR jsonb_typeof(p_policy -> 'backoff') <> 'string' THEN
        RAISE EXCEPTION 'retry_policy backoff must be "exponential", "linear" or "constant", not %',
            p_policy -> 'backoff' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_policy ->> 'base')::double precision < (CASE WHEN v_backoff = 'exponential' THEN 1 ELSE 0 END) THEN
        RAISE EXCEPTION 'retry_policy base must be % with backoff %, not %',
            CASE WHEN v_backoff = 'exponential' THEN '>= 1' ELSE '>= 0' END, v_backoff, p_policy -> 'base'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT ((p_policy ->> 'max_delay')::double precision > 0
            AND (p_policy ->> 'max_delay')::double precision <= 31622400) THEN
        RAISE EXCEPTION 'retry_policy max_delay must be over 0 and at most 31622400 seconds (366 days), not %',
            p_policy -> 'max_delay' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (p_policy ->> 'jitter')::double precision BETWEEN 0 AND 1 THEN
        RAISE EXCEPTION 'retry_policy jitter must be from 0 to 1, not %', p_policy -> 'jitter'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN p_policy;
END $$;

-- The stable producer entry point for any language:
--   SELECT awa.insert_job('send_email', '{"to": "a@b.c"}');
-- Inserts one job in the caller's transaction and returns its id.
-- unique_opts: {"by_args": bool, "by_queue": bool, "period": seconds,
-- "states": [...]}: while a job with the same key is in one of `states`, no
-- job is inserted and the existing job's id is returned.
-- hold: park the job until released (the follow-up of a batch).
-- expires_at: a job not started by then is cancelled with reason "expired"
-- (awa.expire_jobs) and never runs. retry_policy: how its failed attempts
-- back off (awa.backoff_s, checked by awa.check_retry_policy), for example
-- '{"backoff": "linear", "base": 10}'; NULL: 2^n seconds plus up to 25 %.
CREATE FUNCTION awa.insert_job(
    kind          text,
    args          jsonb DEFAULT '{}',
    queue         text DEFAULT 'default',
    priority      integer DEFAULT 2,
    run_at        timestamptz DEFAULT NULL,
    max_attempts  integer DEFAULT 25,
    timeout_s     double precision DEFAULT NULL,
    tags          text[] DEFAULT '{}',
    metadata      jsonb DEFAULT '{}',
    unique_opts   jsonb DEFAULT NULL,
    ordering_key  text DEFAULT NULL,
    batch_id      bigint DEFAULT NULL,
    hold          boolean DEFAULT false,
    expires_at    timestamptz DEFAULT NULL,
    retry_policy  jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_id      bigint := nextval('awa.job_id_seq');
    v_key     bytea;
    v_holder  bigint;
    v_run_at  timestamptz := coalesce(run_at, now());
    v_shards  smallint;
    v_lane    smallint;
    v_policy  jsonb := awa.check_retry_policy(retry_policy);
BEGIN
    IF batch_id IS NOT NULL THEN
        PERFORM awa.require_open_batch(batch_id);
    END IF;
    IF unique_opts IS NOT NULL THEN
        v_key := awa.unique_key(kind, queue, coalesce(args, '{}'),
            coalesce((unique_opts->>'by_args')::boolean, true),
            coalesce((unique_opts->>'by_queue')::boolean, false),
            (unique_opts->>'period')::double precision);
        v_holder := awa.take_unique_key(v_key, v_id, awa.unique_states(unique_opts));
        IF v_holder IS NOT NULL THEN
            RETURN v_holder;
        END IF;
    END IF;

    SELECT q.shards INTO v_shards FROM awa.queues q WHERE q.name = queue;
    v_lane := CASE WHEN v_shards > 1 THEN awa.lane_of(v_shards, ordering_key) ELSE 0 END;

    IF hold OR v_run_at > now() THEN
        INSERT INTO awa.jobs_deferred AS j (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, unique_key, lane, ordering_key, batch_id,
            retry_policy, expires_at)
        VALUES (v_id, kind, queue, coalesce(args, '{}'), 'scheduled', priority,
            CASE WHEN hold THEN 'infinity'::timestamptz ELSE v_run_at END,
            max_attempts, timeout_s, coalesce(tags, '{}'), coalesce(metadata, '{}'),
            v_key, v_lane, ordering_key, batch_id, v_policy, expires_at);
    ELSE
        INSERT INTO awa.jobs_hot AS j (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, unique_key, lane, ordering_key, batch_id,
            retry_policy, expires_at)
        VALUES (v_id, kind, queue, coalesce(args, '{}'), 'available', priority, v_run_at,
            max_attempts, timeout_s, coalesce(tags, '{}'), coalesce(metadata, '{}'),
            v_key, v_lane, ordering_key, batch_id, v_policy, expires_at);
        PERFORM pg_notify('awa_jobs', queue);  -- see "Waking supervisors" below
    END IF;
    RETURN v_id;
END $$;

-- Bulk insert: p_jobs is a JSON array of objects with insert_job's parameter
-- names as keys, plus delay_s (seconds from now) as an alternative to
-- run_at and expires_in_s (seconds from now) to expires_at; absent keys
-- take the defaults. Returns (ord, id) pairs, ord being
-- the 1-based input position. Jobs without unique options go in with two
-- set-based statements; unique jobs go through insert_job one by one.
-- p_batch_id: every job joins that (open) batch.
CREATE FUNCTION awa.insert_jobs(p_jobs jsonb, p_batch_id bigint DEFAULT NULL)
RETURNS TABLE (ord bigint, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    u record;
BEGIN
    IF p_batch_id IS NOT NULL THEN
        PERFORM awa.require_open_batch(p_batch_id);
    END IF;
    RETURN QUERY
    WITH j AS MATERIALIZED (
        SELECT x.*, nextval('awa.job_id_seq') AS new_id,
               coalesce(x.run_at, now() + make_interval(secs => x.delay_s), now()) AS eff_run_at,
               awa.lane_of(q.shards, x.ordering_key) AS new_lane,
               coalesce(x.expires_at, now() + make_interval(secs => x.expires_in_s)) AS eff_expires_at,
               CASE WHEN x.retry_policy IS NOT NULL THEN awa.check_retry_policy(x.retry_policy) END
                   AS checked_policy
          FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
                   kind text, args jsonb, queue text, priority integer,
                   run_at timestamptz, max_attempts integer, timeout_s double precision,
                   tags text[], metadata jsonb, unique_opts jsonb, ordering_key text,
                   hold boolean, delay_s double precision, expires_at timestamptz,
                   expires_in_s double precision, retry_policy jsonb))
               WITH ORDINALITY AS x(kind, args, queue, priority, run_at, max_attempts,
                   timeout_s, tags, metadata, unique_opts, ordering_key, hold,
                   delay_s, expires_at, expires_in_s, retry_policy, ord)
          LEFT JOIN awa.queues q ON q.name = coalesce(x.queue, 'default')
         WHERE x.unique_opts IS NULL
    ),
    hot AS (
        INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, lane, ordering_key, batch_id,
            retry_policy, expires_at)
        SELECT new_id, kind, coalesce(queue, 'default'), coalesce(args, '{}'), 'available',
               coalesce(priority, 2), eff_run_at, coalesce(max_attempts, 25), timeout_s,
               coalesce(tags, '{}'), coalesce(metadata, '{}'), new_lane, ordering_key, p_batch_id,
               checked_policy, eff_expires_at
          FROM j
         WHERE NOT coalesce(hold, false) AND eff_run_at <= now()
    ),
    deferred AS (
        INSERT INTO awa.jobs_deferred (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, lane, ordering_key, batch_id,
            retry_policy, expires_at)
        SELECT new_id, kind, coalesce(queue, 'default'), coalesce(args, '{}'), 'scheduled',
               coalesce(priority, 2),
               CASE WHEN coalesce(hold, false) THEN 'infinity'::timestamptz ELSE eff_run_at END,
               coalesce(max_attempts, 25), timeout_s,
               coalesce(tags, '{}'), coalesce(metadata, '{}'), new_lane, ordering_key, p_batch_id,
               checked_policy, eff_expires_at
          FROM j
         WHERE coalesce(hold, false) OR eff_run_at > now()
    ),
    -- one NOTIFY per queue that got ready jobs; joined below so that it runs
    woken AS MATERIALIZED (
        SELECT count(pg_notify('awa_jobs', w.queue)) AS n
          FROM (SELECT DISTINCT coalesce(queue, 'default') AS queue FROM j
                 WHERE NOT coalesce(hold, false) AND eff_run_at <= now()) w
    )
    SELECT j.ord, j.new_id FROM j CROSS JOIN woken;

    FOR u IN
        SELECT x.*
          FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
                   kind text, args jsonb, queue text, priority integer,
                   run_at timestamptz, max_attempts integer, timeout_s double precision,
                   tags text[], metadata jsonb, unique_opts jsonb, ordering_key text,
                   hold boolean, delay_s double precision, expires_at timestamptz,
                   expires_in_s double precision, retry_policy jsonb))
               WITH ORDINALITY AS x(kind, args, queue, priority, run_at, max_attempts,
                   timeout_s, tags, metadata, unique_opts, ordering_key, hold,
                   delay_s, expires_at, expires_in_s, retry_policy, ord)
         WHERE x.unique_opts IS NOT NULL
         ORDER BY x.ord
    LOOP
        ord := u.ord;
        id := awa.insert_job(u.kind, coalesce(u.args, '{}'), coalesce(u.queue, 'default'),
            coalesce(u.priority, 2),
            coalesce(u.run_at, now() + make_interval(secs => u.delay_s)),
            coalesce(u.max_attempts, 25), u.timeout_s,
            coalesce(u.tags, '{}'), coalesce(u.metadata, '{}'), u.unique_opts,
            u.ordering_key, p_batch_id, coalesce(u.hold, false),
            coalesce(u.expires_at, now() + make_interval(secs => u.expires_in_s)), u.retry_policy);
        RETURN NEXT;
    END LOOP;
END $$;

-- The bulk fast path: jobs that are ready now, with no unique key and no
-- hold. One INSERT in input order: ids come from the sequence as rows are
-- inserted, so sorted ascending they follow the input. Keys it does not read
-- (run_at, delay_s, hold, unique_opts) belong to awa.insert_jobs; expiry
-- and retry policy as there.
CREATE FUNCTION awa.insert_ready_jobs(p_jobs jsonb, p_batch_id bigint DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_batch_id IS NOT NULL THEN
        PERFORM awa.require_open_batch(p_batch_id);
    END IF;
    RETURN QUERY
    INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, max_attempts, timeout_s,
                              tags, metadata, lane, ordering_key, batch_id, retry_policy, expires_at)
    SELECT x.kind, coalesce(x.queue, 'default'), coalesce(x.args, '{}'), 'available',
           coalesce(x.priority, 2), coalesce(x.max_attempts, 25), x.timeout_s,
           coalesce(x.tags, '{}'), coalesce(x.metadata, '{}'),
           awa.lane_of(q.shards, x.ordering_key), x.ordering_key, p_batch_id,
           CASE WHEN x.retry_policy IS NOT NULL THEN awa.check_retry_policy(x.retry_policy) END,
           coalesce(x.expires_at, now() + make_interval(secs => x.expires_in_s))
      FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
               kind text, args jsonb, queue text, priority integer, max_attempts integer,
               timeout_s double precision, tags text[], metadata jsonb, ordering_key text,
               expires_at timestamptz, expires_in_s double precision, retry_policy jsonb))
           WITH ORDINALITY AS x(kind, args, queue, priority, max_attempts, timeout_s, tags,
                                metadata, ordering_key, expires_at, expires_in_s, retry_policy, ord)
      LEFT JOIN awa.queues q ON q.name = coalesce(x.queue, 'default')
     ORDER BY x.ord
    RETURNING id;
    PERFORM pg_notify('awa_jobs', w.queue)
       FROM (SELECT DISTINCT coalesce(x.queue, 'default') AS queue
               FROM jsonb_to_recordset(p_jobs) AS x(queue text)) w;
END $$;

-- Bulk enqueue of a uniform chunk: one kind, queue, priority, max_attempts,
-- timeout, tags and metadata for every job, ready now, the array holding
-- only the args objects (what a bulk producer sends nearly always; a traced
-- enqueue_many stamps one traceparent on all its jobs; a task's retry
-- policy and expiry are the same for all its jobs too). Parameters instead
-- of a JSON object per job spare PostgreSQL parsing the same fields a
-- thousand times per statement. Same rows, order and wake-up as
-- insert_ready_jobs.
CREATE FUNCTION awa.insert_uniform_jobs(
    p_kind text, p_queue text, p_priority integer, p_max_attempts integer,
    p_timeout_s double precision, p_args jsonb, p_batch_id bigint DEFAULT NULL,
    p_tags text[] DEFAULT '{}', p_metadata jsonb DEFAULT '{}',
    p_expires_in_s double precision DEFAULT NULL, p_retry_policy jsonb DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_shards smallint;
    v_policy jsonb := awa.check_retry_policy(p_retry_policy);
BEGIN
    IF p_batch_id IS NOT NULL THEN
        PERFORM awa.require_open_batch(p_batch_id);
    END IF;
    SELECT q.shards INTO v_shards FROM awa.queues q WHERE q.name = p_queue;
    RETURN QUERY
    INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, max_attempts, timeout_s,
                              tags, metadata, lane, batch_id, retry_policy, expires_at)
    SELECT p_kind, p_queue, a.args, 'available', p_priority, p_max_attempts, p_timeout_s,
           coalesce(p_tags, '{}'), coalesce(p_metadata, '{}'), awa.lane_of(v_shards, NULL), p_batch_id,
           v_policy, now() + make_interval(secs => p_expires_in_s)
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(args, ord)
     ORDER BY a.ord
    RETURNING id;
    PERFORM pg_notify('awa_jobs', p_queue);
END $$;


-- INSERT INTO awa.jobs (kind, args, ...) VALUES ... RETURNING id: an
-- INSTEAD rule rewrites the statement, set-based, into an INSERT into
-- awa.jobs_inbox; a unique row goes through awa.insert_job as it arrives,
-- and a statement-level trigger checks the other rows, moves them into
-- the job tables with one INSERT each (insert_jobs' defaults and lanes),
-- notifies once per queue and empties the statement's part of the inbox.
-- A row-level INSTEAD OF trigger would insert row by row: ~40 µs a row,
-- a sixth of the bulk paths' speed (migration 0028).
--
-- Validation. unique_opts as awa.insert_job reads them: by_args and by_queue booleans,
-- period a positive number of seconds, states a list of job states.
CREATE FUNCTION awa.unique_opts_problem(p_opts jsonb) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_key text;
BEGIN
    SELECT k INTO v_key FROM jsonb_object_keys(p_opts) k
     WHERE k NOT IN ('by_args', 'by_queue', 'period', 'states') LIMIT 1;
    IF FOUND THEN
        RETURN format('unique_opts has an unknown key %s (use by_args, by_queue, period, states)',
                      quote_literal(v_key));
    ELSIF jsonb_typeof(p_opts->'by_args') NOT IN ('boolean', 'null')
          OR jsonb_typeof(p_opts->'by_queue') NOT IN ('boolean', 'null') THEN
        RETURN 'unique_opts by_args and by_queue must be true or false';
    ELSIF jsonb_typeof(p_opts->'period') NOT IN ('number', 'null') OR (p_opts->>'period')::numeric <= 0 THEN
        RETURN 'unique_opts period must be a positive number of seconds';
    ELSIF p_opts ? 'states' AND (jsonb_typeof(p_opts->'states') <> 'array'
          OR jsonb_array_length(p_opts->'states') = 0
          OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_opts->'states') s
                      WHERE jsonb_typeof(s) <> 'string'
                         OR NOT s #>> '{}' = ANY (enum_range(NULL::awa.job_state)::text[]))) THEN
        RETURN 'unique_opts states must be a non-empty list of job states (scheduled, available, '
               'running, retryable, waiting_external, completed, failed, cancelled)';
    END IF;
    RETURN NULL;
END $$;

-- What is wrong with a job row, in words (NULL: nothing). One SQL
-- expression with no subquery, declared STABLE like format() and
-- array_to_string() in it, so the planner inlines it into the statement's
-- check below (IMMUTABLE, it was called row by row: 10 µs a row, not 0.3).
CREATE FUNCTION awa.job_row_problem(
    p_kind text, p_args jsonb, p_queue text, p_priority integer, p_max_attempts integer,
    p_timeout_s double precision, p_tags text[], p_metadata jsonb, p_ordering_key text,
    p_unique_opts jsonb, p_foreign_cols integer DEFAULT 0)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_foreign_cols > 0 THEN
            'only kind, args, queue, priority, run_at, max_attempts, timeout_s, tags, metadata, '
            'ordering_key, retry_policy, expires_at and unique_opts can be given: awa_pool sets the '
            'other columns itself'
        WHEN p_kind IS NULL OR p_kind = '' THEN 'kind is required (a non-empty text)'
        WHEN length(p_kind) > 200 THEN format('kind must be at most 200 characters, got %s', length(p_kind))
        WHEN p_queue = '' OR length(p_queue) > 200 THEN
            'queue must be a non-empty text of at most 200 characters'
        WHEN jsonb_typeof(p_args) <> 'object' THEN
            format('args must be a JSON object, got %s', jsonb_typeof(p_args))
        WHEN jsonb_typeof(p_metadata) <> 'object' THEN
            format('metadata must be a JSON object, got %s', jsonb_typeof(p_metadata))
        WHEN p_priority NOT BETWEEN 1 AND 4 THEN
            format('priority must be from 1 (highest) to 4 (lowest), got %s', p_priority)
        WHEN p_max_attempts NOT BETWEEN 1 AND 1000 THEN
            format('max_attempts must be from 1 to 1000, got %s', p_max_attempts)
        WHEN NOT p_timeout_s > 0 OR p_timeout_s = 'infinity' THEN
            format('timeout_s must be a positive number of seconds, got %s', p_timeout_s)
        WHEN cardinality(p_tags) > 20 THEN format('a job may have at most 20 tags, got %s', cardinality(p_tags))
        WHEN cardinality(p_tags) > 0 AND (array_position(p_tags, NULL) IS NOT NULL OR p_tags && ARRAY['']
                                          OR array_to_string(p_tags, E'\x1f') ~ E'[^\x1f]{201}') THEN
            'each tag must be a non-empty text of at most 200 characters'
        WHEN p_ordering_key = '' OR length(p_ordering_key) > 200 THEN
            'ordering_key must be a non-empty text of at most 200 characters'
        WHEN jsonb_typeof(p_unique_opts) <> 'object' THEN
            'unique_opts must be a JSON object like {"by_args": true, "period": 3600}'
        WHEN p_unique_opts IS NOT NULL THEN awa.unique_opts_problem(p_unique_opts)
    END
$$;

-- A unique row goes through awa.insert_job at once, as it arrives: its
-- answer (the new id, or the holder's) is what RETURNING must show, and
-- unique rows later in the same statement must see it.
CREATE FUNCTION awa.place_unique_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_problem text := awa.job_row_problem(NEW.kind, NEW.args, NEW.queue, NEW.priority, NEW.max_attempts,
        NEW.timeout_s, NEW.tags, NEW.metadata, NEW.ordering_key, NEW.unique_opts, NEW.foreign_cols);
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'awa.jobs: %', v_problem USING ERRCODE = 'check_violation',
            DETAIL = format('in the row of kind %s', coalesce(quote_literal(NEW.kind), 'NULL'));
    END IF;
    NEW.placed_id := awa.insert_job(NEW.kind, coalesce(NEW.args, '{}'), coalesce(NEW.queue, 'default'),
        coalesce(NEW.priority, 2), NEW.run_at, coalesce(NEW.max_attempts, 25), NEW.timeout_s,
        coalesce(NEW.tags, '{}'), coalesce(NEW.metadata, '{}'), NEW.unique_opts, NEW.ordering_key,
        NULL, false, NEW.expires_at, NEW.retry_policy);
    NEW.placed_state := awa.job_state_of(NEW.placed_id);
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_inbox_unique BEFORE INSERT ON awa.jobs_inbox
    FOR EACH ROW WHEN (NEW.unique_opts IS NOT NULL) EXECUTE FUNCTION awa.place_unique_row();

-- The rest of the statement's rows, set-based, with insert_jobs' defaults
-- and lanes: check them all (the first problem fails the statement), one
-- INSERT into each job table, one NOTIFY per queue that got ready jobs,
-- then empty the statement's part of the inbox.
CREATE FUNCTION awa.place_inserted_jobs() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_problem text;
    v_kind    text;
    v_first   bigint;
    v_last    bigint;
BEGIN
    SELECT p.problem, p.kind INTO v_problem, v_kind
      FROM (SELECT awa.job_row_problem(f.kind, f.args, f.queue, f.priority, f.max_attempts, f.timeout_s,
                       f.tags, f.metadata, f.ordering_key, f.unique_opts, f.foreign_cols) AS problem, f.kind
              FROM fresh f WHERE f.placed_id IS NULL) p
     WHERE p.problem IS NOT NULL
     LIMIT 1;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'awa.jobs: %', v_problem USING ERRCODE = 'check_violation',
            DETAIL = format('in a row of kind %s', coalesce(quote_literal(v_kind), 'NULL'));
    END IF;

    -- one pass per table over the statement's rows (they have their ids:
    -- no sort, no materialized copy)
    INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, run_at,
        max_attempts, timeout_s, tags, metadata, lane, ordering_key, retry_policy, expires_at)
    SELECT f.id, f.kind, coalesce(f.queue, 'default'), coalesce(f.args, '{}'), 'available',
           coalesce(f.priority, 2), coalesce(f.run_at, now()), coalesce(f.max_attempts, 25), f.timeout_s,
           coalesce(f.tags, '{}'), coalesce(f.metadata, '{}'), awa.lane_of(q.shards, f.ordering_key),
           f.ordering_key, CASE WHEN f.retry_policy IS NOT NULL THEN awa.check_retry_policy(f.retry_policy) END,
           f.expires_at
      FROM fresh f
      LEFT JOIN awa.queues q ON q.name = coalesce(f.queue, 'default')
     WHERE f.placed_id IS NULL AND (f.run_at IS NULL OR f.run_at <= now());
    INSERT INTO awa.jobs_deferred (id, kind, queue, args, state, priority, run_at,
        max_attempts, timeout_s, tags, metadata, lane, ordering_key, retry_policy, expires_at)
    SELECT f.id, f.kind, coalesce(f.queue, 'default'), coalesce(f.args, '{}'), 'scheduled',
           coalesce(f.priority, 2), f.run_at, coalesce(f.max_attempts, 25), f.timeout_s,
           coalesce(f.tags, '{}'), coalesce(f.metadata, '{}'), awa.lane_of(q.shards, f.ordering_key),
           f.ordering_key, CASE WHEN f.retry_policy IS NOT NULL THEN awa.check_retry_policy(f.retry_policy) END,
           f.expires_at
      FROM fresh f
      LEFT JOIN awa.queues q ON q.name = coalesce(f.queue, 'default')
     WHERE f.placed_id IS NULL AND f.run_at > now();
    PERFORM pg_notify('awa_jobs', w.queue)
       FROM (SELECT DISTINCT coalesce(f.queue, 'default') AS queue FROM fresh f
              WHERE f.placed_id IS NULL AND (f.run_at IS NULL OR f.run_at <= now())) w;

    SELECT min(f.id), max(f.id) INTO v_first, v_last FROM fresh f;
    DELETE FROM awa.jobs_inbox i WHERE i.id BETWEEN v_first AND v_last;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_inbox_place AFTER INSERT ON awa.jobs_inbox
    REFERENCING NEW TABLE AS fresh
    FOR EACH STATEMENT EXECUTE FUNCTION awa.place_inserted_jobs();

-- The rule. RETURNING gives the id (an existing job's for a unique
-- duplicate), the state the job got, and the given columns with their
-- defaults; the columns a new job does not have yet are NULL.
CREATE RULE jobs_insert AS ON INSERT TO awa.jobs DO INSTEAD
    INSERT INTO awa.jobs_inbox (kind, args, queue, priority, run_at, max_attempts, timeout_s,
                                tags, metadata, ordering_key, retry_policy, expires_at, unique_opts,
                                foreign_cols)
    VALUES (NEW.kind, NEW.args, NEW.queue, NEW.priority, NEW.run_at, NEW.max_attempts, NEW.timeout_s,
            NEW.tags, NEW.metadata, NEW.ordering_key, NEW.retry_policy, NEW.expires_at, NEW.unique_opts,
            num_nonnulls(NEW.id, NEW.state, NEW.created_at, NEW.attempt, NEW.lease, NEW.unique_key,
                         NEW.lane, NEW.batch_id, NEW.supervisor_id, NEW.attempted_at, NEW.deadline,
                         NEW.finalized_at, NEW.crashes, NEW.errors, NEW.attempt_log, NEW.wall_s,
                         NEW.cpu_s, NEW.peak_rss, NEW.progress, NEW.result, NEW.callback_id,
                         NEW.callback_timeout_at, NEW.callback_result, NEW.dead_lettered, NEW.segment))
    RETURNING coalesce(jobs_inbox.placed_id, jobs_inbox.id), jobs_inbox.kind,
        coalesce(jobs_inbox.queue, 'default'), coalesce(jobs_inbox.args, '{}'),
        coalesce(jobs_inbox.placed_state, CASE WHEN jobs_inbox.run_at > now()
            THEN 'scheduled'::awa.job_state ELSE 'available'::awa.job_state END),
        coalesce(jobs_inbox.priority, 2::smallint), coalesce(jobs_inbox.run_at, now()),
        NULL::timestamptz, NULL::integer, coalesce(jobs_inbox.max_attempts, 25), NULL::bigint,
        jobs_inbox.timeout_s, coalesce(jobs_inbox.tags, '{}'), coalesce(jobs_inbox.metadata, '{}'),
        NULL::bytea, NULL::smallint, jobs_inbox.ordering_key, NULL::bigint, NULL::bigint,
        NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::integer, NULL::jsonb,
        NULL::jsonb, NULL::real, NULL::real, NULL::bigint, NULL::jsonb, NULL::jsonb, NULL::uuid,
        NULL::timestamptz, NULL::jsonb, NULL::boolean, NULL::smallint, jobs_inbox.retry_policy,
        jobs_inbox.expires_at, jobs_inbox.unique_opts;


-- ===========================================================================
-- 4. Claim, completion and the other outcomes of an attempt
-- ===========================================================================
--
-- Every transition of a running job is guarded by (id, lease, state =
-- 'running'): a writer whose lease is stale (the job was rescued and claimed
-- again) matches no row and changes nothing.
--
-- Plans: PL/pgSQL caches a generic plan after five calls, costed for the
-- table as it was then. The hot-path functions below pin how they are
-- planned, each for a measured reason (migrations 0009-0013 tell the
-- stories):
--   claim, complete_job, complete_jobs, settle_jobs: one cached generic plan
--     (planning per call cost up to half their PostgreSQL CPU), made safe on
--     any table size by reading rows by key through arrays with sequential
--     scans off, and for the batch ones with nested loops off (a generic
--     plan costed for ten rows otherwise rescans the outcome arrays once per
--     row); JIT off, since a disabled path's penalty cost would trigger it.
--   finish_attempt, promote_due: planned afresh on every call.

-- Backoff after attempt n (1-based): 2^n s plus up to 25% jitter, capped at 24 h.
CREATE FUNCTION awa.backoff_s(attempt integer) RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT least(86400.0, power(2.0, least(greatest(attempt, 0), 30)) * (1.0 + 0.25 * random()))
$$;

-- A number from a retry policy (p_default when absent or not a number),
-- kept within [p_low, p_high].
CREATE FUNCTION awa.policy_number(p_policy jsonb, p_key text, p_default double precision,
                                  p_low double precision, p_high double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(greatest(CASE WHEN jsonb_typeof(p_policy -> p_key) = 'number'
                               THEN (p_policy ->> p_key)::double precision ELSE p_default END,
                          p_low), p_high)
$$;

-- Backoff after attempt n under a job's retry policy (NULL: the one
-- above): base^n (exponential), base * n (linear) or base (constant)
-- seconds, plus up to jitter of it at random, at most max_delay. Never
-- raises: a row settles whatever its policy holds (a value out of range is
-- clamped; awa.check_retry_policy refused such values at enqueue). One
-- expression, so the planner inlines it (0.1 us a call, not 10 us); the
-- exponent stops one past where base^n reaches max_delay, so it never
-- overflows.
CREATE FUNCTION awa.backoff_s(attempt integer, policy jsonb) RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN policy IS NULL THEN awa.backoff_s(attempt) ELSE least(
        awa.policy_number(policy, 'max_delay', 86400, 0.001, 31622400),
        (CASE coalesce(policy ->> 'backoff', 'exponential')
            WHEN 'constant' THEN awa.policy_number(policy, 'base', 2, 0, 31622400)
            WHEN 'linear' THEN awa.policy_number(policy, 'base', 2, 0, 31622400) * greatest(attempt, 1)
            ELSE power(awa.policy_number(policy, 'base', 2, 1, 31622400), least(greatest(attempt, 0),
                       floor(ln(awa.policy_number(policy, 'max_delay', 86400, 0.001, 31622400))
                             / nullif(ln(awa.policy_number(policy, 'base', 2, 1, 31622400)), 0)) + 1))
         END) * (1.0 + awa.policy_number(policy, 'jitter', 0.25, 0, 1) * random()))
    END
$$;

-- Insert one job row into the table its state belongs to (only a terminal
-- row has a ring segment).
CREATE FUNCTION awa.put_job(j awa.jobs_hot) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF j.state IN ('available', 'running') THEN
        j.segment := NULL;
        INSERT INTO awa.jobs_hot SELECT (j).*;
        IF j.state = 'available' THEN
            PERFORM pg_notify('awa_jobs', j.queue);
        END IF;
    ELSIF j.state IN ('scheduled', 'retryable', 'waiting_external') THEN
        j.segment := NULL;
        INSERT INTO awa.jobs_deferred SELECT (j).*;
    ELSE
        j.segment := (SELECT r.current FROM awa.done_ring r);
        INSERT INTO awa.jobs_done SELECT (j).*;
    END IF;
END $$;

-- Remove one job from wherever it is, returning the row (NULL if absent or
-- not in one of p_states).
CREATE FUNCTION awa.take_job(p_id bigint, p_states awa.job_state[]) RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.jobs_hot h WHERE h.id = p_id AND h.state = ANY (p_states) RETURNING h.* INTO j;
    IF FOUND THEN RETURN j; END IF;
    DELETE FROM awa.jobs_deferred d WHERE d.id = p_id AND d.state = ANY (p_states) RETURNING d.* INTO j;
    IF FOUND THEN RETURN j; END IF;
    IF p_states && ARRAY['completed', 'failed', 'cancelled']::awa.job_state[] THEN
        DELETE FROM awa.jobs_done x WHERE x.id = p_id AND x.state = ANY (p_states)
        RETURNING x.* INTO j;
        IF FOUND THEN RETURN j; END IF;
    END IF;
    RETURN NULL;
END $$;

-- Token bucket per queue, shared by every supervisor: take up to p_want
-- tokens; returns how many were granted. Burst is one second of rate.
CREATE FUNCTION awa.take_tokens(p_queue text, p_want integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    q awa.queues;
    v_avail double precision;
    v_granted integer;
BEGIN
    SELECT * INTO q FROM awa.queues WHERE name = p_queue FOR UPDATE;
    IF NOT FOUND OR q.rate_per_s IS NULL THEN
        RETURN p_want;
    END IF;
    v_avail := least(greatest(q.rate_per_s, 1.0),
                     q.tokens + q.rate_per_s * extract(epoch FROM clock_timestamp() - q.tokens_at));
    v_granted := greatest(0, least(p_want, floor(v_avail)::integer));
    UPDATE awa.queues SET tokens = v_avail - v_granted, tokens_at = clock_timestamp()
     WHERE name = p_queue;
    RETURN v_granted;
END $$;

-- Claim up to p_limit available jobs of one queue lane for a supervisor, in
-- (effective priority, run_at, id) order, from past the cursor when one is
-- given (p_after_run_at and p_after_id: per priority level 1-4, the epoch
-- run_at and id of the last job claimed at that level; NULL: from the
-- start). p_lease, when given, is the new lease of every claimed row:
-- supervisors pass a value unique to their claim (their id and a counter),
-- so even a claim lost in a server crash cannot have its lease handed out
-- again; without it the lease is bumped by one. Effective priority ages: a
-- job waiting longer than p_aging_s counts one level more urgent per
-- interval, down to 1. Each priority level is read from the claim index in
-- run_at order, so aging needs no sort of the whole backlog. Paused queues
-- yield nothing; a queue with a global_max claims at most what the fleet's
-- running jobs of the queue leave of it (counted under the queue row's lock,
-- so the fleet's claims of the queue take turns: 0029); rate-limited queues
-- then take tokens from the shared bucket. The deadline is built from the
-- job's own timeout, else its task's (awa.task_defaults), and the timeout
-- returned is read off that deadline: the supervisor enforces the value the
-- database backstops. A job past its expires_at is skipped, so it never
-- starts even before the leader's next awa.expire_jobs cancels it.
CREATE FUNCTION awa.claim(
    p_queue text, p_limit integer, p_supervisor bigint,
    p_aging_s double precision DEFAULT 60, p_lane smallint DEFAULT 0, p_lease bigint DEFAULT NULL,
    p_after_run_at double precision[] DEFAULT NULL, p_after_id bigint[] DEFAULT NULL)
RETURNS TABLE (
    id bigint, kind text, queue text, args text, priority smallint, attempt integer,
    max_attempts integer, lease bigint, timeout_s double precision, tags text[],
    metadata text, created_at double precision, run_at double precision,
    progress text, callback_result text, batch_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_paused  boolean;
    v_rate    double precision;
    v_shards  smallint;
    v_max     integer;
    v_want    integer := p_limit;
    v_got     integer;
BEGIN
    SELECT q.paused, q.rate_per_s, q.shards, q.global_max INTO v_paused, v_rate, v_shards, v_max
      FROM awa.queues q WHERE q.name = p_queue;
    IF v_paused THEN
        RETURN;
    END IF;
    IF v_shards > 1 THEN
        -- A lane is strict FIFO: its claims take turns (supervisors spread
        -- over lanes, so they rarely wait on each other).
        PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\x1f' || p_lane, 1793));
    END IF;
    IF v_max IS NOT NULL THEN
        -- Fleet-wide: the lock makes the queue's claims take turns, and the
        -- count (a statement of its own, so a snapshot taken after the lock)
        -- sees every claim before this one. A slot frees when the outcome
        -- that ends the job's running state commits, whatever the outcome.
        PERFORM 1 FROM awa.queues q WHERE q.name = p_queue FOR UPDATE;
        v_want := least(v_want, v_max - (SELECT count(*) FROM awa.jobs_hot h
                                          WHERE h.state = 'running' AND h.queue = p_queue)::integer);
        IF v_want <= 0 THEN
            RETURN;
        END IF;
    END IF;
    IF v_rate IS NOT NULL THEN
        v_want := awa.take_tokens(p_queue, v_want);
    END IF;
    IF v_want <= 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH cand AS (
        SELECT c.id, c.priority, c.run_at
          FROM generate_series(1, 4) AS lvl(p),
               LATERAL (SELECT h.id, h.priority, h.run_at
                          FROM awa.jobs_hot h
                         WHERE h.state = 'available' AND h.queue = p_queue
                           AND h.lane = p_lane AND h.priority = lvl.p
                           -- an expired job never starts (awa.expire_jobs cancels it)
                           AND (h.expires_at IS NULL OR h.expires_at > now())
                           -- past the caller's cursor at this level (none: from the start)
                           AND (h.run_at, h.id) > (coalesce(to_timestamp(p_after_run_at[lvl.p]),
                                                            TIMESTAMPTZ '-infinity'),
                                                   coalesce(p_after_id[lvl.p], 0))
                         ORDER BY h.run_at, h.id
                         LIMIT v_want
                         FOR UPDATE SKIP LOCKED) c
    ),
    picked AS (
        SELECT cand.id, row_number() OVER (
                   ORDER BY CASE WHEN p_aging_s > 0
                                 THEN greatest(1, cand.priority - floor(extract(epoch FROM now() - cand.run_at) / p_aging_s))
                                 ELSE cand.priority END,
                            cand.run_at, cand.id) AS ord
          FROM cand
         ORDER BY ord
         LIMIT v_want
    ),
    claimed AS (
        UPDATE awa.jobs_hot j
           SET state = 'running', attempt = j.attempt + 1, lease = coalesce(p_lease, j.lease + 1),
               attempted_at = clock_timestamp(), supervisor_id = p_supervisor,
               deadline = now() + make_interval(secs => coalesce(
                   j.timeout_s, (SELECT t.timeout_s FROM awa.task_defaults t WHERE t.kind = j.kind)))
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind, j.queue, j.args::text AS args, j.priority, j.attempt,
                  j.max_attempts, j.lease,
                  -- the supervisor's timeout is read off the deadline just set: one value
                  extract(epoch FROM j.deadline - now())::double precision AS timeout_s,
                  j.tags, j.metadata::text AS metadata,
                  extract(epoch FROM j.created_at)::double precision AS created_at,
                  extract(epoch FROM j.run_at)::double precision AS run_at,
                  j.progress::text AS progress, j.callback_result::text AS callback_result, j.batch_id
    )
    -- Rows come back in claim order: the UPDATE's own order is arbitrary.
    SELECT c.id, c.kind, c.queue, c.args, c.priority, c.attempt, c.max_attempts, c.lease,
           c.timeout_s, c.tags, c.metadata, c.created_at, c.run_at, c.progress,
           c.callback_result, c.batch_id
      FROM claimed c JOIN picked p ON p.id = c.id
     ORDER BY p.ord;
END $$;

-- The success path, set-based: move completed jobs from the hot table to
-- terminal history in one statement; returns the ids it applied (a stale
-- lease applies nothing). Arrays are parallel, one entry per job; p_extra
-- maps a job id (as text) to {"result": ..., "progress": ...} for the jobs
-- that have either, so the common no-result case sends only numbers. The
-- DELETE names its rows twice: by key through `h.id = ANY (p_ids)`, and
-- joined on (id, lease) with the outcome rows, which keeps each outcome
-- paired with its own lease when one id appears twice in a flush.
CREATE FUNCTION awa.complete_jobs(
    p_ids bigint[], p_leases bigint[], p_wall real[], p_cpu real[], p_rss bigint[],
    p_extra jsonb DEFAULT '{}')
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_nestloop = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_leases, p_wall, p_cpu, p_rss)
            AS o(id, lease, wall_s, cpu_s, peak_rss)
    ),
    moved AS (
        -- state::text: not the partial index of running rows (see 0003)
        DELETE FROM awa.jobs_hot h USING o
         WHERE h.id = ANY (p_ids) AND h.id = o.id AND h.lease = o.lease
           AND h.state::text = 'running'
        RETURNING h.id, h.kind, h.queue, h.args, h.priority, h.run_at, h.created_at,
                  h.attempt, h.max_attempts, h.lease, h.timeout_s, h.tags, h.metadata,
                  h.unique_key, h.lane, h.ordering_key, h.batch_id, h.supervisor_id,
                  h.attempted_at, h.crashes, h.errors, h.attempt_log,
                  o.wall_s, o.cpu_s, o.peak_rss, h.progress, h.callback_id,
                  h.callback_timeout_at, h.callback_result
    )
    INSERT INTO awa.jobs_done (
        id, kind, queue, args, state, priority, run_at, created_at, attempt,
        max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
        ordering_key, batch_id, supervisor_id, attempted_at, deadline,
        finalized_at, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
        progress, result, callback_id, callback_timeout_at, callback_result,
        dead_lettered, segment)
    SELECT m.id, kind, queue, args, 'completed', priority, run_at, created_at, attempt,
           max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
           ordering_key, batch_id, supervisor_id, attempted_at, NULL,
           now(), crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
           CASE WHEN x.e ? 'progress' THEN x.e->'progress' ELSE m.progress END,
           x.e->'result', callback_id, callback_timeout_at, callback_result,
           false, (SELECT r.current FROM awa.done_ring r)
      FROM moved m
      LEFT JOIN LATERAL (SELECT p_extra->(m.id::text) AS e) x ON true
    RETURNING jobs_done.id;
END $$;

-- The same move for one job (most flushes at low rates hold one), with a
-- generic plan that is one key lookup.
CREATE FUNCTION awa.complete_job(
    p_id bigint, p_lease bigint, p_wall real, p_cpu real, p_rss bigint,
    p_extra jsonb DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH moved AS (
        -- state::text: not the partial index of running rows (see complete_jobs)
        DELETE FROM awa.jobs_hot h
         WHERE h.id = p_id AND h.lease = p_lease AND h.state::text = 'running'
        RETURNING h.*
    )
    INSERT INTO awa.jobs_done (
        id, kind, queue, args, state, priority, run_at, created_at, attempt,
        max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
        ordering_key, batch_id, supervisor_id, attempted_at, deadline,
        finalized_at, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
        progress, result, callback_id, callback_timeout_at, callback_result,
        dead_lettered, segment)
    SELECT m.id, kind, queue, args, 'completed', priority, run_at, created_at, attempt,
           max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
           ordering_key, batch_id, supervisor_id, attempted_at, NULL,
           now(), crashes, errors, attempt_log, p_wall, p_cpu, p_rss,
           CASE WHEN p_extra ? 'progress' THEN p_extra->'progress' ELSE m.progress END,
           p_extra->'result', callback_id, callback_timeout_at, callback_result,
           false, (SELECT r.current FROM awa.done_ring r)
      FROM moved m
    RETURNING jobs_done.id;
END $$;

-- Apply one outcome to a job row taken out of its table; returns the row as
-- it must be stored next. Outcomes:
--   completed, cancel, wait, snooze, released (never started: attempt given
--   back), interrupted (stopped by a shutdown: attempt given back, logged),
--   and the failures failed, fatal (no retry can help), crash,
--   timeout, retry, lost (supervisor gone), deadline (rescued past its
--   deadline), callback_timeout.
-- A failure retries with backoff until max_attempts, then fails (dead-letter
-- when the queue has it); the backoff follows the job's retry policy unless
-- the outcome names its own delay (a handler's Retry(delay=...)). A job that
-- crashed its child p_max_crashes times fails as poison. The one place that
-- decides where a job goes next, and so the ring segment of a terminal row.
CREATE FUNCTION awa.apply_outcome(
    j awa.jobs_hot, p_outcome text, p_error text DEFAULT NULL,
    p_traceback text DEFAULT NULL, p_delay_s double precision DEFAULT NULL,
    p_result jsonb DEFAULT NULL, p_wall real DEFAULT NULL, p_cpu real DEFAULT NULL,
    p_rss bigint DEFAULT NULL, p_progress jsonb DEFAULT NULL,
    p_max_crashes integer DEFAULT 3)
RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    v_next    awa.job_state;
    v_ends    boolean := p_outcome <> 'released';
    v_failure boolean := p_outcome IN ('failed', 'fatal', 'crash', 'timeout', 'retry', 'lost',
                                       'deadline', 'callback_timeout');
    v_error   text := p_error;
BEGIN
    IF p_outcome = 'crash' THEN
        j.crashes := j.crashes + 1;
    END IF;

    IF p_outcome = 'completed' THEN
        v_next := 'completed';
        j.result := p_result;
    ELSIF p_outcome = 'cancel' THEN
        v_next := 'cancelled';
    ELSIF p_outcome = 'wait' THEN
        v_next := 'waiting_external';
    ELSIF p_outcome IN ('snooze', 'released', 'interrupted') THEN
        v_next := CASE WHEN coalesce(p_delay_s, 0) > 0 THEN 'scheduled' ELSE 'available' END;
    ELSIF p_outcome = 'fatal' THEN
        v_next := 'failed';          -- retrying cannot help (bad args, bad result)
    ELSIF p_outcome = 'crash' AND j.crashes >= p_max_crashes THEN
        v_next := 'failed';
        v_error := coalesce(v_error, 'child died') || format(
            ' (poison: the job crashed its child %s times)', j.crashes);
    ELSIF j.attempt >= j.max_attempts THEN
        v_next := 'failed';
    ELSIF p_outcome = 'lost' OR (p_outcome = 'retry' AND p_delay_s IS NOT NULL AND p_delay_s <= 0) THEN
        v_next := 'available';
    ELSE
        v_next := 'retryable';
    END IF;

    IF v_failure OR p_outcome = 'cancel' THEN
        j.errors := coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(
            jsonb_build_object('attempt', j.attempt, 'at', now(), 'kind', p_outcome,
                               'error', v_error, 'traceback', p_traceback)));
        IF jsonb_array_length(j.errors) > 50 THEN
            j.errors := j.errors - 0;
        END IF;
    END IF;

    IF v_ends THEN
        IF v_next IN ('completed', 'failed', 'cancelled') THEN
            j.wall_s := p_wall;
            j.cpu_s := p_cpu;
            j.peak_rss := p_rss;
        ELSE
            j.attempt_log := coalesce(j.attempt_log, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(
                jsonb_build_object('attempt', j.attempt, 'started_at', j.attempted_at,
                                   'finished_at', now(), 'outcome', p_outcome,
                                   'wall_seconds', p_wall, 'cpu_seconds', p_cpu,
                                   'peak_rss_bytes', p_rss)));
            IF jsonb_array_length(j.attempt_log) > 100 THEN
                j.attempt_log := j.attempt_log - 0;
            END IF;
        END IF;
    END IF;
    IF p_outcome IN ('snooze', 'released', 'interrupted') THEN
        j.attempt := greatest(j.attempt - 1, 0);   -- this attempt does not count
    END IF;

    j.progress := coalesce(p_progress, j.progress);
    j.deadline := NULL;
    IF p_outcome <> 'wait' THEN
        -- the attempt that registered a callback is over: its callback must
        -- not match a later attempt (awa.take_callback needs this mark)
        j.callback_timeout_at := NULL;
    END IF;
    j.state := v_next;
    IF v_next = 'retryable' THEN
        j.run_at := now() + make_interval(secs => coalesce(p_delay_s, awa.backoff_s(j.attempt, j.retry_policy)));
    ELSIF v_next = 'scheduled' THEN
        j.run_at := now() + make_interval(secs => p_delay_s);
    ELSIF v_next = 'available' AND p_outcome <> 'lost' THEN
        j.run_at := now();
    END IF;
    IF v_next IN ('completed', 'failed', 'cancelled') THEN
        j.finalized_at := now();
        j.segment := (SELECT r.current FROM awa.done_ring r);
        IF v_next = 'failed' THEN
            j.dead_lettered := coalesce((SELECT q.dlq FROM awa.queues q WHERE q.name = j.queue), false);
        END IF;
    ELSE
        j.segment := NULL;
    END IF;
    RETURN j;
END $$;

-- End one running attempt: take the job out of the hot table if it still
-- runs under p_lease, apply the outcome and store it where its new state
-- belongs. Returns the new state, or NULL when the lease is stale (the job
-- was rescued, cancelled or finished meanwhile): then nothing changes.
CREATE FUNCTION awa.finish_attempt(
    p_id bigint, p_lease bigint, p_outcome text, p_error text DEFAULT NULL,
    p_traceback text DEFAULT NULL, p_delay_s double precision DEFAULT NULL,
    p_result jsonb DEFAULT NULL, p_wall real DEFAULT NULL, p_cpu real DEFAULT NULL,
    p_rss bigint DEFAULT NULL, p_progress jsonb DEFAULT NULL, p_max_crashes integer DEFAULT 3)
RETURNS awa.job_state
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.jobs_hot h
     WHERE h.id = p_id AND h.lease = p_lease AND h.state = 'running'
    RETURNING h.* INTO j;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    j := awa.apply_outcome(j, p_outcome, p_error, p_traceback, p_delay_s, p_result,
                           p_wall, p_cpu, p_rss, p_progress, p_max_crashes);
    PERFORM awa.put_job(j);
    RETURN j.state;
END $$;

-- Every outcome other than plain success, a flush at a time: one DELETE
-- takes every outcome's row (joined on (id, lease), as complete_jobs),
-- apply_outcome decides each row's next state, and the rows go to their
-- tables in one INSERT per destination, so jobs_done's statement triggers
-- fire once per flush and a queue that got jobs back gets one NOTIFY.
CREATE FUNCTION awa.settle_jobs(p_outcomes jsonb, p_max_crashes integer DEFAULT 3)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_nestloop = off SET jit = off
AS $$
DECLARE
    v_ids  bigint[];
    v_rows awa.jobs_hot[];
BEGIN
    SELECT array_agg(x.id) INTO v_ids FROM jsonb_to_recordset(p_outcomes) AS x(id bigint);
    WITH o AS (
        SELECT * FROM jsonb_to_recordset(p_outcomes) AS x(
            id bigint, lease bigint, outcome text, error text, traceback text,
            delay_s double precision, result jsonb, wall_s real, cpu_s real,
            peak_rss bigint, progress jsonb)
    ),
    taken AS (
        -- state::text: not the partial index of running rows (see complete_jobs)
        DELETE FROM awa.jobs_hot h USING o
         WHERE h.id = ANY (v_ids) AND h.id = o.id AND h.lease = o.lease
           AND h.state::text = 'running'
        RETURNING awa.apply_outcome(h, o.outcome, o.error, o.traceback, o.delay_s, o.result,
                                    o.wall_s, o.cpu_s, o.peak_rss, o.progress,
                                    p_max_crashes) AS j
    )
    SELECT array_agg(t.j) INTO v_rows FROM taken t;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;

    INSERT INTO awa.jobs_deferred
    SELECT r.* FROM unnest(v_rows) r WHERE r.state IN ('scheduled', 'retryable', 'waiting_external');
    INSERT INTO awa.jobs_hot
    SELECT r.* FROM unnest(v_rows) r WHERE r.state = 'available';
    PERFORM pg_notify('awa_jobs', q.queue)
       FROM (SELECT DISTINCT r.queue FROM unnest(v_rows) r WHERE r.state = 'available') q;
    IF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.state IN ('completed', 'failed', 'cancelled')) THEN
        INSERT INTO awa.jobs_done  -- apply_outcome set each terminal row's segment
        SELECT r.* FROM unnest(v_rows) r WHERE r.state IN ('completed', 'failed', 'cancelled');
    END IF;

    RETURN QUERY SELECT r.id, r.state FROM unnest(v_rows) r;
END $$;

-- Write coalesced progress of running jobs (lease-guarded).
CREATE FUNCTION awa.write_progress(p_ids bigint[], p_leases bigint[], p_progress jsonb[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE awa.jobs_hot h SET progress = o.progress
      FROM unnest(p_ids, p_leases, p_progress) AS o(id, lease, progress)
     WHERE h.id = o.id AND h.lease = o.lease AND h.state::text = 'running';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Make held jobs (batch follow-ups) available now.
CREATE FUNCTION awa.release_held(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
    n integer := 0;
BEGIN
    FOR j IN
        DELETE FROM awa.jobs_deferred d
         WHERE d.id = ANY (p_ids) AND d.state = 'scheduled' AND d.run_at = 'infinity'
        RETURNING d.*
    LOOP
        j.state := 'available';
        j.run_at := now();
        PERFORM awa.put_job(j);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- Fan-in: count batch members down as they reach a terminal state; the
-- statement that brings a batch to zero releases its follow-up. The row lock
-- on awa.batches serializes concurrent finishers, so it fires exactly once.
CREATE FUNCTION awa.batch_members_done() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        UPDATE awa.batches b
           SET remaining = b.remaining - c.n,
               done_at = CASE WHEN b.remaining - c.n <= 0 THEN now() END
          FROM (SELECT batch_id, count(*) AS n FROM new_rows
                 WHERE batch_id IS NOT NULL GROUP BY batch_id) c
         WHERE b.id = c.batch_id AND b.remaining > 0
        RETURNING b.id, b.remaining, b.then_id
    LOOP
        IF r.remaining <= 0 AND r.then_id IS NOT NULL THEN
            PERFORM awa.release_held(ARRAY[r.then_id]);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_batches AFTER INSERT ON awa.jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.batch_members_done();

-- Tell waiters (awa_pool.wait) that jobs reached a terminal state: one
-- NOTIFY per statement, and only while someone waits. (A NOTIFY takes a
-- cluster-wide lock at commit: every completion batch taking it would queue
-- behind every producer's commit.)
CREATE FUNCTION awa.notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM awa.waiters) THEN
        PERFORM pg_notify('awa_done', '');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_notify AFTER INSERT ON awa.jobs_done
    FOR EACH STATEMENT EXECUTE FUNCTION awa.notify_done();

-- The figures of a set of job rows, as one statement over `%1$s` (a
-- relation of awa.jobs_done rows) that adds them, times %2$s (1 or -1), to
-- the counts. kind_stats' rules: a terminal job's own attempt counts when
-- it was attempted and either has figures or failed; its outcome is its
-- state, a failed job's the kind of its last error; every attempt_log entry
-- counts with its own outcome, in the minute its job finished; each job
-- counts once in `finished`. The insert trigger runs the same statement,
-- written out (a cached plan).
CREATE FUNCTION awa.done_counts_sql() RETURNS text
LANGUAGE sql IMMUTABLE AS $sql$ SELECT $q$
    WITH own AS (
        SELECT r.segment, r.queue, r.kind, r.state,
               date_trunc('minute', coalesce(r.finalized_at, now())) AS minute, count(*) AS jobs,
               count(*) FILTER (WHERE c.counted) AS runs,
               count(*) FILTER (WHERE c.counted AND c.outcome = 'completed') AS ok,
               count(*) FILTER (WHERE c.counted AND c.outcome IN ('failed', 'fatal', 'retry', 'lost',
                                                                  'deadline', 'callback_timeout')) AS failures,
               count(*) FILTER (WHERE c.counted AND c.outcome = 'crash') AS crashes,
               count(*) FILTER (WHERE c.counted AND c.outcome = 'timeout') AS timeouts
          FROM %1$s r
         CROSS JOIN LATERAL (SELECT
               r.attempted_at IS NOT NULL AND (r.wall_s IS NOT NULL OR r.state = 'failed') AS counted,
               CASE r.state WHEN 'failed' THEN coalesce(r.errors -> -1 ->> 'kind', 'failed')
                            WHEN 'cancelled' THEN 'cancel' ELSE r.state::text END AS outcome) c
         GROUP BY 1, 2, 3, 4, 5
    ),
    logged AS (
        SELECT r.segment, r.kind, date_trunc('minute', coalesce(r.finalized_at, now())) AS minute,
               count(*) AS runs,
               count(*) FILTER (WHERE e ->> 'outcome' = 'completed') AS ok,
               count(*) FILTER (WHERE e ->> 'outcome' IN ('failed', 'fatal', 'retry', 'lost',
                                                          'deadline', 'callback_timeout')) AS failures,
               count(*) FILTER (WHERE e ->> 'outcome' = 'crash') AS crashes,
               count(*) FILTER (WHERE e ->> 'outcome' = 'timeout') AS timeouts
          FROM %1$s r CROSS JOIN LATERAL jsonb_array_elements(r.attempt_log) AS e
         WHERE r.attempt_log IS NOT NULL AND jsonb_typeof(r.attempt_log) = 'array'
         GROUP BY 1, 2, 3
    ),
    jobs AS (
        INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
        SELECT segment, pg_backend_pid(), queue, state, %2$s * sum(jobs)
          FROM own
         GROUP BY segment, queue, state
        ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs
    )
    INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                     finished)
    SELECT segment, pg_backend_pid(), kind, minute, %2$s * sum(runs), %2$s * sum(ok), %2$s * sum(failures),
           %2$s * sum(crashes), %2$s * sum(timeouts), %2$s * sum(finished)
      FROM (SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, jobs AS finished FROM own
            UNION ALL
            SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, 0 FROM logged) x
     GROUP BY segment, kind, minute
    ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
       SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
           failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
           timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished
$q$ $sql$;

-- The triggers' body. Inserts (every completion flush) run one cached
-- statement (a lighter one when no row has an attempt_log); deletes and
-- updates (purges, retries, the rotation's carry)
-- are rare and run the same text dynamically. Runs as the owner, so any
-- role that may write history keeps the counts right without privileges
-- on them.
CREATE FUNCTION awa.count_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM new_rows r WHERE r.attempt_log IS NOT NULL) THEN
            WITH own AS (
                SELECT r.segment, r.queue, r.kind, r.state,
                       date_trunc('minute', coalesce(r.finalized_at, now())) AS minute, count(*) AS jobs,
                       count(*) FILTER (WHERE c.counted) AS runs,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'completed') AS ok,
                       count(*) FILTER (WHERE c.counted AND c.outcome IN ('failed', 'fatal', 'retry', 'lost',
                                                                          'deadline', 'callback_timeout')) AS failures,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'crash') AS crashes,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'timeout') AS timeouts
                  FROM new_rows r
                 CROSS JOIN LATERAL (SELECT
                       r.attempted_at IS NOT NULL AND (r.wall_s IS NOT NULL OR r.state = 'failed') AS counted,
                       CASE r.state WHEN 'failed' THEN coalesce(r.errors -> -1 ->> 'kind', 'failed')
                                    WHEN 'cancelled' THEN 'cancel' ELSE r.state::text END AS outcome) c
                 GROUP BY 1, 2, 3, 4, 5
            ),
            logged AS (
                SELECT r.segment, r.kind, date_trunc('minute', coalesce(r.finalized_at, now())) AS minute,
                       count(*) AS runs,
                       count(*) FILTER (WHERE e ->> 'outcome' = 'completed') AS ok,
                       count(*) FILTER (WHERE e ->> 'outcome' IN ('failed', 'fatal', 'retry', 'lost',
                                                                  'deadline', 'callback_timeout')) AS failures,
                       count(*) FILTER (WHERE e ->> 'outcome' = 'crash') AS crashes,
                       count(*) FILTER (WHERE e ->> 'outcome' = 'timeout') AS timeouts
                  FROM new_rows r CROSS JOIN LATERAL jsonb_array_elements(r.attempt_log) AS e
                 WHERE r.attempt_log IS NOT NULL AND jsonb_typeof(r.attempt_log) = 'array'
                 GROUP BY 1, 2, 3
            ),
            jobs AS (
                INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
                SELECT segment, pg_backend_pid(), queue, state, sum(jobs)
                  FROM own
                 GROUP BY segment, queue, state
                ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs
            )
            INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                             finished)
            SELECT segment, pg_backend_pid(), kind, minute, sum(runs), sum(ok), sum(failures),
                   sum(crashes), sum(timeouts), sum(finished)
              FROM (SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, jobs AS finished FROM own
                    UNION ALL
                    SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, 0 FROM logged) x
             GROUP BY segment, kind, minute
            ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
               SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
                   failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
                   timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished;
        ELSE
            -- No attempt_log among them (first attempts, the usual completion):
            -- the same counts without the logged part, about 0.1 ms less server
            -- CPU per flush (migration 0023). One statement with the logged part
            -- behind a flag is not enough: it cost 670-710 us per one-job
            -- completion against 580-610 us for this branch.
            WITH own AS (
                SELECT r.segment, r.queue, r.kind, r.state,
                       date_trunc('minute', coalesce(r.finalized_at, now())) AS minute, count(*) AS jobs,
                       count(*) FILTER (WHERE c.counted) AS runs,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'completed') AS ok,
                       count(*) FILTER (WHERE c.counted AND c.outcome IN ('failed', 'fatal', 'retry', 'lost',
                                                                          'deadline', 'callback_timeout')) AS failures,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'crash') AS crashes,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'timeout') AS timeouts
                  FROM new_rows r
                 CROSS JOIN LATERAL (SELECT
                       r.attempted_at IS NOT NULL AND (r.wall_s IS NOT NULL OR r.state = 'failed') AS counted,
                       CASE r.state WHEN 'failed' THEN coalesce(r.errors -> -1 ->> 'kind', 'failed')
                                    WHEN 'cancelled' THEN 'cancel' ELSE r.state::text END AS outcome) c
                 GROUP BY 1, 2, 3, 4, 5
            ),
            jobs AS (
                INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
                SELECT segment, pg_backend_pid(), queue, state, sum(jobs)
                  FROM own
                 GROUP BY segment, queue, state
                ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs
            )
            INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                             finished)
            SELECT segment, pg_backend_pid(), kind, minute, sum(runs), sum(ok), sum(failures),
                   sum(crashes), sum(timeouts), sum(jobs)
              FROM own
             GROUP BY segment, kind, minute
            ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
               SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
                   failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
                   timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished;
        END IF;
    ELSE
        EXECUTE format(awa.done_counts_sql(), 'old_rows', -1);
        IF TG_OP = 'UPDATE' THEN
            EXECUTE format(awa.done_counts_sql(), 'new_rows', 1);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_count_insert AFTER INSERT ON awa.jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_done();
CREATE TRIGGER jobs_done_count_delete AFTER DELETE ON awa.jobs_done
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_done();
CREATE TRIGGER jobs_done_count_update AFTER UPDATE ON awa.jobs_done
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_done();

-- TRUNCATE of the whole history forgets every count (the rotation's
-- TRUNCATE of one segment is handled by awa.fold_done_counts).
CREATE FUNCTION awa.forget_done_counts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM awa.done_counts;
    DELETE FROM awa.done_kinds;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_count_truncate AFTER TRUNCATE ON awa.jobs_done
    FOR EACH STATEMENT EXECUTE FUNCTION awa.forget_done_counts();

-- After a rotation TRUNCATEd segment p_truncated: forget its counts, and
-- fold every session's rows of the other segments into slot 0.
CREATE FUNCTION awa.fold_done_counts(p_truncated smallint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM awa.done_counts c WHERE c.segment = p_truncated;
    DELETE FROM awa.done_kinds k WHERE k.segment = p_truncated;
    WITH gone AS (
        DELETE FROM awa.done_counts c WHERE c.slot <> 0 RETURNING c.*
    )
    INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
    SELECT segment, 0, queue, state, sum(jobs) FROM gone GROUP BY segment, queue, state
    ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs;
    WITH gone AS (
        DELETE FROM awa.done_kinds k WHERE k.slot <> 0 RETURNING k.*
    )
    INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                     finished)
    SELECT segment, 0, kind, minute, sum(runs), sum(ok), sum(failures), sum(crashes), sum(timeouts),
           sum(finished)
      FROM gone GROUP BY segment, kind, minute
    ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
       SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
           failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
           timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished;
END $$;


-- ===========================================================================
-- 5. Callbacks (jobs waiting on an external system)
-- ===========================================================================

-- A callback id must survive a server crash once its handler has it: this
-- one transaction commits synchronously whatever the session's setting.
CREATE FUNCTION awa.register_callback(p_id bigint, p_lease bigint, p_timeout_s double precision)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_callback text;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE awa.jobs_hot
       SET callback_id = gen_random_uuid(),
           callback_timeout_at = now() + make_interval(secs => p_timeout_s)
     WHERE id = p_id AND lease = p_lease AND state = 'running'
    RETURNING callback_id::text INTO v_callback;
    RETURN v_callback;
END $$;

-- A replaced callback id goes to awa.callbacks_retired.
CREATE FUNCTION awa.retire_callback() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO awa.callbacks_retired (callback_id, job_id) VALUES (OLD.callback_id, OLD.id)
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

-- Only register_callback sets callback_id on the hot table, so this never
-- runs on the claim or completion paths.
CREATE TRIGGER jobs_hot_callback_replaced AFTER UPDATE OF callback_id ON awa.jobs_hot
    FOR EACH ROW WHEN (OLD.callback_id IS NOT NULL AND OLD.callback_id IS DISTINCT FROM NEW.callback_id)
    EXECUTE FUNCTION awa.retire_callback();

-- Find the job a callback belongs to and take it (row-locked), if the
-- callback is still live: the job waits on it (waiting_external), or the
-- attempt that registered it still runs (its handler has not returned
-- WaitForCallback yet; callback_timeout_at is cleared by every outcome but
-- a wait, and by every resolution, so an older attempt's callback never
-- matches a newer attempt). Raises a clear error for unknown ids and for
-- ids whose job has moved on.
CREATE FUNCTION awa.take_callback(p_callback uuid)
RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    FOR i IN 1..10 LOOP
        DELETE FROM awa.jobs_deferred d
         WHERE d.callback_id = p_callback AND d.state = 'waiting_external'
        RETURNING d.* INTO j;
        IF FOUND THEN RETURN j; END IF;
        DELETE FROM awa.jobs_hot h
         WHERE h.callback_id = p_callback AND h.state = 'running' AND h.callback_timeout_at IS NOT NULL
        RETURNING h.* INTO j;
        IF FOUND THEN RETURN j; END IF;
        -- The job may have parked between the two statements (running ->
        -- waiting_external): look again while a live row exists.
        EXIT WHEN NOT EXISTS (SELECT 1 FROM awa.jobs_deferred d
                               WHERE d.callback_id = p_callback AND d.state = 'waiting_external')
              AND NOT EXISTS (SELECT 1 FROM awa.jobs_hot h
                               WHERE h.callback_id = p_callback AND h.state = 'running'
                                 AND h.callback_timeout_at IS NOT NULL);
    END LOOP;
    IF EXISTS (SELECT 1 FROM awa.jobs_hot WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.jobs_deferred WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.jobs_done WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.callbacks_retired WHERE callback_id = p_callback) THEN
        RAISE EXCEPTION 'callback % was already used (its job has moved on)', p_callback
            USING ERRCODE = 'P0002', HINT = 'awa:used_callback';
    END IF;
    RAISE EXCEPTION 'unknown callback id %', p_callback
        USING ERRCODE = 'P0002', HINT = 'awa:unknown_callback';
END $$;

-- Resolve a callback. p_action: complete (payload becomes the result), fail
-- (a failed attempt: retried with backoff while attempts remain), retry
-- (run the handler again now, as a new attempt), resume (run the handler
-- again with ctx.callback_result = payload; the attempt is not counted).
-- A callback resolved before its handler returned WaitForCallback applies
-- the same way; the handler's own outcome then matches no row (the lease
-- guard wants a running row) and is dropped.
CREATE FUNCTION awa.resolve_callback(p_callback uuid, p_action text, p_payload jsonb DEFAULT NULL,
                                     p_error text DEFAULT NULL)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    IF p_action NOT IN ('complete', 'fail', 'retry', 'resume') THEN
        RAISE EXCEPTION 'unknown callback action %', p_action;
    END IF;
    j := awa.take_callback(p_callback);
    IF p_action = 'complete' THEN
        j := awa.apply_outcome(j, 'completed', p_result => p_payload);
    ELSIF p_action = 'fail' THEN
        j := awa.apply_outcome(j, 'failed', coalesce(p_error, 'failed by an external system'));
    ELSE
        j.state := 'available';
        j.run_at := now();
        j.deadline := NULL;
        IF p_action = 'resume' THEN
            j.callback_result := p_payload;
            j.attempt := greatest(j.attempt - 1, 0);  -- the resumed run continues this attempt
        ELSE
            j.callback_result := NULL;
        END IF;
    END IF;
    j.callback_timeout_at := NULL;
    PERFORM awa.put_job(j);
    job_id := j.id;
    new_state := j.state;
    RETURN NEXT;
END $$;

-- Leader: callbacks past their timeout count as failed attempts (and
-- retired callback ids older than 30 days are forgotten).
CREATE FUNCTION awa.expire_callbacks(p_limit integer DEFAULT 500)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.callbacks_retired c
     WHERE c.callback_id IN (SELECT x.callback_id FROM awa.callbacks_retired x
                              WHERE x.retired_at < now() - interval '30 days'
                              LIMIT p_limit);
    FOR r IN
        SELECT d.id FROM awa.jobs_deferred d
         WHERE d.state = 'waiting_external' AND d.callback_timeout_at < now()
         ORDER BY d.callback_timeout_at
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    LOOP
        DELETE FROM awa.jobs_deferred d WHERE d.id = r.id AND d.state = 'waiting_external'
        RETURNING d.* INTO j;
        CONTINUE WHEN NOT FOUND;
        j := awa.apply_outcome(j, 'callback_timeout', 'callback timed out');
        j.callback_timeout_at := NULL;
        PERFORM awa.put_job(j);
        job_id := j.id;
        new_state := j.state;
        RETURN NEXT;
    END LOOP;
END $$;

-- Leader: jobs whose expires_at passed before they started (available,
-- scheduled or waiting for a retry) are cancelled with reason "expired".
-- They never run meanwhile: awa.claim skips them. At most p_limit of each
-- table per call; returns how many of each queue and kind it cancelled.
CREATE FUNCTION awa.expire_jobs(p_limit integer DEFAULT 1000)
RETURNS TABLE (queue text, kind text, jobs bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_rows awa.jobs_hot[];
BEGIN
    WITH hot AS (
        DELETE FROM awa.jobs_hot h
         WHERE h.id = ANY (ARRAY(SELECT x.id FROM awa.jobs_hot x
                                  WHERE x.state = 'available' AND x.expires_at <= now()
                                  ORDER BY x.expires_at LIMIT p_limit
                                  FOR UPDATE SKIP LOCKED))
           AND h.state = 'available'
        RETURNING awa.apply_outcome(h, 'cancel', 'expired') AS j
    ),
    deferred AS (
        DELETE FROM awa.jobs_deferred d
         WHERE d.id = ANY (ARRAY(SELECT x.id FROM awa.jobs_deferred x
                                  WHERE x.state IN ('scheduled', 'retryable') AND x.expires_at <= now()
                                  ORDER BY x.expires_at LIMIT p_limit
                                  FOR UPDATE SKIP LOCKED))
           AND d.state IN ('scheduled', 'retryable')
        RETURNING awa.apply_outcome(ROW(d.*)::awa.jobs_hot, 'cancel', 'expired') AS j
    )
    SELECT array_agg(t.j) INTO v_rows
      FROM (SELECT hot.j FROM hot UNION ALL SELECT deferred.j FROM deferred) t;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO awa.jobs_done SELECT r.* FROM unnest(v_rows) r;
    RETURN QUERY SELECT r.queue, r.kind, count(*) FROM unnest(v_rows) r GROUP BY 1, 2 ORDER BY 1, 2;
END $$;


-- ===========================================================================
-- 6. Leader maintenance: promotion, rescue, retention, cron
-- ===========================================================================

-- Move due scheduled/retryable jobs to the hot table and wake the
-- supervisors of their queues. Bounded per call.
CREATE FUNCTION awa.promote_due(p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    n integer;
    v_queues text[];
BEGIN
    WITH due AS (
        SELECT d.id FROM awa.jobs_deferred d
         WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
         ORDER BY d.run_at, d.id
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        DELETE FROM awa.jobs_deferred d
         WHERE d.id = ANY (ARRAY(SELECT due.id FROM due)) RETURNING d.*
    ),
    promoted AS (
        INSERT INTO awa.jobs_hot (
            id, kind, queue, args, state, priority, run_at, created_at, attempt,
            max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
            ordering_key, batch_id, supervisor_id, attempted_at, deadline,
            finalized_at, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
            progress, result, callback_id, callback_timeout_at, callback_result,
            dead_lettered, retry_policy, expires_at)
        SELECT id, kind, queue, args, 'available', priority, run_at, created_at, attempt,
               max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
               ordering_key, batch_id, supervisor_id, attempted_at, NULL,
               NULL, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
               progress, result, callback_id, callback_timeout_at, callback_result,
               dead_lettered, retry_policy, expires_at
          FROM moved
        RETURNING queue
    )
    SELECT count(*), array_agg(DISTINCT queue) INTO n, v_queues FROM promoted;
    PERFORM pg_notify('awa_jobs', q) FROM unnest(v_queues) q;  -- wake their supervisors
    RETURN n;
END $$;

-- Running jobs whose supervisor stopped heartbeating (or stopped without
-- settling them) go back to available (or fail when out of attempts). The
-- lease is untouched: the next claim bumps it, so the old owner's late
-- writes match nothing. Staleness counts from the server's start at the
-- latest: after a restart no supervisor could heartbeat while the server
-- was down (migration 0026). The leader spares its own supervisor
-- (p_spare): it lives in the same process.
CREATE FUNCTION awa.rescue_lost(p_stale_s double precision, p_limit integer, p_spare bigint)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT h.id, h.lease, s.id AS owner, s.stopped_at
          FROM awa.jobs_hot h
          LEFT JOIN awa.supervisors s ON s.id = h.supervisor_id
         WHERE h.state = 'running'
           AND h.supervisor_id IS DISTINCT FROM p_spare
           AND (s.id IS NULL OR s.stopped_at IS NOT NULL
                OR greatest(s.heartbeat_at, pg_postmaster_start_time())
                   < now() - make_interval(secs => p_stale_s))
         LIMIT p_limit
         FOR UPDATE OF h SKIP LOCKED
    LOOP
        new_state := awa.finish_attempt(r.id, r.lease, 'lost', CASE
            WHEN r.owner IS NULL THEN 'supervisor lost: its registration is gone'
            WHEN r.stopped_at IS NOT NULL THEN 'supervisor lost: it stopped without settling the job'
            ELSE format('supervisor lost: no heartbeat for over %s s (killed, partitioned or wedged)', p_stale_s)
        END);
        CONTINUE WHEN new_state IS NULL;
        job_id := r.id;
        RETURN NEXT;
    END LOOP;
END $$;

-- Fast rescue (migration 0018): running jobs of supervisors whose liveness
-- lock the leader found free (their session ended: killed, crashed, out of
-- memory) go back at once, by the same path as awa.rescue_lost.
CREATE FUNCTION awa.rescue_supervisors(p_ids bigint[], p_limit integer DEFAULT 500)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT h.id, h.lease
          FROM awa.jobs_hot h
         WHERE h.state = 'running' AND h.supervisor_id = ANY (p_ids)
         LIMIT p_limit
         FOR UPDATE OF h SKIP LOCKED
    LOOP
        new_state := awa.finish_attempt(r.id, r.lease, 'lost',
            'supervisor lost: its database session ended (killed, crashed or out of memory)');
        CONTINUE WHEN new_state IS NULL;
        job_id := r.id;
        RETURN NEXT;
    END LOOP;
END $$;

-- Backstop for a supervisor that is alive but failed to stop a job at its
-- timeout: rescue attempts more than p_grace_s past their deadline (and
-- more than p_grace_s after the server's start: an outcome that could not
-- be written while the server was down gets the whole grace).
CREATE FUNCTION awa.rescue_deadlines(p_grace_s double precision, p_limit integer DEFAULT 500)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT h.id, h.lease FROM awa.jobs_hot h
         WHERE h.state = 'running' AND h.deadline < now() - make_interval(secs => p_grace_s)
           AND pg_postmaster_start_time() < now() - make_interval(secs => p_grace_s)
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    LOOP
        new_state := awa.finish_attempt(r.id, r.lease, 'deadline', format(
            'deadline exceeded by over %s s: its supervisor did not stop the job', p_grace_s));
        CONTINUE WHEN new_state IS NULL;
        job_id := r.id;
        RETURN NEXT;
    END LOOP;
END $$;

-- Retention: rotate the ring of terminal history when the current segment
-- has been current for a period of min(keep completed, keep failed) /
-- (segments - 1), at least 1 s (or p_period_s when given). The oldest
-- segment's rows still inside their retention (or members of batches not
-- done yet) are carried forward into the current segment, then the oldest
-- segment is TRUNCATEd and becomes the current one. A row is removed at
-- most (segments - 1) periods after its retention ends, and never before.
-- Returns one row: rotated (the ring turned), busy (the TRUNCATE did not get
-- its lock within p_lock_timeout, or another rotation holds the ring:
-- nothing changed, try later), dropped and carried (row counts), segment.
-- No JIT: a sequential scan of a big segment is costed past
-- jit_above_cost, and compiling took most of a rotation's time.
CREATE FUNCTION awa.rotate_done_ring(
    p_keep_completed_s double precision, p_keep_failed_s double precision,
    p_keep_dlq_s double precision, p_lock_timeout text DEFAULT '200ms',
    p_period_s double precision DEFAULT NULL)
RETURNS TABLE (rotated boolean, busy boolean, dropped bigint, carried bigint, segment smallint)
LANGUAGE plpgsql SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    -- $1..$3: the retentions of completed, failed or cancelled, and dead-lettered rows
    c_kept CONSTANT text := $k$
        coalesce(d.finalized_at, d.attempted_at, d.created_at) > now() - make_interval(secs =>
            CASE WHEN d.dead_lettered THEN $3 WHEN d.state = 'completed' THEN $1 ELSE $2 END)
        OR (d.batch_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM awa.batches b WHERE b.id = d.batch_id AND b.done_at IS NULL))$k$;
    r          awa.done_ring;
    v_oldest   smallint;
    v_total    bigint;
    v_kept     bigint;
    v_carried  bigint := 0;
    v_timeout  text := current_setting('lock_timeout');
BEGIN
    rotated := false; busy := false; dropped := 0; carried := 0;
    SELECT * INTO r FROM awa.done_ring FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        busy := true;
        segment := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    segment := r.current;
    IF r.rotated_at > now() - make_interval(secs => coalesce(p_period_s, greatest(1.0,
            least(p_keep_completed_s, p_keep_failed_s) / greatest(r.segments - 1, 1)))) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    v_oldest := (r.current + 1) % r.segments;
    BEGIN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
        EXECUTE format('SELECT count(*), count(*) FILTER (WHERE %s) FROM awa.%I d',
                       c_kept, 'jobs_done_' || v_oldest)
           INTO v_total, v_kept USING p_keep_completed_s, p_keep_failed_s, p_keep_dlq_s;
        IF v_kept > 0 THEN
            -- through the parent: a row changing segment moves to that partition
            EXECUTE format('UPDATE awa.jobs_done d SET segment = $4 WHERE d.segment = $5 AND (%s)', c_kept)
              USING p_keep_completed_s, p_keep_failed_s, p_keep_dlq_s, r.current, v_oldest;
            GET DIAGNOSTICS v_carried = ROW_COUNT;
        END IF;
        EXECUTE format('TRUNCATE awa.%I', 'jobs_done_' || v_oldest);
        PERFORM awa.fold_done_counts(v_oldest);
        UPDATE awa.done_ring SET current = v_oldest, rotated_at = now();
        PERFORM set_config('lock_timeout', v_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        busy := true;      -- the subtransaction rolled back the move and the setting
        RETURN NEXT;
        RETURN;
    END;
    rotated := true;
    dropped := v_total - v_carried;
    carried := v_carried;
    segment := v_oldest;
    RETURN NEXT;
END $$;

-- Unique keys whose job no longer exists (removed by retention or a purge):
-- scan one chunk of keys after p_after in key order and delete the stale
-- ones. The delete re-checks job_id, so a key a producer re-pointed at a new
-- job meanwhile is left alone. Returns the chunk's last key (NULL at the end
-- of the table: start again from the beginning).
CREATE FUNCTION awa.clean_unique_keys(p_after bytea, p_limit integer)
RETURNS TABLE (removed integer, last_key bytea)
LANGUAGE sql AS $$
    WITH chunk AS MATERIALIZED (
        SELECT u.key, u.job_id FROM awa.unique_keys u
         WHERE p_after IS NULL OR u.key > p_after
         ORDER BY u.key
         LIMIT p_limit
    ),
    gone AS (
        DELETE FROM awa.unique_keys u USING chunk c
         WHERE u.key = c.key AND u.job_id = c.job_id AND awa.job_state_of(c.job_id) IS NULL
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone)::integer,
           CASE WHEN (SELECT count(*) FROM chunk) < p_limit THEN NULL
                ELSE (SELECT c.key FROM chunk c ORDER BY c.key DESC LIMIT 1) END
$$;

-- Periodic jobs. The leader computes due ticks in Python (croniter) and
-- hands them to awa.fire_cron, which fires them in one transaction. Two
-- guards make a double fire impossible even with two leaders by accident:
-- a compare-and-swap of cron_jobs.last_fire_at, and one awa.cron_fires row
-- per (name, tick), inserted ON CONFLICT DO NOTHING before the job.

-- Fire times go into job metadata as ISO 8601 in UTC, whatever the session's
-- TimeZone (ticks are whole seconds).
CREATE FUNCTION awa.iso_utc(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"')
$$;

-- Upsert declared schedules (a JSON array of objects named like the
-- columns). Never deletes: other deployments may own other schedules.
-- `paused` and `last_fire_at` are kept on update; a new schedule starts with
-- last_fire_at = now(), so it fires from its next tick on (no backfill).
-- Rows that did not change are not rewritten.
CREATE FUNCTION awa.register_cron(p_schedules jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    INSERT INTO awa.cron_jobs AS c (name, expression, timezone, kind, queue, args, priority,
                                    max_attempts, tags, metadata, missed_fire_policy, last_fire_at)
    SELECT s.name, s.expression, coalesce(s.timezone, 'UTC'), s.kind, coalesce(s.queue, 'default'),
           coalesce(s.args, '{}'), coalesce(s.priority, 2), coalesce(s.max_attempts, 25),
           coalesce(s.tags, '{}'), coalesce(s.metadata, '{}'),
           coalesce(s.missed_fire_policy, 'coalesce'), now()
      FROM jsonb_to_recordset(p_schedules) AS s(
               name text, expression text, timezone text, kind text, queue text, args jsonb,
               priority smallint, max_attempts integer, tags text[], metadata jsonb,
               missed_fire_policy text)
     ORDER BY s.name
    ON CONFLICT (name) DO UPDATE
       SET expression = excluded.expression, timezone = excluded.timezone,
           kind = excluded.kind, queue = excluded.queue, args = excluded.args,
           priority = excluded.priority, max_attempts = excluded.max_attempts,
           tags = excluded.tags, metadata = excluded.metadata,
           missed_fire_policy = excluded.missed_fire_policy, updated_at = now()
     WHERE (c.expression, c.timezone, c.kind, c.queue, c.args, c.priority, c.max_attempts,
            c.tags, c.metadata, c.missed_fire_policy)
           IS DISTINCT FROM
           (excluded.expression, excluded.timezone, excluded.kind, excluded.queue, excluded.args,
            excluded.priority, excluded.max_attempts, excluded.tags, excluded.metadata,
            excluded.missed_fire_policy);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Fire the ticks p_fire_ats of schedule p_name, provided its last_fire_at is
-- still p_expected (NULL matches NULL) and it is not paused. Returns one row
-- per job inserted; none when another leader got there first.
CREATE FUNCTION awa.fire_cron(p_name text, p_expected timestamptz, p_fire_ats timestamptz[])
RETURNS TABLE (fire_at timestamptz, job_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    c      awa.cron_jobs;
    v_last timestamptz;
    t      timestamptz;
    v_id   bigint;
BEGIN
    SELECT max(x) INTO v_last FROM unnest(p_fire_ats) AS x;
    IF v_last IS NULL THEN
        RETURN;
    END IF;
    UPDATE awa.cron_jobs j SET last_fire_at = v_last
     WHERE j.name = p_name AND NOT j.paused
       AND j.last_fire_at IS NOT DISTINCT FROM p_expected
       AND v_last > coalesce(j.last_fire_at, '-infinity')
    RETURNING j.* INTO c;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR t IN
        SELECT DISTINCT x FROM unnest(p_fire_ats) AS x
         WHERE x > coalesce(p_expected, '-infinity')
         ORDER BY x
    LOOP
        INSERT INTO awa.cron_fires AS f (name, fire_at, job_id) VALUES (p_name, t, 0)
            ON CONFLICT ON CONSTRAINT cron_fires_pkey DO NOTHING;
        CONTINUE WHEN NOT FOUND;
        v_id := awa.insert_job(
            kind => c.kind, args => c.args, queue => c.queue, priority => c.priority,
            run_at => t, max_attempts => c.max_attempts, tags => c.tags,
            metadata => c.metadata || jsonb_build_object('awa:cron', p_name,
                                                         'awa:fire_at', awa.iso_utc(t)));
        UPDATE awa.cron_fires f SET job_id = v_id WHERE f.name = p_name AND f.fire_at = t;
        fire_at := t;
        job_id := v_id;
        RETURN NEXT;
    END LOOP;
END $$;

-- Enqueue a schedule's job now, paused or not (an operator's "run it now").
-- Not a tick: last_fire_at and cron_fires are untouched. NULL for an unknown name.
CREATE FUNCTION awa.trigger_cron(p_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c awa.cron_jobs;
BEGIN
    SELECT * INTO c FROM awa.cron_jobs j WHERE j.name = p_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN awa.insert_job(
        kind => c.kind, args => c.args, queue => c.queue, priority => c.priority,
        max_attempts => c.max_attempts, tags => c.tags,
        metadata => c.metadata || jsonb_build_object('awa:cron', p_name,
                                                     'awa:fire_at', awa.iso_utc(now()),
                                                     'awa:trigger', 'manual'));
END $$;


-- ===========================================================================
-- 7. Admin
-- ===========================================================================
--
-- Each admin transition takes the job out of its table under a row lock and
-- puts it back where its new state belongs, so it races safely with
-- supervisors and the leader: whoever takes the row first wins, the other
-- finds nothing.

-- take_job for admin calls that race with supervisors: a job that moves
-- from one table to another while we look is missed by one statement's
-- snapshot, so look again while it still exists in one of p_states. NULL
-- when it is absent or in none of them.
CREATE FUNCTION awa.take_moving_job(p_id bigint, p_states awa.job_state[]) RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
    v_state awa.job_state;
BEGIN
    FOR i IN 1..10 LOOP
        j := awa.take_job(p_id, p_states);
        IF j.id IS NOT NULL THEN
            RETURN j;
        END IF;
        v_state := awa.job_state_of(p_id);  -- a new snapshot: where is it now?
        IF v_state IS NULL OR NOT v_state = ANY (p_states) THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- Cancel a job that is not terminal yet. A running job is cancelled at once
-- in the database; its supervisor hears it on awa_cancel, tells the handler
-- (ctx.cancel_requested) and kills the child after a grace period. Returns
-- the job's state afterwards (NULL for an unknown id).
CREATE FUNCTION awa.cancel_job(p_id bigint, p_reason text DEFAULT 'cancelled by an operator')
RETURNS awa.job_state
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
    v_was_running boolean;
BEGIN
    j := awa.take_moving_job(p_id, ARRAY['scheduled', 'available', 'running', 'retryable',
                                         'waiting_external']::awa.job_state[]);
    IF j.id IS NULL THEN
        RETURN awa.job_state_of(p_id);
    END IF;
    v_was_running := j.state = 'running';
    j := awa.apply_outcome(j, 'cancel', p_reason);
    PERFORM awa.put_job(j);
    IF v_was_running THEN
        PERFORM pg_notify('awa_cancel', json_build_object('id', j.id, 'lease', j.lease)::text);
    END IF;
    RETURN j.state;
END $$;

-- Run a job again now: failed or cancelled jobs get fresh attempts (and
-- lose their expiry);
-- scheduled and retryable jobs just stop waiting; a batch follow-up stays
-- held while its batch is not done. Returns the new state, or the current
-- one when there is nothing to retry (NULL for an unknown id).
CREATE FUNCTION awa.retry_job(p_id bigint) RETURNS awa.job_state
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    j := awa.take_moving_job(p_id, ARRAY['scheduled', 'retryable', 'failed', 'cancelled']::awa.job_state[]);
    IF j.id IS NULL THEN
        RETURN awa.job_state_of(p_id);
    END IF;
    IF j.state IN ('failed', 'cancelled') THEN
        j.attempt := 0;
        j.crashes := 0;
        j.finalized_at := NULL;
        j.dead_lettered := false;
        j.expires_at := NULL;  -- an operator asks for it to run: an old expiry does not apply
        IF j.batch_id IS NOT NULL THEN  -- it will report to its batch again
            UPDATE awa.batches SET remaining = remaining + 1 WHERE id = j.batch_id AND remaining > 0;
        END IF;
    END IF;
    IF j.run_at = 'infinity' AND EXISTS (
            SELECT 1 FROM awa.batches b
             WHERE b.id = (j.metadata->>'awa:then_of')::bigint AND b.remaining > 0) THEN
        j.state := 'scheduled';  -- a held batch follow-up keeps waiting for its batch
        PERFORM awa.put_job(j);
        RETURN j.state;
    END IF;
    j.state := 'available';
    j.run_at := now();
    PERFORM awa.put_job(j);
    RETURN j.state;
END $$;

-- Split a queue into p_shards lanes (1 = one strict-FIFO lane). Jobs not yet
-- claimed move to their new lane at once: the same ordering key always maps
-- to the same lane, so per-key order survives the change.
CREATE FUNCTION awa.set_queue_shards(p_queue text, p_shards smallint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    m integer;
BEGIN
    INSERT INTO awa.queues (name, shards) VALUES (p_queue, p_shards)
    ON CONFLICT (name) DO UPDATE SET shards = excluded.shards;
    UPDATE awa.jobs_hot SET lane = awa.lane_of(p_shards, ordering_key)
     WHERE queue = p_queue AND state = 'available';
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE awa.jobs_deferred SET lane = awa.lane_of(p_shards, ordering_key)
     WHERE queue = p_queue;
    GET DIAGNOSTICS m = ROW_COUNT;
    RETURN n + m;
END $$;


-- The smallest job id created at or after p_at (NULL when every job is
-- older), by binary search on the ids: each step one probe of each job
-- table's id index. Ids follow creation (a job's id is taken by the
-- transaction that creates it), so an age filter becomes an id range and
-- list_jobs stops where the ages stop instead of reading every newer job.
CREATE FUNCTION awa.first_id_created_after(p_at timestamptz) RETURNS bigint
LANGUAGE plpgsql STABLE SET jit = off AS $$
DECLARE
    v_lo  bigint;
    v_hi  bigint;
    v_mid bigint;
    v_id  bigint;
    v_at  timestamptz;
BEGIN
    SELECT min(m) INTO v_lo FROM (SELECT min(h.id) AS m FROM awa.jobs_hot h
                                  UNION ALL SELECT min(d.id) FROM awa.jobs_deferred d
                                  UNION ALL SELECT min(x.id) FROM awa.jobs_done x) t;
    SELECT max(m) + 1 INTO v_hi FROM (SELECT max(h.id) AS m FROM awa.jobs_hot h
                                      UNION ALL SELECT max(d.id) FROM awa.jobs_deferred d
                                      UNION ALL SELECT max(x.id) FROM awa.jobs_done x) t;
    IF v_lo IS NULL THEN
        RETURN NULL;
    END IF;
    WHILE v_lo < v_hi LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        SELECT f.id, f.created_at INTO v_id, v_at FROM (
            (SELECT h.id, h.created_at FROM awa.jobs_hot h WHERE h.id >= v_mid ORDER BY h.id LIMIT 1)
            UNION ALL
            (SELECT d.id, d.created_at FROM awa.jobs_deferred d WHERE d.id >= v_mid ORDER BY d.id LIMIT 1)
            UNION ALL
            (SELECT x.id, x.created_at FROM awa.jobs_done x WHERE x.id >= v_mid ORDER BY x.id LIMIT 1)
        ) f ORDER BY f.id LIMIT 1;
        IF v_id IS NULL OR v_at >= p_at THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_id + 1;
        END IF;
        v_id := NULL;
    END LOOP;
    RETURN CASE WHEN v_lo >= (SELECT max(m) + 1 FROM (SELECT max(h.id) AS m FROM awa.jobs_hot h
                                                      UNION ALL SELECT max(d.id) FROM awa.jobs_deferred d
                                                      UNION ALL SELECT max(x.id) FROM awa.jobs_done x) t)
                THEN NULL ELSE v_lo END;
END $$;

-- How long to wait before the next census, given what the last one took.
CREATE FUNCTION awa.census_period_s(p_took_s double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(2.0, 25.0 * coalesce(p_took_s, 0.0))
$$;

-- The live tables' jobs per queue and state, counted now in one snapshot
-- (p_queues NULL: every queue).
CREATE FUNCTION awa.count_live(p_queues text[])
RETURNS TABLE (queue text, state text, jobs bigint, oldest timestamptz)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    RETURN QUERY
    SELECT h.queue, h.state::text, count(*), min(h.run_at) FILTER (WHERE h.state = 'available')
      FROM awa.jobs_hot h
     WHERE p_queues IS NULL OR h.queue = ANY (p_queues)
     GROUP BY 1, 2
    UNION ALL
    SELECT d.queue, d.state::text, count(*), NULL::timestamptz
      FROM awa.jobs_deferred d
     WHERE p_queues IS NULL OR d.queue = ANY (p_queues)
     GROUP BY 1, 2;
END $$;

-- Retake the census; returns seconds until the next one is due. The lock
-- on the meta row makes concurrent calls take turns.
CREATE FUNCTION awa.take_live_census() RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_started timestamptz;
    v_took    double precision;
BEGIN
    PERFORM 1 FROM awa.live_census_meta FOR UPDATE;
    v_started := clock_timestamp();
    DELETE FROM awa.live_census;
    INSERT INTO awa.live_census (queue, state, jobs, oldest)
    SELECT c.queue, c.state, c.jobs, c.oldest FROM awa.count_live(NULL) c;
    v_took := extract(epoch FROM clock_timestamp() - v_started);
    UPDATE awa.live_census_meta
       SET counted_at = v_started, took_s = v_took,
           jobs = (SELECT coalesce(sum(c.jobs), 0) FROM awa.live_census c);
    RETURN awa.census_period_s(v_took);
END $$;

-- Live jobs per queue and state for the readers, and the age of the counts
-- in seconds (0: counted by this call). The census is read only when it is
-- big enough to be worth it and fresh (three periods and 10 s of slack for
-- a busy leader); otherwise the tables are counted now.
CREATE FUNCTION awa.live_counts(p_queues text[])
RETURNS TABLE (queue text, state text, jobs bigint, oldest timestamptz, age_s double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m awa.live_census_meta;
BEGIN
    SELECT * INTO m FROM awa.live_census_meta;
    IF m.counted_at IS NOT NULL AND m.jobs >= m.exact_below
       AND m.counted_at > statement_timestamp()
                          - make_interval(secs => 3 * awa.census_period_s(m.took_s) + 10) THEN
        RETURN QUERY
        SELECT c.queue, c.state, c.jobs, c.oldest,
               greatest(0, extract(epoch FROM statement_timestamp() - m.counted_at))::double precision
          FROM awa.live_census c
         WHERE p_queues IS NULL OR c.queue = ANY (p_queues);
    ELSE
        RETURN QUERY
        SELECT c.queue, c.state, c.jobs, c.oldest, 0.0::double precision FROM awa.count_live(p_queues) c;
    END IF;
END $$;

-- Jobs of a queue that reached a terminal state in the last 10 and 60
-- seconds, reading at most its newest p_cap of them: exact below p_cap.
-- Above, the rate at which those p_cap finished, times the time from the
-- window's first finish (one index probe per state) to the newest: a
-- drain that began 3 s ago counts 3 s of it, not 10, and one that ended
-- 5 s ago is not counted on into the quiet since. (The 10 s count stays
-- exact while those p_cap reach back 10 s or more.) The windows end at
-- the statement's start, not the transaction's, so that every finish the
-- statement sees is inside them.
CREATE FUNCTION awa.recent_finishes(p_queue text, p_cap integer)
RETURNS TABLE (finished_10s bigint, finished_60s bigint)
LANGUAGE sql STABLE AS $$
WITH states AS (
    SELECT s.state FROM unnest(ARRAY['completed', 'failed', 'cancelled']::awa.job_state[]) AS s (state)
),
newest AS (
    SELECT f.finalized_at
      FROM states s
     CROSS JOIN LATERAL (
        SELECT x.finalized_at FROM awa.jobs_done x
         WHERE x.queue = p_queue AND x.state = s.state
           AND x.finalized_at > statement_timestamp() - interval '60 seconds'
         ORDER BY x.finalized_at DESC
         LIMIT p_cap) f
     ORDER BY f.finalized_at DESC
     LIMIT p_cap
),
seen AS (
    SELECT count(*) AS n, min(w.finalized_at) AS oldest, max(w.finalized_at) AS latest,
           count(*) FILTER (WHERE w.finalized_at > statement_timestamp() - interval '10 seconds') AS n10,
           greatest(extract(epoch FROM max(w.finalized_at) - min(w.finalized_at)), 0.001) AS span_s
      FROM newest w
),
first AS (
    SELECT min(f.at) AS first_at
      FROM states s
     CROSS JOIN LATERAL (
        SELECT x.finalized_at AS at FROM awa.jobs_done x
         WHERE x.queue = p_queue AND x.state = s.state
           AND x.finalized_at > statement_timestamp() - interval '60 seconds'
         ORDER BY x.finalized_at
         LIMIT 1) f
)
SELECT CASE WHEN n < p_cap OR oldest <= statement_timestamp() - interval '10 seconds' THEN n10
            ELSE greatest(n, round(n * extract(epoch FROM latest - greatest(first_at, statement_timestamp()
                                                                   - interval '10 seconds')) / span_s)) END::bigint,
       CASE WHEN n < p_cap THEN n
            ELSE greatest(n, round(n * extract(epoch FROM latest - first_at) / span_s)) END::bigint
  FROM seen, first
$$;

-- Operator statistics (behind queue_stats(), kind_stats(), the CLI, `top`
-- and the metrics): neither reads all of terminal history.
-- One row per known queue (a queue with live jobs, a row in awa.queues or
-- retained history): live counts from awa.live_counts() (the tables, or
-- the leader's census above a big backlog; counts_age_s says how old),
-- terminal ones from awa.done_counts, jobs finished in the last 10 and 60
-- seconds from awa.recent_finishes() (at most the newest 10,000 of them
-- from jobs_done's (queue, state, finalized_at) index), lag_s the
-- age of the oldest available job (0 when none).
CREATE FUNCTION awa.queue_stats()
RETURNS TABLE (queue text, available bigint, running bigint, scheduled bigint, retryable bigint,
               waiting_external bigint, completed bigint, failed bigint, cancelled bigint,
               finished_10s bigint, finished_60s bigint, lag_s double precision, paused boolean,
               counts_age_s double precision)
LANGUAGE sql STABLE SET jit = off AS $$
WITH live AS (
    SELECT c.queue, c.state, c.jobs AS n, c.oldest, c.age_s FROM awa.live_counts(NULL) c
),
done AS (
    SELECT c.queue,
           sum(c.jobs) FILTER (WHERE c.state = 'completed')::bigint AS completed,
           sum(c.jobs) FILTER (WHERE c.state = 'failed')::bigint AS failed,
           sum(c.jobs) FILTER (WHERE c.state = 'cancelled')::bigint AS cancelled
      FROM awa.done_counts c
     GROUP BY c.queue
    HAVING sum(c.jobs) <> 0
),
names AS (
    SELECT l.queue AS name FROM live l
    UNION
    SELECT q.name FROM awa.queues q
    UNION
    SELECT d.queue FROM done d
),
recent AS (
    SELECT n.name, r.finished_10s, r.finished_60s
      FROM names n CROSS JOIN LATERAL awa.recent_finishes(n.name, 10000) r
)
SELECT n.name,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'available'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'running'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'scheduled'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'retryable'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'waiting_external'), 0)::bigint,
       coalesce(min(d.completed), 0), coalesce(min(d.failed), 0), coalesce(min(d.cancelled), 0),
       coalesce(min(r.finished_10s), 0), coalesce(min(r.finished_60s), 0),
       greatest(0, coalesce(extract(epoch FROM now() - min(l.oldest)), 0))::double precision,
       coalesce(bool_or(q.paused), false),
       (SELECT coalesce(max(a.age_s), 0) FROM live a)::double precision
  FROM names n
  LEFT JOIN live l ON l.queue = n.name
  LEFT JOIN done d ON d.queue = n.name
  LEFT JOIN awa.queues q ON q.name = n.name
  LEFT JOIN recent r ON r.name = n.name
 GROUP BY n.name
 ORDER BY n.name
$$;

-- Per kind: runs, completions, failures, crashes and timeouts (the
-- terminal jobs' attempts from awa.done_kinds, plus the earlier attempts of
-- live jobs), and p50/p95 of wall time, CPU time and peak RSS over each
-- kind's latest p_sample finished jobs' attempts whose handler returned or
-- raised (a crashed, timed-out or lost attempt has no figures), plus the
-- live jobs' earlier attempts. With p_since_s, both only cover what
-- finished in the last p_since_s seconds (the counts in whole minutes: a
-- job's earlier attempts count in the minute it finished). Nothing here
-- reads all of history. Custom plans: the window and sample are constants
-- to the planner, so each kind's rows are one index range. No sort
-- and no sequential scan (migration 0027): each kind's latest jobs are read
-- backwards from the (kind, finalized_at) index, and the earlier attempts
-- of live jobs from the partial indexes of the rows that have any, whatever
-- the planner's statistics say. Right after a burst of finishes, before
-- ANALYZE had seen them, it took a kind's 150,000 rows into a sort and
-- scanned the hot table the burst left large (190 ms after draining
-- 300,000 jobs).
-- sampled: how many finished jobs the figures read for the kind.
CREATE FUNCTION awa.kind_stats(p_kind text, p_since_s double precision, p_sample integer)
RETURNS TABLE (kind text, runs bigint, completed bigint, failures bigint, crashes bigint,
               timeouts bigint, wall_p50 double precision, wall_p95 double precision,
               cpu_p50 double precision, cpu_p95 double precision, rss_p50 double precision,
               rss_p95 double precision, rss_max double precision, last_finished_at timestamptz,
               sampled bigint)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_custom_plan SET enable_sort = off
SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH live AS (
        -- earlier attempts of jobs not terminal yet
        SELECT j.kind, e ->> 'outcome' AS outcome,
               (e ->> 'wall_seconds')::double precision AS wall_s,
               (e ->> 'cpu_seconds')::double precision AS cpu_s,
               (e ->> 'peak_rss_bytes')::double precision AS peak_rss,
               (e ->> 'finished_at')::timestamptz AS finished_at
          FROM (SELECT h.kind, h.attempt_log FROM awa.jobs_hot h WHERE h.attempt_log IS NOT NULL
                UNION ALL
                SELECT d.kind, d.attempt_log FROM awa.jobs_deferred d WHERE d.attempt_log IS NOT NULL) j
         CROSS JOIN LATERAL jsonb_array_elements(j.attempt_log) AS e
         WHERE jsonb_typeof(j.attempt_log) = 'array'
           AND (p_kind IS NULL OR j.kind = p_kind)
           AND (p_since_s IS NULL
                OR (e ->> 'finished_at')::timestamptz > now() - make_interval(secs => p_since_s))
    ),
    counted AS (
        SELECT c.kind, sum(c.runs) AS runs, sum(c.ok) AS completed, sum(c.failures) AS failures,
               sum(c.crashes) AS crashes, sum(c.timeouts) AS timeouts
          FROM awa.done_kinds c
         WHERE (p_kind IS NULL OR c.kind = p_kind)
           AND (p_since_s IS NULL OR c.minute >= date_trunc('minute', now() - make_interval(secs => p_since_s)))
         GROUP BY c.kind
        UNION ALL
        SELECT l.kind, count(*), count(*) FILTER (WHERE l.outcome = 'completed'),
               count(*) FILTER (WHERE l.outcome IN ('failed', 'fatal', 'retry', 'lost', 'deadline',
                                                    'callback_timeout')),
               count(*) FILTER (WHERE l.outcome = 'crash'), count(*) FILTER (WHERE l.outcome = 'timeout')
          FROM live l
         GROUP BY l.kind
    ),
    totals AS (
        SELECT t.kind, sum(t.runs)::bigint AS runs, sum(t.completed)::bigint AS completed,
               sum(t.failures)::bigint AS failures, sum(t.crashes)::bigint AS crashes,
               sum(t.timeouts)::bigint AS timeouts
          FROM counted t
         GROUP BY t.kind
        HAVING sum(t.runs) > 0
    ),
    picked AS (
        -- each kind's latest p_sample finished jobs (in the window)
        SELECT d.*
          FROM totals k
         CROSS JOIN LATERAL (
            SELECT x.kind, x.state, x.errors, x.attempt_log, x.attempted_at, x.finalized_at,
                   x.wall_s, x.cpu_s, x.peak_rss
              FROM awa.jobs_done x
             WHERE x.kind = k.kind
               AND (p_since_s IS NULL OR x.finalized_at > now() - make_interval(secs => p_since_s))
             ORDER BY x.finalized_at DESC
             LIMIT p_sample) d
    ),
    attempts AS (
        SELECT p.kind,
               CASE WHEN p.state = 'failed' THEN coalesce(p.errors -> -1 ->> 'kind', 'failed')
                    WHEN p.state = 'cancelled' THEN 'cancel'
                    ELSE p.state::text END AS outcome,
               p.wall_s::double precision AS wall_s, p.cpu_s::double precision AS cpu_s,
               p.peak_rss::double precision AS peak_rss, p.finalized_at AS finished_at
          FROM picked p
         WHERE p.attempted_at IS NOT NULL AND (p.wall_s IS NOT NULL OR p.state = 'failed')
        UNION ALL
        SELECT p.kind, e ->> 'outcome', (e ->> 'wall_seconds')::double precision,
               (e ->> 'cpu_seconds')::double precision, (e ->> 'peak_rss_bytes')::double precision,
               (e ->> 'finished_at')::timestamptz
          FROM picked p
         CROSS JOIN LATERAL jsonb_array_elements(p.attempt_log) AS e
         WHERE p.attempt_log IS NOT NULL AND jsonb_typeof(p.attempt_log) = 'array'
        UNION ALL
        SELECT l.kind, l.outcome, l.wall_s, l.cpu_s, l.peak_rss, l.finished_at FROM live l
    ),
    figures AS (
        SELECT a.kind,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY a.wall_s) FILTER (WHERE m.measured) AS wall_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.wall_s) FILTER (WHERE m.measured) AS wall_p95,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY a.cpu_s) FILTER (WHERE m.measured) AS cpu_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.cpu_s) FILTER (WHERE m.measured) AS cpu_p95,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY a.peak_rss) FILTER (WHERE m.measured) AS rss_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.peak_rss) FILTER (WHERE m.measured) AS rss_p95,
               max(a.peak_rss) AS rss_max,
               max(a.finished_at) AS last_finished_at
          FROM attempts a
         CROSS JOIN LATERAL (SELECT a.outcome NOT IN ('crash', 'timeout', 'lost', 'deadline', 'interrupted',
                                                      'callback_timeout', 'released') AS measured) m
         GROUP BY a.kind
    )
    SELECT t.kind, t.runs, t.completed, t.failures, t.crashes, t.timeouts,
           f.wall_p50, f.wall_p95, f.cpu_p50, f.cpu_p95, f.rss_p50, f.rss_p95, f.rss_max,
           f.last_finished_at, (SELECT count(*) FROM picked p WHERE p.kind = t.kind)
      FROM totals t
      LEFT JOIN figures f ON f.kind = t.kind
     ORDER BY t.kind;
END $$;


-- ===========================================================================
-- 8. Privileges (SPEC §6): a producer role and a worker role
-- ===========================================================================
--
--   producer  enqueue, and nothing else: it calls the SECURITY DEFINER
--             entry points of section 3 and holds no privilege on any job
--             table. enqueue_batch also creates its batch row and attaches
--             its follow-up: column privileges on awa.batches, and
--             awa.batch_guard keeps such a role to well-formed batches.
--   worker    runs a supervisor, including leader maintenance: DML on the
--             queue's tables (no DELETE of terminal history; TRUNCATE only
--             on the ring segments retention rotates), EXECUTE on the awa
--             functions. No DDL: it owns nothing.
-- awa.grant_producer / awa.grant_worker / awa.revoke_privileges apply these
-- (behind `awa-pool grant`); they are idempotent. Run them again after
-- `awa-pool migrate` when a later migration adds objects.

-- Is job p_then the follow-up enqueue_batch created for batch p_batch (its
-- metadata names the batch)? Reads the job tables on behalf of a producer.
CREATE FUNCTION awa.is_follow_up(p_batch bigint, p_then bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM awa.jobs_deferred d
                    WHERE d.id = p_then AND d.metadata->>'awa:then_of' = p_batch::text)
        OR EXISTS (SELECT 1 FROM awa.jobs_hot h
                    WHERE h.id = p_then AND h.metadata->>'awa:then_of' = p_batch::text)
$$;

-- Roles other than the owner (producers) may only insert a fresh batch
-- (remaining = total, no follow-up, not done, open), attach, once, the
-- follow-up job that names that batch, and seal it (never reopen it). The
-- owner (migrations, operators) is not restricted.
CREATE FUNCTION awa.batch_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.total IS NULL OR NEW.total < 0 OR NEW.remaining IS DISTINCT FROM NEW.total
           OR NEW.then_id IS NOT NULL OR NEW.done_at IS NOT NULL OR NEW.sealed THEN
            RAISE EXCEPTION 'a new batch must have remaining = total, no follow-up, no end and be open'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.sealed AND NOT NEW.sealed THEN
        RAISE EXCEPTION 'batch % is sealed and cannot be reopened', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.then_id IS DISTINCT FROM OLD.then_id THEN
        IF OLD.then_id IS NOT NULL THEN
            RAISE EXCEPTION 'batch % already has its follow-up job %', OLD.id, OLD.then_id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF NOT awa.is_follow_up(NEW.id, NEW.then_id) THEN
            RAISE EXCEPTION 'job % is not the follow-up of batch %', NEW.then_id, NEW.id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER batches_guard_insert BEFORE INSERT ON awa.batches
    FOR EACH ROW EXECUTE FUNCTION awa.batch_guard();
CREATE TRIGGER batches_guard_then BEFORE UPDATE OF then_id, sealed ON awa.batches
    FOR EACH ROW EXECUTE FUNCTION awa.batch_guard();

-- The grant helpers name the role in their one-line error when it is missing.
CREATE FUNCTION awa.require_role(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role) THEN
        RAISE EXCEPTION 'role % does not exist (create it first: CREATE ROLE ... LOGIN)',
            coalesce(quote_ident(p_role), 'NULL') USING ERRCODE = 'undefined_object';
    END IF;
END $$;

-- Enqueue only (raw INSERT INTO awa.jobs included).
CREATE FUNCTION awa.grant_producer(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA awa TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION awa.insert_job(text, jsonb, text, integer, timestamptz, '
                   'integer, double precision, text[], jsonb, jsonb, text, bigint, boolean, timestamptz, '
                   'jsonb), awa.insert_jobs(jsonb, bigint), awa.insert_ready_jobs(jsonb, bigint), '
                   'awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, bigint, '
                   'text[], jsonb, double precision, jsonb) TO %I', p_role);
    -- the guard on awa.batches asks this on the producer's behalf
    EXECUTE format('GRANT EXECUTE ON FUNCTION awa.is_follow_up(bigint, bigint) TO %I', p_role);
    -- the CLI checks the schema version before acting
    EXECUTE format('GRANT SELECT ON awa.schema_migrations TO %I', p_role);
    -- enqueue_batch: create the batch row, then attach its follow-up
    EXECUTE format('GRANT INSERT (total, remaining), SELECT (id), UPDATE (then_id, sealed) ON awa.batches TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.batches_id_seq TO %I', p_role);
    -- INSERT INTO awa.jobs ... RETURNING id
    EXECUTE format('GRANT INSERT (kind, args, queue, priority, run_at, max_attempts, timeout_s, tags, '
                   'metadata, ordering_key, retry_policy, expires_at, unique_opts), SELECT (id) '
                   'ON awa.jobs TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.job_id_seq TO %I', p_role);
END $$;

-- Everything a supervisor does: claim, complete, settle, heartbeat, record
-- its tasks' defaults, callbacks, progress, and the leader's maintenance
-- (promotion, rescue, callback expiry, cron, retention).
CREATE FUNCTION awa.grant_worker(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f regprocedure;
    t regclass;
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA awa TO %I', p_role);
    EXECUTE format('GRANT SELECT ON awa.schema_migrations, awa.jobs TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON awa.jobs_hot, awa.jobs_deferred, '
                   'awa.supervisors, awa.cron_fires TO %I', p_role);
    -- terminal history is added to and rotated, never deleted from, by a worker
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON awa.jobs_done, awa.queues, awa.cron_jobs, '
                   'awa.task_defaults TO %I', p_role);
    FOR t IN SELECT i.inhrelid::regclass FROM pg_inherits i WHERE i.inhparent = 'awa.jobs_done'::regclass LOOP
        EXECUTE format('GRANT SELECT, TRUNCATE ON %s TO %I', t, p_role);
    END LOOP;
    EXECUTE format('GRANT SELECT, UPDATE ON awa.done_ring TO %I', p_role);
    -- queue_stats() and kind_stats() read the history's counts
    EXECUTE format('GRANT SELECT ON awa.done_counts, awa.done_kinds TO %I', p_role);
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON awa.batches TO %I', p_role);
    EXECUTE format('GRANT SELECT, DELETE ON awa.unique_keys TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON awa.callbacks_retired TO %I', p_role);
    -- terminal transitions check for waiters; the leader forgets stale ones
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON awa.waiters TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.supervisors_id_seq TO %I', p_role);
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = 'awa'::regnamespace
                AND p.proname NOT IN ('grant_producer', 'grant_worker', 'revoke_privileges', 'require_role')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, p_role);
    END LOOP;
END $$;

-- Take back everything granted on the schema (either profile).
CREATE FUNCTION awa.revoke_privileges(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM %I', p_role);
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM %I', p_role);
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM %I', p_role);
    EXECUTE format('REVOKE ALL ON SCHEMA awa FROM %I', p_role);
END $$;

-- Functions are executable by PUBLIC by default; here execution is granted
-- per role only. A migration that adds a function must revoke it from
-- PUBLIC too (tests/test_privileges.py checks).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM PUBLIC;


-- ===========================================================================
-- 9. Migration versions: this file stands for all of them
-- ===========================================================================

INSERT INTO awa.schema_migrations (version, name) VALUES
    (1, 'tables'),
    (2, 'producer'),
    (3, 'lifecycle'),
    (4, 'maintenance'),
    (5, 'admin'),
    (6, 'periodic'),
    (7, 'retention'),
    (8, 'privileges'),
    (9, 'steady_under_load'),
    (10, 'cached_hot_plans'),
    (11, 'single_completion'),
    (12, 'cached_completion_plan'),
    (13, 'set_based_settle'),
    (14, 'uniform_bulk_enqueue'),
    (15, 'light_rotation'),
    (16, 'task_timeouts'),
    (17, 'dashboard_indexes'),
    (18, 'fast_rescue'),
    (19, 'history_rollups'),
    (20, 'kind_finished_counts'),
    (21, 'claim_cursor'),
    (22, 'urgent_wakeup'),
    (23, 'light_first_completion_counts'),
    (24, 'uniform_bulk_tags_metadata'),
    (25, 'flat_queue_reads'),
    (26, 'rescue_spares_live_supervisors'),
    (27, 'retry_policy_and_expiry'),
    (28, 'insert_into_jobs'),
    (29, 'queue_policy');
