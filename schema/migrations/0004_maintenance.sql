-- Leader maintenance: rescue the running jobs of lost supervisors and of
-- attempts far past their deadline.

-- Running jobs whose supervisor stopped heartbeating (or stopped without
-- settling them) go back to available (or fail when out of attempts). The
-- lease is untouched: the next claim bumps it, so the old owner's late
-- writes match nothing.
CREATE FUNCTION awa.rescue_lost(p_stale_s double precision, p_limit integer DEFAULT 500)
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
           AND (s.id IS NULL OR s.stopped_at IS NOT NULL
                OR s.heartbeat_at < now() - make_interval(secs => p_stale_s))
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

-- Backstop for a supervisor that is alive but failed to stop a job at its
-- timeout: rescue attempts more than p_grace_s past their deadline.
CREATE FUNCTION awa.rescue_deadlines(p_grace_s double precision, p_limit integer DEFAULT 500)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT h.id, h.lease FROM awa.jobs_hot h
         WHERE h.state = 'running' AND h.deadline < now() - make_interval(secs => p_grace_s)
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
