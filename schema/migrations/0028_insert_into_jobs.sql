-- Raw SQL producers may INSERT INTO awa.jobs (issue 40, SPEC §12).
--
-- awa.jobs is the read view over the three job tables, so an INSERT into
-- it failed ("cannot insert into view"): producers in other languages had
-- to call awa.insert_job() one job per call. Now
--
--   INSERT INTO awa.jobs (kind, args, queue, priority, run_at, max_attempts,
--                         timeout_s, tags, metadata, ordering_key, retry_policy,
--                         expires_at, unique_opts)
--   VALUES (...), (...) RETURNING id
--
-- works for one row or many, and for INSERT ... SELECT: every row gets
-- awa.insert_job's defaults, validation (a clear error naming the column;
-- one bad row fails the statement and inserts nothing; a retry policy is
-- checked by awa.check_retry_policy), lane, unique key (through
-- awa.insert_job itself) and NOTIFY, and RETURNING id gives the
-- new job's id, or for a unique duplicate the existing job's.
--
-- How, and why this way: an INSTEAD OF trigger on the view would run once
-- per row, and a row-at-a-time INSERT into awa.jobs_hot costs ~40 µs
-- (executor start, four indexes) against ~6 µs per job for a set-based
-- bulk insert: raw multi-row inserts would run at a sixth of enqueue_many.
-- So an INSTEAD rule rewrites the whole statement, set-based, into an
-- INSERT into awa.jobs_inbox, and a statement-level trigger on that table
-- (which, unlike the view, may have a transition table) validates the
-- statement's rows, moves them into awa.jobs_hot / awa.jobs_deferred with
-- one INSERT each, notifies once per queue and deletes them from the inbox
-- before the statement ends. The inbox is unlogged and always empty
-- between statements: a row there is never committed, only the jobs made
-- from it.
--
-- `partition` (SPEC §11) is not a column yet; it joins this list with it.
-- COPY into a view needs an INSTEAD OF trigger, which this does not add:
-- COPY into a table of your own, then INSERT INTO awa.jobs ... SELECT.

-- 1. The view gains unique_opts: insert_job's unique options, write-only
-- (reads show NULL; a job's key is in unique_key).
CREATE OR REPLACE VIEW awa.jobs AS
    SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_hot
    UNION ALL
    SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_deferred
    UNION ALL
    SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_done;

-- 2. The inbox.
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

-- 3. Validation. unique_opts as awa.insert_job reads them: by_args and by_queue booleans,
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

-- 4. A unique row goes through awa.insert_job at once, as it arrives: its
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

-- 5. The rest of the statement's rows, set-based, with insert_jobs' defaults
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

-- 6. The rule. RETURNING gives the id (an existing job's for a unique
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

-- 7. Privileges. Functions are not for PUBLIC (0008). A producer may insert
-- the columns above (RETURNING id needs SELECT on id, which shows it the
-- ids of all jobs and nothing else about them; the rewritten INSERT takes
-- its ids from awa.job_id_seq as the producer): grant_producer grants it,
-- and every role that already is a producer (it may create batches) gets it.
REVOKE ALL ON FUNCTION awa.job_row_problem(text, jsonb, text, integer, integer, double precision,
                                           text[], jsonb, text, jsonb, integer),
                       awa.unique_opts_problem(jsonb), awa.place_unique_row(),
                       awa.place_inserted_jobs() FROM PUBLIC;

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
    -- INSERT INTO awa.jobs ... RETURNING id
    EXECUTE format('GRANT INSERT (kind, args, queue, priority, run_at, max_attempts, timeout_s, tags, '
                   'metadata, ordering_key, retry_policy, expires_at, unique_opts), SELECT (id) '
                   'ON awa.jobs TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.job_id_seq TO %I', p_role);
END $$;

DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_attribute t, aclexplode(t.attacl) a
         WHERE t.attrelid = 'awa.batches'::regclass AND t.attname = 'total'
           AND a.privilege_type = 'INSERT' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT INSERT (kind, args, queue, priority, run_at, max_attempts, timeout_s, tags, '
                       'metadata, ordering_key, retry_policy, expires_at, unique_opts), SELECT (id) '
                       'ON awa.jobs TO %s', grantee);
        EXECUTE format('GRANT USAGE ON SEQUENCE awa.job_id_seq TO %s', grantee);
    END LOOP;
END $$;
