-- A rescue never takes a live supervisor's jobs (SPEC §5).
--
-- After a server restart every heartbeat is at least as old as the outage:
-- no supervisor could write one while the server was down, and the first
-- session back (often the leader's) found live supervisors "stale" and put
-- back jobs whose outcomes were still waiting to be written, which then ran
-- twice. So staleness and lateness now count from the server's start at the
-- latest (pg_postmaster_start_time): a supervisor gets its full staleness
-- after a restart to reconnect and heartbeat, and a job its full deadline
-- grace to have its outcome written.
--
-- The leader also spares its own supervisor (p_spare): it lives in the
-- same process, so it is alive by definition, whatever its heartbeat says.
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

REVOKE ALL ON FUNCTION awa.rescue_lost(double precision, integer, bigint) FROM PUBLIC;

-- Roles that could run the old signature (the worker profile) run this one.
DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'awa.rescue_lost(double precision, integer)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.rescue_lost(double precision, integer, bigint) TO %s',
                       grantee);
    END LOOP;
END $$;

DROP FUNCTION awa.rescue_lost(double precision, integer);

-- The deadline backstop: attempts long past their deadline whose supervisor
-- is alive but did not stop them (its own included: that is what a
-- backstop is for), counted from the server's start at the latest.
CREATE OR REPLACE FUNCTION awa.rescue_deadlines(p_grace_s double precision, p_limit integer DEFAULT 500)
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
