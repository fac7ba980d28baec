-- Completion flushes count their jobs for less (issue 23).
--
-- awa.count_done(), the statement trigger that keeps awa.done_counts and
-- awa.done_kinds exact, ran one statement for every insert into the
-- history: its own counts plus a `logged` part that expands each row's
-- attempt_log. A job that completes on its first attempt has no
-- attempt_log, and for such flushes (nearly all of them) the logged part
-- found nothing but still cost about 0.1 ms of server CPU per flush, a
-- third of the trigger and a quarter of a one-job completion statement
-- (W6, 45 ms jobs on two children: a claim carrying completions every
-- 22 ms). Inserts whose rows have no attempt_log now run the same counts
-- without it; the others run the statement as before.

CREATE OR REPLACE FUNCTION awa.count_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM new_rows r WHERE r.attempt_log IS NOT NULL) THEN
            WITH own AS (
                SELECT r.segment, r.queue, r.kind, r.state,
                       date_trunc('minute', coalesce(r.finalized_at, now())) AS minute, count(*) AS jobs,
                       count(*) FILTER (WHERE c.counted) AS runs,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'completed') AS ok,
                       count(*) FILTER (WHERE c.counted AND c.outcome IN ('failed', 'fatal', 'retry', 'lost',
                                                                          'deadline', 'callback_timeout')) AS failures,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'crash') AS crashes,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'timeout') AS timeouts
                  FROM new_rows r
                 CROSS JOIN LATERAL (SELECT
                       r.attempted_at IS NOT NULL AND (r.wall_s IS NOT NULL OR r.state = 'failed') AS counted,
                       CASE r.state WHEN 'failed' THEN coalesce(r.errors -> -1 ->> 'kind', 'failed')
                                    WHEN 'cancelled' THEN 'cancel' ELSE r.state::text END AS outcome) c
                 GROUP BY 1, 2, 3, 4, 5
            ),
            logged AS (
                SELECT r.segment, r.kind, date_trunc('minute', coalesce(r.finalized_at, now())) AS minute,
                       count(*) AS runs,
                       count(*) FILTER (WHERE e ->> 'outcome' = 'completed') AS ok,
                       count(*) FILTER (WHERE e ->> 'outcome' IN ('failed', 'fatal', 'retry', 'lost',
                                                                  'deadline', 'callback_timeout')) AS failures,
                       count(*) FILTER (WHERE e ->> 'outcome' = 'crash') AS crashes,
                       count(*) FILTER (WHERE e ->> 'outcome' = 'timeout') AS timeouts
                  FROM new_rows r CROSS JOIN LATERAL jsonb_array_elements(r.attempt_log) AS e
                 WHERE r.attempt_log IS NOT NULL AND jsonb_typeof(r.attempt_log) = 'array'
                 GROUP BY 1, 2, 3
            ),
            jobs AS (
                INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
                SELECT segment, pg_backend_pid(), queue, state, sum(jobs)
                  FROM own
                 GROUP BY segment, queue, state
                ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs
            )
            INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                             finished)
            SELECT segment, pg_backend_pid(), kind, minute, sum(runs), sum(ok), sum(failures),
                   sum(crashes), sum(timeouts), sum(finished)
              FROM (SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, jobs AS finished FROM own
                    UNION ALL
                    SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, 0 FROM logged) x
             GROUP BY segment, kind, minute
            ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
               SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
                   failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
                   timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished;
        ELSE
            -- No attempt_log among them (first attempts, the usual completion):
            -- the same counts without the logged part, about 0.1 ms less server
            -- CPU per flush (migration 0023). One statement with the logged part
            -- behind a flag is not enough: it cost 670-710 us per one-job
            -- completion against 580-610 us for this branch.
            WITH own AS (
                SELECT r.segment, r.queue, r.kind, r.state,
                       date_trunc('minute', coalesce(r.finalized_at, now())) AS minute, count(*) AS jobs,
                       count(*) FILTER (WHERE c.counted) AS runs,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'completed') AS ok,
                       count(*) FILTER (WHERE c.counted AND c.outcome IN ('failed', 'fatal', 'retry', 'lost',
                                                                          'deadline', 'callback_timeout')) AS failures,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'crash') AS crashes,
                       count(*) FILTER (WHERE c.counted AND c.outcome = 'timeout') AS timeouts
                  FROM new_rows r
                 CROSS JOIN LATERAL (SELECT
                       r.attempted_at IS NOT NULL AND (r.wall_s IS NOT NULL OR r.state = 'failed') AS counted,
                       CASE r.state WHEN 'failed' THEN coalesce(r.errors -> -1 ->> 'kind', 'failed')
                                    WHEN 'cancelled' THEN 'cancel' ELSE r.state::text END AS outcome) c
                 GROUP BY 1, 2, 3, 4, 5
            ),
            jobs AS (
                INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
                SELECT segment, pg_backend_pid(), queue, state, sum(jobs)
                  FROM own
                 GROUP BY segment, queue, state
                ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs
            )
            INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                             finished)
            SELECT segment, pg_backend_pid(), kind, minute, sum(runs), sum(ok), sum(failures),
                   sum(crashes), sum(timeouts), sum(jobs)
              FROM own
             GROUP BY segment, kind, minute
            ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
               SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
                   failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
                   timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished;
        END IF;
    ELSE
        EXECUTE format(awa.done_counts_sql(), 'old_rows', -1);
        IF TG_OP = 'UPDATE' THEN
            EXECUTE format(awa.done_counts_sql(), 'new_rows', 1);
        END IF;
    END IF;
    RETURN NULL;
END $$;
