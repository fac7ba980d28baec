-- One effective timeout per job, decided in the claim.
--
-- A job's timeout is its own (Job(timeout=...)), else the one its task
-- declares (@task(timeout=...)). Until now the supervisor applied the task's
-- default from its registry while the claim built the database deadline from
-- the row alone, so a job enqueued without the registry (the CLI without
-- --app, raw SQL awa.insert_job) had no deadline, and the leader's deadline
-- backstop never covered it. Supervisors now record their tasks' declared
-- timeouts here at start; the claim takes the job's own timeout, else this
-- one, sets the deadline from it and returns it: the supervisor enforces
-- exactly the timeout the database's deadline was built from.
--
-- Supervisors running different versions of a task write the timeout of the
-- one that started last.
CREATE TABLE awa.task_defaults (
    kind       text PRIMARY KEY,
    timeout_s  double precision CHECK (timeout_s > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION awa.claim(
    p_queue text, p_limit integer, p_supervisor bigint,
    p_aging_s double precision DEFAULT 60, p_lane smallint DEFAULT 0, p_lease bigint DEFAULT NULL)
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
    v_want    integer := p_limit;
    v_got     integer;
BEGIN
    SELECT q.paused, q.rate_per_s, q.shards INTO v_paused, v_rate, v_shards
      FROM awa.queues q WHERE q.name = p_queue;
    IF v_paused THEN
        RETURN;
    END IF;
    IF v_shards > 1 THEN
        -- A lane is strict FIFO: its claims take turns (supervisors spread
        -- over lanes, so they rarely wait on each other).
        PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\x1f' || p_lane, 1793));
    END IF;
    IF v_rate IS NOT NULL THEN
        v_want := awa.take_tokens(p_queue, p_limit);
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

-- Workers record their tasks' defaults at start.
CREATE OR REPLACE FUNCTION awa.grant_worker(p_role text) RETURNS void
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

-- queue_stats() now reads one named query shared with the CLI, `top` and the
-- metrics (schema/queries/stats.sql); the function it used to call goes.
DROP FUNCTION awa.queue_counts();
