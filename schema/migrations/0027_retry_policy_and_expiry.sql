-- Retry policies, expiry, and kind_stats' plan after a burst (issue 41).
--
-- * A job stores its retry policy (retry_policy jsonb: backoff exponential,
--   linear or constant, base, max_delay, jitter; NULL: 2^n s plus up to
--   25 %, as before), and awa.apply_outcome computes a failed attempt's
--   delay from it (awa.backoff_s(attempt, policy)) on every path that
--   retries: settle, callback expiry, rescue. A handler's Retry(delay=...)
--   still wins. Which exceptions give up at once is the task's decision,
--   made in the child (its outcome is then `fatal`); SQL only sees delays.
-- * A job may expire (expires_at): the leader cancels one not started by
--   then with reason "expired" (awa.expire_jobs), and awa.claim skips it
--   meanwhile, so it never runs between two passes of the leader.
-- * awa.kind_stats, right after 300,000 jobs drained and before ANALYZE saw
--   them, planned "each kind's latest 1,000" as a bitmap scan of all 150,000
--   of the kind's rows and a sort, and scanned the 7,400 pages of the hot
--   table the burst left to find live jobs' earlier attempts: 185-214 ms
--   on the 2-vCPU development VM, most of the 270-320 ms `awa-pool kinds`
--   took over the CLI's start-up (docs/benchmarks.md, "Read commands right
--   after a burst").
--   Without sorts or sequential scans the only plan left reads the (kind,
--   finalized_at) index backwards, 1,000 rows per kind, and partial
--   indexes of the rows with earlier attempts. After the fix: 5 ms on the
--   same database.
--
-- The three job tables now share one row shape, segment included (NULL
-- outside jobs_done): rows move between them with SELECT r.* in every
-- direction, and a column added later is added to each table at the end.
-- Functions redefined here (each body is the one of schema/current.sql):
-- insert_job, insert_jobs, insert_ready_jobs, insert_uniform_jobs, put_job,
-- take_job, apply_outcome, settle_jobs, promote_due, retry_job, claim,
-- grant_producer; new: check_retry_policy, policy_number,
-- backoff_s(integer, jsonb), expire_jobs.


-- 1. Columns. segment first, so that a row of any job table has the shape
-- of a terminal row (jobs_done already has segment there), then the two new
-- ones: adding nullable columns without a default rewrites nothing.
ALTER TABLE awa.jobs_hot ADD COLUMN segment smallint, ADD COLUMN retry_policy jsonb,
    ADD COLUMN expires_at timestamptz;
ALTER TABLE awa.jobs_deferred ADD COLUMN segment smallint, ADD COLUMN retry_policy jsonb,
    ADD COLUMN expires_at timestamptz;
ALTER TABLE awa.jobs_done ADD COLUMN retry_policy jsonb, ADD COLUMN expires_at timestamptz;

-- The view lists every column of the three tables, the new ones last.
CREATE OR REPLACE VIEW awa.jobs AS
    SELECT * FROM awa.jobs_hot
    UNION ALL
    SELECT * FROM awa.jobs_deferred
    UNION ALL
    SELECT * FROM awa.jobs_done;

-- Partial indexes: only rows that may expire, or that carry earlier
-- attempts, are in them (nothing for a plain job; the claim's UPDATE keeps
-- leaving the available-only ones).
CREATE INDEX jobs_hot_expiring ON awa.jobs_hot (expires_at)
    WHERE state = 'available' AND expires_at IS NOT NULL;
CREATE INDEX jobs_hot_retried ON awa.jobs_hot (kind)
    WHERE attempt_log IS NOT NULL;
CREATE INDEX jobs_deferred_expiring ON awa.jobs_deferred (expires_at)
    WHERE state IN ('scheduled', 'retryable') AND expires_at IS NOT NULL;
CREATE INDEX jobs_deferred_retried ON awa.jobs_deferred (kind)
    WHERE attempt_log IS NOT NULL;


-- 2. Retry policies: checked at enqueue, applied at settle.
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

CREATE FUNCTION awa.policy_number(p_policy jsonb, p_key text, p_default double precision,
                                  p_low double precision, p_high double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(greatest(CASE WHEN jsonb_typeof(p_policy -> p_key) = 'number'
                               THEN (p_policy ->> p_key)::double precision ELSE p_default END,
                          p_low), p_high)
$$;

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

-- 3. Producers: insert_job and insert_uniform_jobs take the two new
-- parameters (last, with defaults: a call naming the old ones gets the
-- rows it got before); the JSON of insert_jobs and insert_ready_jobs takes
-- expires_at or expires_in_s, and retry_policy.
DROP FUNCTION awa.insert_job(text, jsonb, text, integer, timestamptz, integer, double precision, text[],
                             jsonb, jsonb, text, bigint, boolean);
DROP FUNCTION awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, bigint,
                                      text[], jsonb);

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

CREATE OR REPLACE FUNCTION awa.insert_jobs(p_jobs jsonb, p_batch_id bigint DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION awa.insert_ready_jobs(p_jobs jsonb, p_batch_id bigint DEFAULT NULL)
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


-- 4. Moving rows: a terminal row carries its segment in its own column
-- (apply_outcome and put_job set it), so every table's row inserts into
-- another with SELECT r.*; promotion carries the new columns.
CREATE OR REPLACE FUNCTION awa.put_job(j awa.jobs_hot) RETURNS void
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

CREATE OR REPLACE FUNCTION awa.take_job(p_id bigint, p_states awa.job_state[]) RETURNS awa.jobs_hot
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

CREATE OR REPLACE FUNCTION awa.apply_outcome(
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

CREATE OR REPLACE FUNCTION awa.settle_jobs(p_outcomes jsonb, p_max_crashes integer DEFAULT 3)
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

CREATE OR REPLACE FUNCTION awa.promote_due(p_limit integer DEFAULT 1000)
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

CREATE OR REPLACE FUNCTION awa.retry_job(p_id bigint) RETURNS awa.job_state
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


-- 5. The claim never hands out a job past its expiry.
CREATE OR REPLACE FUNCTION awa.claim(
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


-- 6. Expiry, run by the leader (maintenance.ExpireJobs).
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


-- 7. kind_stats plans without sorts or sequential scans, so that it reads
-- each kind's latest jobs in index order whatever the statistics say (see
-- the header).
ALTER FUNCTION awa.kind_stats(text, double precision, integer) SET enable_sort = off;
ALTER FUNCTION awa.kind_stats(text, double precision, integer) SET enable_seqscan = off;


-- 8. Privileges (0008): nothing new for PUBLIC. Producers keep enqueueing
-- through the new signatures, and workers keep settling and maintaining:
-- the roles that held a replaced or neighbouring function get the new ones.
CREATE OR REPLACE FUNCTION awa.grant_producer(p_role text) RETURNS void
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
END $$;

REVOKE ALL ON FUNCTION awa.check_retry_policy(jsonb), awa.policy_number(jsonb, text, double precision, double precision, double precision),
    awa.backoff_s(integer, jsonb), awa.expire_jobs(integer),
    awa.insert_job(text, jsonb, text, integer, timestamptz, integer, double precision, text[], jsonb, jsonb,
                   text, bigint, boolean, timestamptz, jsonb),
    awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, bigint, text[], jsonb,
                            double precision, jsonb) FROM PUBLIC;
DO $$
DECLARE
    grantee regrole;
BEGIN
    -- producers (and workers, who hold every function): the entry points
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'awa.insert_ready_jobs(jsonb, bigint)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.insert_job(text, jsonb, text, integer, timestamptz, '
                       'integer, double precision, text[], jsonb, jsonb, text, bigint, boolean, timestamptz, '
                       'jsonb), awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, '
                       'bigint, text[], jsonb, double precision, jsonb) TO %s', grantee);
    END LOOP;
    -- workers: settling with a policy, and the leader's expiry
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'awa.complete_jobs(bigint[], bigint[], real[], real[], bigint[], jsonb)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.check_retry_policy(jsonb), '
                       'awa.policy_number(jsonb, text, double precision, double precision, double precision), awa.backoff_s(integer, jsonb), '
                       'awa.expire_jobs(integer) TO %s', grantee);
    END LOOP;
END $$;
