-- Queue reads that stay flat as the backlog and the throughput grow
-- (issue 23).
--
-- queue_stats() and queue_depth() counted the live tables in full on every
-- call: 3 ms with an empty queue, 60 ms with 200,000 available jobs, 0.3 s
-- with a million, 1.2 s with five (the dashboard's overview 3.8 s). The
-- dashboard, `awa-pool queues`, `top` and every Prometheus scrape paid
-- that, and paid it most in an outage's backlog. Counting each claim,
-- completion and enqueue instead would cost every job (and one-job
-- transactions most), so the counts are kept the way awa keeps its own:
-- recounted by the leader.
--
-- * awa.live_census holds the live jobs per queue and state (and the
--   oldest available job's run_at) as of one snapshot; the leader retakes
--   it (awa.take_live_census) every awa.census_period_s of its last
--   duration: 2 s, or 25 times what the count took, so the recount never
--   takes more than 4 % of the leader's time however deep the backlog
--   (0.34 s every 8.4 s at a million live jobs, 1.5 s every 38 s at
--   5.5 million, on a 2-vCPU VM).
-- * awa.live_counts() is what the readers call: while the census found
--   fewer than exact_below live jobs (100,000 unless an operator sets
--   another), or no leader keeps it fresh, it counts now, in full, as
--   before; above that it reads the census and says how old it is.
--
-- queue_stats()' jobs finished in the last 10 and 60 seconds were counted
-- from the history's (queue, state, finalized_at) index: at 20,000 jobs/s
-- that is 1.2 million entries, and queue_stats() took 0.4 s while a
-- backlog drained. awa.recent_finishes() reads at most the newest
-- p_cap (10,000) of them: below that the counts are exact, above it an
-- estimate from the rate at which those finished.

CREATE TABLE awa.live_census (
    queue  text   NOT NULL,
    state  text   NOT NULL,
    jobs   bigint NOT NULL,
    oldest timestamptz,         -- the oldest available job's run_at
    CONSTRAINT live_census_pkey PRIMARY KEY (queue, state)
);

CREATE TABLE awa.live_census_meta (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    counted_at  timestamptz,    -- when the census's snapshot was taken
    took_s      double precision,
    jobs        bigint,         -- its total
    exact_below bigint NOT NULL DEFAULT 100000 CHECK (exact_below >= 0)
);
INSERT INTO awa.live_census_meta DEFAULT VALUES;

-- How long to wait before the next census, given what the last one took.
CREATE FUNCTION awa.census_period_s(p_took_s double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(2.0, 25.0 * coalesce(p_took_s, 0.0))
$$;

-- The live tables' jobs per queue and state, counted now in one snapshot
-- (p_queues NULL: every queue).
CREATE FUNCTION awa.count_live(p_queues text[])
RETURNS TABLE (queue text, state text, jobs bigint, oldest timestamptz)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    RETURN QUERY
    SELECT h.queue, h.state::text, count(*), min(h.run_at) FILTER (WHERE h.state = 'available')
      FROM awa.jobs_hot h
     WHERE p_queues IS NULL OR h.queue = ANY (p_queues)
     GROUP BY 1, 2
    UNION ALL
    SELECT d.queue, d.state::text, count(*), NULL::timestamptz
      FROM awa.jobs_deferred d
     WHERE p_queues IS NULL OR d.queue = ANY (p_queues)
     GROUP BY 1, 2;
END $$;

-- Retake the census; returns seconds until the next one is due. The lock
-- on the meta row makes concurrent calls take turns.
CREATE FUNCTION awa.take_live_census() RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_started timestamptz;
    v_took    double precision;
BEGIN
    PERFORM 1 FROM awa.live_census_meta FOR UPDATE;
    v_started := clock_timestamp();
    DELETE FROM awa.live_census;
    INSERT INTO awa.live_census (queue, state, jobs, oldest)
    SELECT c.queue, c.state, c.jobs, c.oldest FROM awa.count_live(NULL) c;
    v_took := extract(epoch FROM clock_timestamp() - v_started);
    UPDATE awa.live_census_meta
       SET counted_at = v_started, took_s = v_took,
           jobs = (SELECT coalesce(sum(c.jobs), 0) FROM awa.live_census c);
    RETURN awa.census_period_s(v_took);
END $$;

-- Live jobs per queue and state for the readers, and the age of the counts
-- in seconds (0: counted by this call). The census is read only when it is
-- big enough to be worth it and fresh (three periods and 10 s of slack for
-- a busy leader); otherwise the tables are counted now.
CREATE FUNCTION awa.live_counts(p_queues text[])
RETURNS TABLE (queue text, state text, jobs bigint, oldest timestamptz, age_s double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m awa.live_census_meta;
BEGIN
    SELECT * INTO m FROM awa.live_census_meta;
    IF m.counted_at IS NOT NULL AND m.jobs >= m.exact_below
       AND m.counted_at > statement_timestamp()
                          - make_interval(secs => 3 * awa.census_period_s(m.took_s) + 10) THEN
        RETURN QUERY
        SELECT c.queue, c.state, c.jobs, c.oldest,
               greatest(0, extract(epoch FROM statement_timestamp() - m.counted_at))::double precision
          FROM awa.live_census c
         WHERE p_queues IS NULL OR c.queue = ANY (p_queues);
    ELSE
        RETURN QUERY
        SELECT c.queue, c.state, c.jobs, c.oldest, 0.0::double precision FROM awa.count_live(p_queues) c;
    END IF;
END $$;

-- Jobs of a queue that reached a terminal state in the last 10 and 60
-- seconds, reading at most its newest p_cap of them: exact below p_cap.
-- Above, the rate at which those p_cap finished, times the time from the
-- window's first finish (one index probe per state) to the newest: a
-- drain that began 3 s ago counts 3 s of it, not 10, and one that ended
-- 5 s ago is not counted on into the quiet since. (The 10 s count stays
-- exact while those p_cap reach back 10 s or more.) The windows end at
-- the statement's start, not the transaction's, so that every finish the
-- statement sees is inside them.
CREATE FUNCTION awa.recent_finishes(p_queue text, p_cap integer)
RETURNS TABLE (finished_10s bigint, finished_60s bigint)
LANGUAGE sql STABLE AS $$
WITH states AS (
    SELECT s.state FROM unnest(ARRAY['completed', 'failed', 'cancelled']::awa.job_state[]) AS s (state)
),
newest AS (
    SELECT f.finalized_at
      FROM states s
     CROSS JOIN LATERAL (
        SELECT x.finalized_at FROM awa.jobs_done x
         WHERE x.queue = p_queue AND x.state = s.state
           AND x.finalized_at > statement_timestamp() - interval '60 seconds'
         ORDER BY x.finalized_at DESC
         LIMIT p_cap) f
     ORDER BY f.finalized_at DESC
     LIMIT p_cap
),
seen AS (
    SELECT count(*) AS n, min(w.finalized_at) AS oldest, max(w.finalized_at) AS latest,
           count(*) FILTER (WHERE w.finalized_at > statement_timestamp() - interval '10 seconds') AS n10,
           greatest(extract(epoch FROM max(w.finalized_at) - min(w.finalized_at)), 0.001) AS span_s
      FROM newest w
),
first AS (
    SELECT min(f.at) AS first_at
      FROM states s
     CROSS JOIN LATERAL (
        SELECT x.finalized_at AS at FROM awa.jobs_done x
         WHERE x.queue = p_queue AND x.state = s.state
           AND x.finalized_at > statement_timestamp() - interval '60 seconds'
         ORDER BY x.finalized_at
         LIMIT 1) f
)
SELECT CASE WHEN n < p_cap OR oldest <= statement_timestamp() - interval '10 seconds' THEN n10
            ELSE greatest(n, round(n * extract(epoch FROM latest - greatest(first_at, statement_timestamp()
                                                                   - interval '10 seconds')) / span_s)) END::bigint,
       CASE WHEN n < p_cap THEN n
            ELSE greatest(n, round(n * extract(epoch FROM latest - first_at) / span_s)) END::bigint
  FROM seen, first
$$;

-- queue_stats() as in 0019, its live part from live_counts(), its recent
-- finishes from recent_finishes(), and the counts' age as a column.
DROP FUNCTION awa.queue_stats();
CREATE FUNCTION awa.queue_stats()
RETURNS TABLE (queue text, available bigint, running bigint, scheduled bigint, retryable bigint,
               waiting_external bigint, completed bigint, failed bigint, cancelled bigint,
               finished_10s bigint, finished_60s bigint, lag_s double precision, paused boolean,
               counts_age_s double precision)
LANGUAGE sql STABLE SET jit = off AS $$
WITH live AS (
    SELECT c.queue, c.state, c.jobs AS n, c.oldest, c.age_s FROM awa.live_counts(NULL) c
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
),
recent AS (
    SELECT n.name, r.finished_10s, r.finished_60s
      FROM names n CROSS JOIN LATERAL awa.recent_finishes(n.name, 10000) r
)
SELECT n.name,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'available'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'running'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'scheduled'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'retryable'), 0)::bigint,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'waiting_external'), 0)::bigint,
       coalesce(min(d.completed), 0), coalesce(min(d.failed), 0), coalesce(min(d.cancelled), 0),
       coalesce(min(r.finished_10s), 0), coalesce(min(r.finished_60s), 0),
       greatest(0, coalesce(extract(epoch FROM now() - min(l.oldest)), 0))::double precision,
       coalesce(bool_or(q.paused), false),
       (SELECT coalesce(max(a.age_s), 0) FROM live a)::double precision
  FROM names n
  LEFT JOIN live l ON l.queue = n.name
  LEFT JOIN done d ON d.queue = n.name
  LEFT JOIN awa.queues q ON q.name = n.name
  LEFT JOIN recent r ON r.name = n.name
 GROUP BY n.name
 ORDER BY n.name
$$;

-- Not for PUBLIC (0008). Every role that could read queue_stats() before
-- may still, and may keep the census (a worker's leader does).
REVOKE ALL ON FUNCTION awa.census_period_s(double precision), awa.count_live(text[]),
    awa.take_live_census(), awa.live_counts(text[]), awa.recent_finishes(text, integer),
    awa.queue_stats() FROM PUBLIC;
DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'awa.kind_stats(text, double precision, integer)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.census_period_s(double precision), '
                       'awa.count_live(text[]), awa.take_live_census(), awa.live_counts(text[]), '
                       'awa.recent_finishes(text, integer), awa.queue_stats() TO %s', grantee);
    END LOOP;
END $$;
