-- Fast rescue of a crashed supervisor.
--
-- Each supervisor holds a session-level advisory lock keyed by its id on its
-- LISTEN session for as long as it lives (awa_pool/liveness.py). When its
-- process dies (kill -9, a crash, the OOM killer) the server ends its
-- sessions and frees the lock at once; the leader, which looks every 0.25 s,
-- rescues that supervisor's running jobs here instead of waiting for its
-- heartbeat to go stale. Same path as awa.rescue_lost: the attempt counts,
-- the job goes back as available (NOTIFY included), and the old lease is
-- fenced, so the dead owner's late writes match nothing.
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

REVOKE ALL ON FUNCTION awa.rescue_supervisors(bigint[], integer) FROM PUBLIC;

-- Roles given the worker profile before this migration may run it too.
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole::text
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'awa.rescue_lost(double precision, integer)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.rescue_supervisors(bigint[], integer) TO %s', r);
    END LOOP;
END $$;
