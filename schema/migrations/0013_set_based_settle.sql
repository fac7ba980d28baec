-- Settling non-success outcomes a flush at a time instead of a job at a time.
--
-- settle_jobs called finish_attempt once per outcome: a DELETE, an INSERT
-- through put_job, and under 0009's force_custom_plan (which a function's SET
-- clause passes on to everything it calls) a fresh plan for each of them.
-- In the soak, where 3% of the jobs fail once on purpose and retry, those 3%
-- took about half as much database time as all the claims.
--
-- Now one DELETE takes every outcome's row (by key, joined on (id, lease)
-- as complete_jobs does, so a stale lease still changes nothing), apply_outcome
-- stays the one place that decides where a job goes next, and the rows go to
-- their tables in one INSERT per destination: jobs_done's statement triggers
-- (batch fan-in, waiter wake-up) fire once per flush, and a queue that got jobs
-- back gets one NOTIFY.
CREATE OR REPLACE FUNCTION awa.settle_jobs(p_outcomes jsonb, p_max_crashes integer DEFAULT 3)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
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
        INSERT INTO awa.jobs_done
        SELECT r.*, (SELECT d.current FROM awa.done_ring d)
          FROM unnest(v_rows) r WHERE r.state IN ('completed', 'failed', 'cancelled');
    END IF;

    RETURN QUERY SELECT r.id, r.state FROM unnest(v_rows) r;
END $$;

-- One cached plan per statement, as complete_jobs (0012): read by key, joined
-- by hash, never planned per call. (CREATE OR REPLACE cleared 0009's setting.)
ALTER FUNCTION awa.settle_jobs(jsonb, integer)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
    SET enable_nestloop = off SET jit = off;
