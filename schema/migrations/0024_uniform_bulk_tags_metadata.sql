-- Bulk enqueue keeps its args-only path when every job of a chunk carries
-- the same tags and metadata (issue 23).
--
-- With an OpenTelemetry SDK, enqueue_many writes the call's traceparent
-- into every job's metadata, and a chunk of jobs with metadata took
-- awa.insert_ready_jobs, a JSON object per job: on the 2-vCPU VM about
-- 37 µs per job against 6.5 µs untraced. The traceparent is the same for
-- every job of one call, as are tags a producer puts on a whole import, so
-- they now go once per chunk as parameters, like kind and queue.
--
-- Same name, two more parameters with defaults: a caller passing the seven
-- of migration 0014 gets the same rows as before.

DROP FUNCTION awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, bigint);

CREATE FUNCTION awa.insert_uniform_jobs(
    p_kind text, p_queue text, p_priority integer, p_max_attempts integer,
    p_timeout_s double precision, p_args jsonb, p_batch_id bigint DEFAULT NULL,
    p_tags text[] DEFAULT '{}', p_metadata jsonb DEFAULT '{}')
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_shards smallint;
BEGIN
    IF p_batch_id IS NOT NULL THEN
        PERFORM awa.require_open_batch(p_batch_id);
    END IF;
    SELECT q.shards INTO v_shards FROM awa.queues q WHERE q.name = p_queue;
    RETURN QUERY
    INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, max_attempts, timeout_s,
                              tags, metadata, lane, batch_id)
    SELECT p_kind, p_queue, a.args, 'available', p_priority, p_max_attempts, p_timeout_s,
           coalesce(p_tags, '{}'), coalesce(p_metadata, '{}'), awa.lane_of(v_shards, NULL), p_batch_id
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(args, ord)
     ORDER BY a.ord
    RETURNING id;
    PERFORM pg_notify('awa_jobs', p_queue);
END $$;

-- Not for PUBLIC (0008); every role that may bulk-enqueue keeps the right
-- (those granted insert_ready_jobs, as in 0014), and grant_producer names
-- the new signature.
REVOKE ALL ON FUNCTION awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, bigint,
                                               text[], jsonb) FROM PUBLIC;
DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'awa.insert_ready_jobs(jsonb, bigint)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.insert_uniform_jobs(text, text, integer, integer, '
                       'double precision, jsonb, bigint, text[], jsonb) TO %s', grantee);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION awa.grant_producer(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA awa TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION awa.insert_job(text, jsonb, text, integer, timestamptz, '
                   'integer, double precision, text[], jsonb, jsonb, text, bigint, boolean), '
                   'awa.insert_jobs(jsonb, bigint), awa.insert_ready_jobs(jsonb, bigint), '
                   'awa.insert_uniform_jobs(text, text, integer, integer, double precision, jsonb, bigint, '
                   'text[], jsonb) TO %I', p_role);
    -- the guard on awa.batches asks this on the producer's behalf
    EXECUTE format('GRANT EXECUTE ON FUNCTION awa.is_follow_up(bigint, bigint) TO %I', p_role);
    -- the CLI checks the schema version before acting
    EXECUTE format('GRANT SELECT ON awa.schema_migrations TO %I', p_role);
    -- enqueue_batch: create the batch row, then attach its follow-up
    EXECUTE format('GRANT INSERT (total, remaining), SELECT (id), UPDATE (then_id, sealed) ON awa.batches TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.batches_id_seq TO %I', p_role);
END $$;
