-- Producer functions: the stable SQL API any language can call.

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

-- The stable producer entry point for any language:
--   SELECT awa.insert_job('send_email', '{"to": "a@b.c"}');
-- Inserts one job in the caller's transaction and returns its id. A ready
-- job wakes listening supervisors at commit (NOTIFY on awa_jobs).
-- unique_opts: {"by_args": bool, "by_queue": bool, "period": seconds,
-- "states": [...]}: while a job with the same key is in one of `states`, no
-- job is inserted and the existing job's id is returned.
-- hold: park the job until released (the follow-up of a batch).
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
    hold          boolean DEFAULT false
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    v_id      bigint := nextval('awa.job_id_seq');
    v_key     bytea;
    v_holder  bigint;
    v_run_at  timestamptz := coalesce(run_at, now());
    v_shards  smallint;
    v_lane    smallint;
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
            max_attempts, timeout_s, tags, metadata, unique_key, lane, ordering_key, batch_id)
        VALUES (v_id, kind, queue, coalesce(args, '{}'), 'scheduled', priority,
            CASE WHEN hold THEN 'infinity'::timestamptz ELSE v_run_at END,
            max_attempts, timeout_s, coalesce(tags, '{}'), coalesce(metadata, '{}'),
            v_key, v_lane, ordering_key, batch_id);
    ELSE
        INSERT INTO awa.jobs_hot AS j (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, unique_key, lane, ordering_key, batch_id)
        VALUES (v_id, kind, queue, coalesce(args, '{}'), 'available', priority, v_run_at,
            max_attempts, timeout_s, coalesce(tags, '{}'), coalesce(metadata, '{}'),
            v_key, v_lane, ordering_key, batch_id);
        PERFORM pg_notify('awa_jobs', queue);  -- see "Waking supervisors" below
    END IF;
    RETURN v_id;
END $$;

-- Bulk insert: p_jobs is a JSON array of objects with insert_job's parameter
-- names as keys, plus delay_s (seconds from now) as an alternative to run_at;
-- absent keys take the defaults. Returns (ord, id) pairs,
-- ord being the 1-based input position. Jobs without unique options go in
-- with two set-based statements; unique jobs go through insert_job one by one.
-- p_batch_id: every job joins that (open) batch.
CREATE FUNCTION awa.insert_jobs(p_jobs jsonb, p_batch_id bigint DEFAULT NULL)
RETURNS TABLE (ord bigint, id bigint)
LANGUAGE plpgsql VOLATILE AS $$
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
               awa.lane_of(q.shards, x.ordering_key) AS new_lane
          FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
                   kind text, args jsonb, queue text, priority integer,
                   run_at timestamptz, max_attempts integer, timeout_s double precision,
                   tags text[], metadata jsonb, unique_opts jsonb, ordering_key text,
                   hold boolean, delay_s double precision))
               WITH ORDINALITY AS x(kind, args, queue, priority, run_at, max_attempts,
                   timeout_s, tags, metadata, unique_opts, ordering_key, hold,
                   delay_s, ord)
          LEFT JOIN awa.queues q ON q.name = coalesce(x.queue, 'default')
         WHERE x.unique_opts IS NULL
    ),
    hot AS (
        INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, lane, ordering_key, batch_id)
        SELECT new_id, kind, coalesce(queue, 'default'), coalesce(args, '{}'), 'available',
               coalesce(priority, 2), eff_run_at, coalesce(max_attempts, 25), timeout_s,
               coalesce(tags, '{}'), coalesce(metadata, '{}'), new_lane, ordering_key, p_batch_id
          FROM j
         WHERE NOT coalesce(hold, false) AND eff_run_at <= now()
    ),
    deferred AS (
        INSERT INTO awa.jobs_deferred (id, kind, queue, args, state, priority, run_at,
            max_attempts, timeout_s, tags, metadata, lane, ordering_key, batch_id)
        SELECT new_id, kind, coalesce(queue, 'default'), coalesce(args, '{}'), 'scheduled',
               coalesce(priority, 2),
               CASE WHEN coalesce(hold, false) THEN 'infinity'::timestamptz ELSE eff_run_at END,
               coalesce(max_attempts, 25), timeout_s,
               coalesce(tags, '{}'), coalesce(metadata, '{}'), new_lane, ordering_key, p_batch_id
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
                   hold boolean, delay_s double precision))
               WITH ORDINALITY AS x(kind, args, queue, priority, run_at, max_attempts,
                   timeout_s, tags, metadata, unique_opts, ordering_key, hold,
                   delay_s, ord)
         WHERE x.unique_opts IS NOT NULL
         ORDER BY x.ord
    LOOP
        ord := u.ord;
        id := awa.insert_job(u.kind, coalesce(u.args, '{}'), coalesce(u.queue, 'default'),
            coalesce(u.priority, 2),
            coalesce(u.run_at, now() + make_interval(secs => u.delay_s)),
            coalesce(u.max_attempts, 25), u.timeout_s,
            coalesce(u.tags, '{}'), coalesce(u.metadata, '{}'), u.unique_opts,
            u.ordering_key, p_batch_id, coalesce(u.hold, false));
        RETURN NEXT;
    END LOOP;
END $$;

-- The bulk fast path: jobs that are ready now, with no unique key and no
-- hold (what most bulk producers send). One INSERT in input order: ids come
-- from the sequence as rows are inserted, so sorted ascending they follow
-- the input. Same rows as awa.insert_job writes; keys it does not read
-- (run_at, delay_s, hold, unique_opts) belong to awa.insert_jobs.
CREATE FUNCTION awa.insert_ready_jobs(p_jobs jsonb, p_batch_id bigint DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_batch_id IS NOT NULL THEN
        PERFORM awa.require_open_batch(p_batch_id);
    END IF;
    RETURN QUERY
    INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, max_attempts, timeout_s,
                              tags, metadata, lane, ordering_key, batch_id)
    SELECT x.kind, coalesce(x.queue, 'default'), coalesce(x.args, '{}'), 'available',
           coalesce(x.priority, 2), coalesce(x.max_attempts, 25), x.timeout_s,
           coalesce(x.tags, '{}'), coalesce(x.metadata, '{}'),
           awa.lane_of(q.shards, x.ordering_key), x.ordering_key, p_batch_id
      FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
               kind text, args jsonb, queue text, priority integer, max_attempts integer,
               timeout_s double precision, tags text[], metadata jsonb, ordering_key text))
           WITH ORDINALITY AS x(kind, args, queue, priority, max_attempts, timeout_s, tags,
                                metadata, ordering_key, ord)
      LEFT JOIN awa.queues q ON q.name = coalesce(x.queue, 'default')
     ORDER BY x.ord
    RETURNING id;
    PERFORM pg_notify('awa_jobs', w.queue)
       FROM (SELECT DISTINCT coalesce(x.queue, 'default') AS queue
               FROM jsonb_to_recordset(p_jobs) AS x(queue text)) w;
END $$;

-- Waking supervisors: every function that makes jobs available in
-- awa.jobs_hot sends pg_notify('awa_jobs', <queue>) itself, once per queue
-- and statement (insert_job, insert_jobs, insert_ready_jobs, promote_due,
-- put_job). A NOTIFY is
-- delivered at commit, so a rolled-back enqueue wakes nobody. (A statement
-- trigger with a transition table did this before; calling pg_notify
-- directly costs a fraction of it on every single-job enqueue.)
