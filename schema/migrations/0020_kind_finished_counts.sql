-- The dashboard's kinds page reads its counts from awa.done_kinds (issue 23).
--
-- The page drew each kind's counts per slice of time (window/30: 2, 12, 48
-- or 336 minutes) by counting awa.jobs_done: jobs_done_kind index-only for
-- the jobs finished, jobs_done_trouble for failures, crashes, timeouts and
-- the earlier attempts. The open slice was counted again at every view
-- (109 ms for the 48 minutes of a 24 h window at 10M rows), and its rules
-- were not kind_stats' (a cancelled job that never ran counted as an
-- attempt). The slices are whole minutes, which done_kinds (0019) keeps
-- per kind; now:
--
-- * done_kinds also counts `finished`, the terminal jobs per kind and the
--   minute they finished in (their attempts were already there), so a
--   (segment, slot, kind, minute) row exists for every minute a kind
--   finished a job, run or not. Written by the same statement as the rest
--   (done_counts_sql(), written out in count_done()) and folded by the
--   rotation.
-- * done_kinds_minute: the page reads every kind's rows of the window.
-- * jobs_done_trouble (0017) served only the page's old counts: dropped,
--   so completions no longer maintain it.
--
-- Existing history is counted once, here, under the lock 0019 took for its
-- count. It is taken first: a completion holds awa.jobs_done and then
-- writes the counts, so locking the counts first could deadlock with it.
LOCK TABLE awa.jobs_done IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE awa.done_kinds ADD COLUMN finished bigint NOT NULL DEFAULT 0;   -- counted below
ALTER TABLE awa.done_kinds ALTER COLUMN finished DROP DEFAULT;
CREATE INDEX done_kinds_minute ON awa.done_kinds (minute);

-- done_counts_sql() as in 0019, plus `finished`; every (segment, kind,
-- minute) group now has something to count, so 0019's HAVING, which left
-- out the groups without attempts, goes.
CREATE OR REPLACE FUNCTION awa.done_counts_sql() RETURNS text
LANGUAGE sql IMMUTABLE AS $sql$ SELECT $q$
    WITH own AS (
        SELECT r.segment, r.queue, r.kind, r.state,
               date_trunc('minute', coalesce(r.finalized_at, now())) AS minute, count(*) AS jobs,
               count(*) FILTER (WHERE c.counted) AS runs,
               count(*) FILTER (WHERE c.counted AND c.outcome = 'completed') AS ok,
               count(*) FILTER (WHERE c.counted AND c.outcome IN ('failed', 'fatal', 'retry', 'lost',
                                                                  'deadline', 'callback_timeout')) AS failures,
               count(*) FILTER (WHERE c.counted AND c.outcome = 'crash') AS crashes,
               count(*) FILTER (WHERE c.counted AND c.outcome = 'timeout') AS timeouts
          FROM %1$s r
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
          FROM %1$s r CROSS JOIN LATERAL jsonb_array_elements(r.attempt_log) AS e
         WHERE r.attempt_log IS NOT NULL AND jsonb_typeof(r.attempt_log) = 'array'
         GROUP BY 1, 2, 3
    ),
    jobs AS (
        INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
        SELECT segment, pg_backend_pid(), queue, state, %2$s * sum(jobs)
          FROM own
         GROUP BY segment, queue, state
        ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs
    )
    INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                     finished)
    SELECT segment, pg_backend_pid(), kind, minute, %2$s * sum(runs), %2$s * sum(ok), %2$s * sum(failures),
           %2$s * sum(crashes), %2$s * sum(timeouts), %2$s * sum(finished)
      FROM (SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, jobs AS finished FROM own
            UNION ALL
            SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts, 0 FROM logged) x
     GROUP BY segment, kind, minute
    ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
       SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
           failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
           timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished
$q$ $sql$;

-- count_done() as in 0019, with the same statement written out.
CREATE OR REPLACE FUNCTION awa.count_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
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
        EXECUTE format(awa.done_counts_sql(), 'old_rows', -1);
        IF TG_OP = 'UPDATE' THEN
            EXECUTE format(awa.done_counts_sql(), 'new_rows', 1);
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- fold_done_counts() as in 0019, folding `finished` too.
CREATE OR REPLACE FUNCTION awa.fold_done_counts(p_truncated smallint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM awa.done_counts c WHERE c.segment = p_truncated;
    DELETE FROM awa.done_kinds k WHERE k.segment = p_truncated;
    WITH gone AS (
        DELETE FROM awa.done_counts c WHERE c.slot <> 0 RETURNING c.*
    )
    INSERT INTO awa.done_counts AS t (segment, slot, queue, state, jobs)
    SELECT segment, 0, queue, state, sum(jobs) FROM gone GROUP BY segment, queue, state
    ON CONFLICT ON CONSTRAINT done_counts_pkey DO UPDATE SET jobs = t.jobs + excluded.jobs;
    WITH gone AS (
        DELETE FROM awa.done_kinds k WHERE k.slot <> 0 RETURNING k.*
    )
    INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts,
                                     finished)
    SELECT segment, 0, kind, minute, sum(runs), sum(ok), sum(failures), sum(crashes), sum(timeouts),
           sum(finished)
      FROM gone GROUP BY segment, kind, minute
    ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
       SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
           failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
           timeouts = t.timeouts + excluded.timeouts, finished = t.finished + excluded.finished;
END $$;

-- The attempts in done_kinds are exact already (0019); only `finished` is
-- new. Fold every session's rows into slot 0 (a NULL segment forgets none),
-- so each (segment, kind, minute) has one row, then count the jobs into it:
-- one pass over history, without 0019's reading of every attempt_log (a
-- tenth of the time: 0.5 s per million rows on a 2-core VM, where
-- done_counts_sql() over all of history takes 5 s).
SELECT awa.fold_done_counts(NULL);
INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts, finished)
SELECT r.segment, 0, r.kind, date_trunc('minute', coalesce(r.finalized_at, now())), 0, 0, 0, 0, 0, count(*)
  FROM awa.jobs_done r
 GROUP BY 1, 3, 4
ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE SET finished = excluded.finished;

DROP INDEX awa.jobs_done_trouble;
