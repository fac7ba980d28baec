-- Completing one job without planning a statement per call.
--
-- At low rates (CPU-bound jobs, a worker waiting on a trickle) nearly every
-- completion flush holds one job, and complete_jobs plans its statement
-- afresh on every call (0010 explains why its generic plan is unsafe):
-- about half of such a call's PostgreSQL CPU went to planning, CPU that a
-- CPU-bound pool takes from its children. complete_job is the same move for
-- one job by primary key. Its generic plan is safe on any table size: one
-- key lookup (sequential scans off, so an emptied table's statistics cannot
-- make a scan look cheaper; without JIT, as in 0010), kept for the session.
CREATE FUNCTION awa.complete_job(
    p_id bigint, p_lease bigint, p_wall real, p_cpu real, p_rss bigint,
    p_extra jsonb DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
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

ALTER FUNCTION awa.complete_job(bigint, bigint, real, real, bigint, jsonb)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;

-- Not for PUBLIC (0008); the roles that may complete jobs the batch way
-- (granted before this migration by awa.grant_worker) may complete one.
REVOKE ALL ON FUNCTION awa.complete_job(bigint, bigint, real, real, bigint, jsonb) FROM PUBLIC;
DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'awa.complete_jobs(bigint[], bigint[], real[], real[], bigint[], jsonb)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.complete_job(bigint, bigint, real, real, bigint, jsonb) TO %s',
                       grantee);
    END LOOP;
END $$;
