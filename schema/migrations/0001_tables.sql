-- awa_pool schema, version 1.
--
-- Storage rule (SPEC §7): rows live in one of three places by state.
--   awa.jobs_hot       available, running            (the claim path reads only this)
--   awa.jobs_deferred  scheduled, retryable, waiting_external
--   awa.jobs_done      completed, failed, cancelled  (a ring of list partitions;
--                      retention truncates whole partitions, never mass-DELETEs)
-- A job keeps its id when it moves between them. awa.jobs is the read-only
-- union of the three for admin queries.

CREATE SCHEMA IF NOT EXISTS awa;

CREATE TYPE awa.job_state AS ENUM (
    'scheduled', 'available', 'running', 'retryable', 'waiting_external',
    'completed', 'failed', 'cancelled'
);

CREATE SEQUENCE awa.job_id_seq;

-- Column order matters: the three job tables share it so rows can move with
-- INSERT ... SELECT. jobs_done appends one column (segment) at the end.
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
    CONSTRAINT jobs_kind_len CHECK (length(kind) BETWEEN 1 AND 200),
    CONSTRAINT jobs_queue_len CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT jobs_priority CHECK (priority BETWEEN 1 AND 4),
    CONSTRAINT jobs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT jobs_args_object CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT jobs_metadata_object CHECK (jsonb_typeof(metadata) = 'object')
) WITH (fillfactor = 85);

ALTER TABLE awa.jobs_hot ADD CONSTRAINT jobs_hot_pkey PRIMARY KEY (id);
ALTER TABLE awa.jobs_hot ADD CONSTRAINT jobs_hot_state
    CHECK (state IN ('available', 'running'));

-- The claim index: exactly the claim query's predicate and order.
CREATE INDEX jobs_hot_claim ON awa.jobs_hot (queue, lane, priority, run_at, id)
    WHERE state = 'available';
-- Running rows by owner: rescue of dead supervisors and deadline scans.
CREATE INDEX jobs_hot_running ON awa.jobs_hot (supervisor_id)
    WHERE state = 'running';
CREATE INDEX jobs_hot_callback ON awa.jobs_hot (callback_id)
    WHERE callback_id IS NOT NULL;

-- The hot table churns (claim = UPDATE, completion = DELETE): vacuum it early
-- and often so dead tuples on the claim path stay bounded under load.
ALTER TABLE awa.jobs_hot SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE awa.jobs_deferred (LIKE awa.jobs_hot INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE awa.jobs_deferred DROP CONSTRAINT jobs_hot_state;
ALTER TABLE awa.jobs_deferred ADD CONSTRAINT jobs_deferred_pkey PRIMARY KEY (id);
ALTER TABLE awa.jobs_deferred ADD CONSTRAINT jobs_deferred_state
    CHECK (state IN ('scheduled', 'retryable', 'waiting_external'));
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
ALTER TABLE awa.jobs_deferred SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- Terminal history: a ring of SEGMENTS list partitions. New terminal rows go
-- to awa.done_ring.current; retention rotates the ring, carrying forward the
-- few rows still inside their retention, then TRUNCATEs the oldest segment.
CREATE TABLE awa.jobs_done (
    LIKE awa.jobs_hot INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    segment smallint NOT NULL
) PARTITION BY LIST (segment);
ALTER TABLE awa.jobs_done DROP CONSTRAINT jobs_hot_state;
ALTER TABLE awa.jobs_done ADD CONSTRAINT jobs_done_state
    CHECK (state IN ('completed', 'failed', 'cancelled'));
ALTER TABLE awa.jobs_done ALTER COLUMN state SET DEFAULT 'completed';

DO $$
BEGIN
    FOR s IN 0..7 LOOP
        EXECUTE format(
            'CREATE TABLE awa.jobs_done_%s PARTITION OF awa.jobs_done FOR VALUES IN (%s)'
            ' WITH (autovacuum_enabled = true, fillfactor = 100)', s, s);
    END LOOP;
END $$;

CREATE INDEX jobs_done_id ON awa.jobs_done (id);
CREATE INDEX jobs_done_queue ON awa.jobs_done (queue, state, finalized_at);
CREATE INDEX jobs_done_dlq ON awa.jobs_done (queue, kind) WHERE dead_lettered;
CREATE INDEX jobs_done_batch ON awa.jobs_done (batch_id) WHERE batch_id IS NOT NULL;

CREATE TABLE awa.done_ring (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    current     smallint NOT NULL DEFAULT 0,
    segments    smallint NOT NULL DEFAULT 8,
    rotated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO awa.done_ring DEFAULT VALUES;

CREATE VIEW awa.jobs AS
    SELECT *, NULL::smallint AS segment FROM awa.jobs_hot
    UNION ALL
    SELECT *, NULL::smallint AS segment FROM awa.jobs_deferred
    UNION ALL
    SELECT * FROM awa.jobs_done;

-- Queue settings shared by every supervisor and producer.
CREATE TABLE awa.queues (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    shards      smallint NOT NULL DEFAULT 1 CHECK (shards BETWEEN 1 AND 64),
    dlq         boolean NOT NULL DEFAULT false,
    rate_per_s  double precision CHECK (rate_per_s IS NULL OR rate_per_s > 0),
    tokens      double precision NOT NULL DEFAULT 0,
    tokens_at   timestamptz NOT NULL DEFAULT now(),
    next_lane   bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Unique keys: one row per key, pointing at the job that holds it. Whether
-- the holder still blocks a newcomer is decided at insert time from the
-- holder's current state, so no trigger runs on the hot path.
CREATE TABLE awa.unique_keys (
    key     bytea PRIMARY KEY,
    job_id  bigint NOT NULL
);

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

-- One row per fired tick: the idempotency guard that makes a double fire
-- impossible even with two leaders by accident.
CREATE TABLE awa.cron_fires (
    name     text NOT NULL,
    fire_at  timestamptz NOT NULL,
    job_id   bigint NOT NULL,
    PRIMARY KEY (name, fire_at)
);
CREATE INDEX jobs_done_callback ON awa.jobs_done (callback_id) WHERE callback_id IS NOT NULL;

-- Sessions blocked in awa_pool.wait(): while any is listed, terminal
-- transitions send a NOTIFY on awa_done (and only then).
CREATE TABLE awa.waiters (
    pid    integer PRIMARY KEY,
    since  timestamptz NOT NULL DEFAULT now()
);
