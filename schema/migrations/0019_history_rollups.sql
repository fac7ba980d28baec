-- Operator reads that stay flat as terminal history grows (issue 23).
--
-- queue_stats() counted each queue's retained completed, failed and
-- cancelled jobs with an index-only scan of awa.jobs_done, kind_stats()
-- (`awa-pool kinds`, with or without --since) read every retained attempt,
-- and list_jobs' age filters walked every newer job: all grew with history
-- (6 s, 58 s and 3.7 s at 10M rows on a 2-core VM), and the cost estimates
-- of the first two made PostgreSQL JIT-compile them for seconds. Now:
--
-- * Running counts kept by statement triggers on awa.jobs_done, exact in
--   the writer's own transaction through every insert, delete and update
--   of history:
--     awa.done_counts  terminal jobs per ring segment, queue and state;
--     awa.done_kinds   their attempts per segment, kind and minute they
--                      finished in (runs, completions, failures, crashes,
--                      timeouts, counted as kind_stats counts them).
--   Each session writes its own rows (slot = its backend pid), so
--   concurrent completion flushes never wait on each other; the rotation
--   drops the truncated segment's rows and folds the others into slot 0.
-- * awa.queue_stats() reads terminal totals from done_counts (the
--   last-minute throughput still reads the last 60 s of an index).
-- * awa.kind_stats() reads its counts from done_kinds (all, or the whole
--   minutes of the window), and its percentiles from each kind's latest
--   p_sample finished jobs (in the window, if one is given), through the
--   new (kind, finalized_at) index.
-- * Both run with jit = off.
-- * awa.first_id_created_after() turns list_jobs' age filters into an id
--   range.
--
-- Existing history is counted once, here, under the triggers' table lock.

CREATE TABLE awa.done_counts (
    segment   smallint      NOT NULL,
    slot      integer       NOT NULL,   -- the writing backend's pid; 0 = folded by the rotation
    queue     text          NOT NULL,
    state     awa.job_state NOT NULL,
    jobs      bigint        NOT NULL,
    CONSTRAINT done_counts_pkey PRIMARY KEY (segment, slot, queue, state)
) WITH (
    -- updated by every completion flush: room on the page for HOT updates
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE awa.done_kinds (
    segment   smallint      NOT NULL,
    slot      integer       NOT NULL,
    kind      text          NOT NULL,
    minute    timestamptz   NOT NULL,   -- the minute the jobs finished in
    runs      bigint        NOT NULL,   -- attempts with an outcome (kind_stats' runs)
    ok        bigint        NOT NULL,
    failures  bigint        NOT NULL,
    crashes   bigint        NOT NULL,
    timeouts  bigint        NOT NULL,
    CONSTRAINT done_kinds_pkey PRIMARY KEY (segment, slot, kind, minute)
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);

-- The figures of a set of job rows, as one statement over `%1$s` (a
-- relation of awa.jobs_done rows) that adds them, times %2$s (1 or -1), to
-- the counts. kind_stats' rules: a terminal job's own attempt counts when
-- it was attempted and either has figures or failed; its outcome is its
-- state, a failed job's the kind of its last error; every attempt_log entry
-- counts with its own outcome, in the minute its job finished. The insert
-- trigger runs the same statement, written out (a cached plan).
CREATE FUNCTION awa.done_counts_sql() RETURNS text
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
    INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts)
    SELECT segment, pg_backend_pid(), kind, minute, %2$s * sum(runs), %2$s * sum(ok), %2$s * sum(failures),
           %2$s * sum(crashes), %2$s * sum(timeouts)
      FROM (SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts FROM own
            UNION ALL
            SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts FROM logged) x
     GROUP BY segment, kind, minute
    HAVING sum(runs) > 0
    ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
       SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
           failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
           timeouts = t.timeouts + excluded.timeouts
$q$ $sql$;

-- The triggers' body. Inserts (every completion flush) run one cached
-- statement; deletes and updates (purges, retries, the rotation's carry)
-- are rare and run the same text dynamically. Runs as the owner, so any
-- role that may write history keeps the counts right without privileges
-- on them.
CREATE FUNCTION awa.count_done() RETURNS trigger
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
        INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts)
        SELECT segment, pg_backend_pid(), kind, minute, sum(runs), sum(ok), sum(failures),
               sum(crashes), sum(timeouts)
          FROM (SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts FROM own
                UNION ALL
                SELECT segment, kind, minute, runs, ok, failures, crashes, timeouts FROM logged) x
         GROUP BY segment, kind, minute
        HAVING sum(runs) > 0
        ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
           SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
               failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
               timeouts = t.timeouts + excluded.timeouts;
    ELSE
        EXECUTE format(awa.done_counts_sql(), 'old_rows', -1);
        IF TG_OP = 'UPDATE' THEN
            EXECUTE format(awa.done_counts_sql(), 'new_rows', 1);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_count_insert AFTER INSERT ON awa.jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_done();
CREATE TRIGGER jobs_done_count_delete AFTER DELETE ON awa.jobs_done
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_done();
CREATE TRIGGER jobs_done_count_update AFTER UPDATE ON awa.jobs_done
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_done();

-- TRUNCATE of the whole history forgets every count (the rotation's
-- TRUNCATE of one segment is handled by awa.fold_done_counts).
CREATE FUNCTION awa.forget_done_counts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM awa.done_counts;
    DELETE FROM awa.done_kinds;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_count_truncate AFTER TRUNCATE ON awa.jobs_done
    FOR EACH STATEMENT EXECUTE FUNCTION awa.forget_done_counts();

-- After a rotation TRUNCATEd segment p_truncated: forget its counts, and
-- fold every session's rows of the other segments into slot 0.
CREATE FUNCTION awa.fold_done_counts(p_truncated smallint) RETURNS void
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
    INSERT INTO awa.done_kinds AS t (segment, slot, kind, minute, runs, ok, failures, crashes, timeouts)
    SELECT segment, 0, kind, minute, sum(runs), sum(ok), sum(failures), sum(crashes), sum(timeouts)
      FROM gone GROUP BY segment, kind, minute
    ON CONFLICT ON CONSTRAINT done_kinds_pkey DO UPDATE
       SET runs = t.runs + excluded.runs, ok = t.ok + excluded.ok,
           failures = t.failures + excluded.failures, crashes = t.crashes + excluded.crashes,
           timeouts = t.timeouts + excluded.timeouts;
END $$;

-- The history already there, counted once (the triggers above hold the
-- table against concurrent writers until this transaction commits).
LOCK TABLE awa.jobs_done IN SHARE ROW EXCLUSIVE MODE;
DO $$
BEGIN
    EXECUTE format(awa.done_counts_sql(), 'awa.jobs_done', 1);
    UPDATE awa.done_counts SET slot = 0;
    UPDATE awa.done_kinds SET slot = 0;
END $$;

-- kind_stats() reads a kind's latest finished jobs, and its jobs finished
-- within a window, through jobs_done_kind (kind, finalized_at; 0017).

-- The rotation as in 0015, plus the counts of the segment it truncates.
CREATE OR REPLACE FUNCTION awa.rotate_done_ring(
    p_keep_completed_s double precision, p_keep_failed_s double precision,
    p_keep_dlq_s double precision, p_lock_timeout text DEFAULT '200ms',
    p_period_s double precision DEFAULT NULL)
RETURNS TABLE (rotated boolean, busy boolean, dropped bigint, carried bigint, segment smallint)
LANGUAGE plpgsql SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    -- $1..$3: the retentions of completed, failed or cancelled, and dead-lettered rows
    c_kept CONSTANT text := $k$
        coalesce(d.finalized_at, d.attempted_at, d.created_at) > now() - make_interval(secs =>
            CASE WHEN d.dead_lettered THEN $3 WHEN d.state = 'completed' THEN $1 ELSE $2 END)
        OR (d.batch_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM awa.batches b WHERE b.id = d.batch_id AND b.done_at IS NULL))$k$;
    r          awa.done_ring;
    v_oldest   smallint;
    v_total    bigint;
    v_kept     bigint;
    v_carried  bigint := 0;
    v_timeout  text := current_setting('lock_timeout');
BEGIN
    rotated := false; busy := false; dropped := 0; carried := 0;
    SELECT * INTO r FROM awa.done_ring FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        busy := true;
        segment := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    segment := r.current;
    IF r.rotated_at > now() - make_interval(secs => coalesce(p_period_s, greatest(1.0,
            least(p_keep_completed_s, p_keep_failed_s) / greatest(r.segments - 1, 1)))) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    v_oldest := (r.current + 1) % r.segments;
    BEGIN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
        EXECUTE format('SELECT count(*), count(*) FILTER (WHERE %s) FROM awa.%I d',
                       c_kept, 'jobs_done_' || v_oldest)
           INTO v_total, v_kept USING p_keep_completed_s, p_keep_failed_s, p_keep_dlq_s;
        IF v_kept > 0 THEN
            -- through the parent: a row changing segment moves to that partition
            EXECUTE format('UPDATE awa.jobs_done d SET segment = $4 WHERE d.segment = $5 AND (%s)', c_kept)
              USING p_keep_completed_s, p_keep_failed_s, p_keep_dlq_s, r.current, v_oldest;
            GET DIAGNOSTICS v_carried = ROW_COUNT;
        END IF;
        EXECUTE format('TRUNCATE awa.%I', 'jobs_done_' || v_oldest);
        PERFORM awa.fold_done_counts(v_oldest);
        UPDATE awa.done_ring SET current = v_oldest, rotated_at = now();
        PERFORM set_config('lock_timeout', v_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        busy := true;      -- the subtransaction rolled back the move and the setting
        RETURN NEXT;
        RETURN;
    END;
    rotated := true;
    dropped := v_total - v_carried;
    carried := v_carried;
    segment := v_oldest;
    RETURN NEXT;
END $$;

-- One row per known queue (a queue with live jobs, a row in awa.queues or
-- retained history): live counts from the hot and deferred tables,
-- terminal ones from awa.done_counts, jobs finished in the last 10 and 60
-- seconds from jobs_done's (queue, state, finalized_at) index, lag_s the
-- age of the oldest available job (0 when none).
CREATE FUNCTION awa.queue_stats()
RETURNS TABLE (queue text, available bigint, running bigint, scheduled bigint, retryable bigint,
               waiting_external bigint, completed bigint, failed bigint, cancelled bigint,
               finished_10s bigint, finished_60s bigint, lag_s double precision, paused boolean)
LANGUAGE sql STABLE SET jit = off AS $$
WITH live AS (
    SELECT h.queue, h.state::text AS state, count(*) AS n,
           min(h.run_at) FILTER (WHERE h.state = 'available') AS oldest
      FROM awa.jobs_hot h
     GROUP BY 1, 2
    UNION ALL
    SELECT d.queue, d.state::text, count(*), NULL
      FROM awa.jobs_deferred d
     GROUP BY 1, 2
),
done AS (
    SELECT c.queue,
           sum(c.jobs) FILTER (WHERE c.state = 'completed')::bigint AS completed,
           sum(c.jobs) FILTER (WHERE c.state = 'failed')::bigint AS failed,
           sum(c.jobs) FILTER (WHERE c.state = 'cancelled')::bigint AS cancelled
      FROM awa.done_counts c
     GROUP BY c.queue
    HAVING sum(c.jobs) <> 0
),
names AS (
    SELECT l.queue AS name FROM live l
    UNION
    SELECT q.name FROM awa.queues q
    UNION
    SELECT d.queue FROM done d
)
SELECT n.name,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'available'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'running'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'scheduled'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'retryable'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'waiting_external'), 0)::bigint,
       coalesce(min(d.completed), 0), coalesce(min(d.failed), 0), coalesce(min(d.cancelled), 0),
       (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state IN ('completed', 'failed', 'cancelled')
           AND x.finalized_at > now() - interval '10 seconds'),
       (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state IN ('completed', 'failed', 'cancelled')
           AND x.finalized_at > now() - interval '60 seconds'),
       greatest(0, coalesce(extract(epoch FROM now() - min(l.oldest)), 0))::double precision,
       coalesce(bool_or(q.paused), false)
  FROM names n
  LEFT JOIN live l ON l.queue = n.name
  LEFT JOIN done d ON d.queue = n.name
  LEFT JOIN awa.queues q ON q.name = n.name
 GROUP BY n.name
 ORDER BY n.name
$$;

-- Per kind: runs, completions, failures, crashes and timeouts (the
-- terminal jobs' attempts from awa.done_kinds, plus the earlier attempts of
-- live jobs), and p50/p95 of wall time, CPU time and peak RSS over each
-- kind's latest p_sample finished jobs' attempts whose handler returned or
-- raised (a crashed, timed-out or lost attempt has no figures), plus the
-- live jobs' earlier attempts. With p_since_s, both only cover what
-- finished in the last p_since_s seconds (the counts in whole minutes: a
-- job's earlier attempts count in the minute it finished). Nothing here
-- reads all of history. Custom plans: the window and sample are constants
-- to the planner, so each kind's rows are one index range.
-- sampled: how many finished jobs the figures read for the kind.
CREATE FUNCTION awa.kind_stats(p_kind text, p_since_s double precision, p_sample integer)
RETURNS TABLE (kind text, runs bigint, completed bigint, failures bigint, crashes bigint,
               timeouts bigint, wall_p50 double precision, wall_p95 double precision,
               cpu_p50 double precision, cpu_p95 double precision, rss_p50 double precision,
               rss_p95 double precision, rss_max double precision, last_finished_at timestamptz,
               sampled bigint)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH live AS (
        -- earlier attempts of jobs not terminal yet
        SELECT j.kind, e ->> 'outcome' AS outcome,
               (e ->> 'wall_seconds')::double precision AS wall_s,
               (e ->> 'cpu_seconds')::double precision AS cpu_s,
               (e ->> 'peak_rss_bytes')::double precision AS peak_rss,
               (e ->> 'finished_at')::timestamptz AS finished_at
          FROM (SELECT h.kind, h.attempt_log FROM awa.jobs_hot h WHERE h.attempt_log IS NOT NULL
                UNION ALL
                SELECT d.kind, d.attempt_log FROM awa.jobs_deferred d WHERE d.attempt_log IS NOT NULL) j
         CROSS JOIN LATERAL jsonb_array_elements(j.attempt_log) AS e
         WHERE jsonb_typeof(j.attempt_log) = 'array'
           AND (p_kind IS NULL OR j.kind = p_kind)
           AND (p_since_s IS NULL
                OR (e ->> 'finished_at')::timestamptz > now() - make_interval(secs => p_since_s))
    ),
    counted AS (
        SELECT c.kind, sum(c.runs) AS runs, sum(c.ok) AS completed, sum(c.failures) AS failures,
               sum(c.crashes) AS crashes, sum(c.timeouts) AS timeouts
          FROM awa.done_kinds c
         WHERE (p_kind IS NULL OR c.kind = p_kind)
           AND (p_since_s IS NULL OR c.minute >= date_trunc('minute', now() - make_interval(secs => p_since_s)))
         GROUP BY c.kind
        UNION ALL
        SELECT l.kind, count(*), count(*) FILTER (WHERE l.outcome = 'completed'),
               count(*) FILTER (WHERE l.outcome IN ('failed', 'fatal', 'retry', 'lost', 'deadline',
                                                    'callback_timeout')),
               count(*) FILTER (WHERE l.outcome = 'crash'), count(*) FILTER (WHERE l.outcome = 'timeout')
          FROM live l
         GROUP BY l.kind
    ),
    totals AS (
        SELECT t.kind, sum(t.runs)::bigint AS runs, sum(t.completed)::bigint AS completed,
               sum(t.failures)::bigint AS failures, sum(t.crashes)::bigint AS crashes,
               sum(t.timeouts)::bigint AS timeouts
          FROM counted t
         GROUP BY t.kind
        HAVING sum(t.runs) > 0
    ),
    picked AS (
        -- each kind's latest p_sample finished jobs (in the window)
        SELECT d.*
          FROM totals k
         CROSS JOIN LATERAL (
            SELECT x.kind, x.state, x.errors, x.attempt_log, x.attempted_at, x.finalized_at,
                   x.wall_s, x.cpu_s, x.peak_rss
              FROM awa.jobs_done x
             WHERE x.kind = k.kind
               AND (p_since_s IS NULL OR x.finalized_at > now() - make_interval(secs => p_since_s))
             ORDER BY x.finalized_at DESC
             LIMIT p_sample) d
    ),
    attempts AS (
        SELECT p.kind,
               CASE WHEN p.state = 'failed' THEN coalesce(p.errors -> -1 ->> 'kind', 'failed')
                    WHEN p.state = 'cancelled' THEN 'cancel'
                    ELSE p.state::text END AS outcome,
               p.wall_s::double precision AS wall_s, p.cpu_s::double precision AS cpu_s,
               p.peak_rss::double precision AS peak_rss, p.finalized_at AS finished_at
          FROM picked p
         WHERE p.attempted_at IS NOT NULL AND (p.wall_s IS NOT NULL OR p.state = 'failed')
        UNION ALL
        SELECT p.kind, e ->> 'outcome', (e ->> 'wall_seconds')::double precision,
               (e ->> 'cpu_seconds')::double precision, (e ->> 'peak_rss_bytes')::double precision,
               (e ->> 'finished_at')::timestamptz
          FROM picked p
         CROSS JOIN LATERAL jsonb_array_elements(p.attempt_log) AS e
         WHERE p.attempt_log IS NOT NULL AND jsonb_typeof(p.attempt_log) = 'array'
        UNION ALL
        SELECT l.kind, l.outcome, l.wall_s, l.cpu_s, l.peak_rss, l.finished_at FROM live l
    ),
    figures AS (
        SELECT a.kind,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY a.wall_s) FILTER (WHERE m.measured) AS wall_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.wall_s) FILTER (WHERE m.measured) AS wall_p95,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY a.cpu_s) FILTER (WHERE m.measured) AS cpu_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.cpu_s) FILTER (WHERE m.measured) AS cpu_p95,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY a.peak_rss) FILTER (WHERE m.measured) AS rss_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.peak_rss) FILTER (WHERE m.measured) AS rss_p95,
               max(a.peak_rss) AS rss_max,
               max(a.finished_at) AS last_finished_at
          FROM attempts a
         CROSS JOIN LATERAL (SELECT a.outcome NOT IN ('crash', 'timeout', 'lost', 'deadline', 'interrupted',
                                                      'callback_timeout', 'released') AS measured) m
         GROUP BY a.kind
    )
    SELECT t.kind, t.runs, t.completed, t.failures, t.crashes, t.timeouts,
           f.wall_p50, f.wall_p95, f.cpu_p50, f.cpu_p95, f.rss_p50, f.rss_p95, f.rss_max,
           f.last_finished_at, (SELECT count(*) FROM picked p WHERE p.kind = t.kind)
      FROM totals t
      LEFT JOIN figures f ON f.kind = t.kind
     ORDER BY t.kind;
END $$;

-- The smallest job id created at or after p_at (NULL when every job is
-- older), by binary search on the ids: each step one probe of each job
-- table's id index. Ids follow creation (a job's id is taken by the
-- transaction that creates it), so an age filter becomes an id range and
-- list_jobs stops where the ages stop instead of reading every newer job.
CREATE FUNCTION awa.first_id_created_after(p_at timestamptz) RETURNS bigint
LANGUAGE plpgsql STABLE SET jit = off AS $$
DECLARE
    v_lo  bigint;
    v_hi  bigint;
    v_mid bigint;
    v_id  bigint;
    v_at  timestamptz;
BEGIN
    SELECT min(m) INTO v_lo FROM (SELECT min(h.id) AS m FROM awa.jobs_hot h
                                  UNION ALL SELECT min(d.id) FROM awa.jobs_deferred d
                                  UNION ALL SELECT min(x.id) FROM awa.jobs_done x) t;
    SELECT max(m) + 1 INTO v_hi FROM (SELECT max(h.id) AS m FROM awa.jobs_hot h
                                      UNION ALL SELECT max(d.id) FROM awa.jobs_deferred d
                                      UNION ALL SELECT max(x.id) FROM awa.jobs_done x) t;
    IF v_lo IS NULL THEN
        RETURN NULL;
    END IF;
    WHILE v_lo < v_hi LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        SELECT f.id, f.created_at INTO v_id, v_at FROM (
            (SELECT h.id, h.created_at FROM awa.jobs_hot h WHERE h.id >= v_mid ORDER BY h.id LIMIT 1)
            UNION ALL
            (SELECT d.id, d.created_at FROM awa.jobs_deferred d WHERE d.id >= v_mid ORDER BY d.id LIMIT 1)
            UNION ALL
            (SELECT x.id, x.created_at FROM awa.jobs_done x WHERE x.id >= v_mid ORDER BY x.id LIMIT 1)
        ) f ORDER BY f.id LIMIT 1;
        IF v_id IS NULL OR v_at >= p_at THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_id + 1;
        END IF;
        v_id := NULL;
    END LOOP;
    RETURN CASE WHEN v_lo >= (SELECT max(m) + 1 FROM (SELECT max(h.id) AS m FROM awa.jobs_hot h
                                                      UNION ALL SELECT max(d.id) FROM awa.jobs_deferred d
                                                      UNION ALL SELECT max(x.id) FROM awa.jobs_done x) t)
                THEN NULL ELSE v_lo END;
END $$;

-- grant_worker as in 0016, plus reading the counts.
CREATE OR REPLACE FUNCTION awa.grant_worker(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f regprocedure;
    t regclass;
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA awa TO %I', p_role);
    EXECUTE format('GRANT SELECT ON awa.schema_migrations, awa.jobs TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON awa.jobs_hot, awa.jobs_deferred, '
                   'awa.supervisors, awa.cron_fires TO %I', p_role);
    -- terminal history is added to and rotated, never deleted from, by a worker
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON awa.jobs_done, awa.queues, awa.cron_jobs, '
                   'awa.task_defaults TO %I', p_role);
    FOR t IN SELECT i.inhrelid::regclass FROM pg_inherits i WHERE i.inhparent = 'awa.jobs_done'::regclass LOOP
        EXECUTE format('GRANT SELECT, TRUNCATE ON %s TO %I', t, p_role);
    END LOOP;
    EXECUTE format('GRANT SELECT, UPDATE ON awa.done_ring TO %I', p_role);
    -- queue_stats() and kind_stats() read the history's counts
    EXECUTE format('GRANT SELECT ON awa.done_counts, awa.done_kinds TO %I', p_role);
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON awa.batches TO %I', p_role);
    EXECUTE format('GRANT SELECT, DELETE ON awa.unique_keys TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON awa.callbacks_retired TO %I', p_role);
    -- terminal transitions check for waiters; the leader forgets stale ones
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON awa.waiters TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.supervisors_id_seq TO %I', p_role);
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = 'awa'::regnamespace
                AND p.proname NOT IN ('grant_producer', 'grant_worker', 'revoke_privileges', 'require_role')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, p_role);
    END LOOP;
END $$;


-- Not for PUBLIC (0008). Roles granted as workers before this migration
-- may read the counts and call the new functions without a new grant.
REVOKE ALL ON FUNCTION awa.done_counts_sql(), awa.count_done(), awa.forget_done_counts(),
    awa.fold_done_counts(smallint), awa.queue_stats(),
    awa.kind_stats(text, double precision, integer), awa.first_id_created_after(timestamptz) FROM PUBLIC;
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
        EXECUTE format('GRANT SELECT ON awa.done_counts, awa.done_kinds TO %s', grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.done_counts_sql(), awa.count_done(), '
                       'awa.forget_done_counts(), awa.fold_done_counts(smallint), awa.queue_stats(), '
                       'awa.kind_stats(text, double precision, integer), '
                       'awa.first_id_created_after(timestamptz) TO %s', grantee);
    END LOOP;
END $$;
