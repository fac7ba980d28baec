-- The web dashboard's reads (awa_pool/dashboard/reads.py). Every statement
-- here is bounded by an index: the pages must stay fast with a million rows
-- of terminal history (awa.jobs_done) and a hundred thousand queued jobs.
-- Filters are NULL when unused; psycopg2 sends values as literals, so the
-- planner drops the unused branches and picks the index per call.

-- name: dash_jobs_page
-- One page of jobs, newest first, after the keyset cursor (id < before).
-- Each table is asked for its own newest page, so each can take its best
-- index; a state filter skips the tables that cannot hold that state.
--   hot       the redundant "available OR running" lets a queue filter use
--             the claim index (available rows) and the running index
--             together, instead of walking every live row by id
--   history   `queues` lists every queue with terminal history when a
--             terminal state is asked for without a queue: a no-op for the
--             result, but a rare state then uses the (queue, state,
--             finalized_at) index instead of walking a million ids
-- An age filter also arrives as an id range (id_below, id_from: see
-- reads.jobs_page_params), so the id indexes stop where the ages stop.
SELECT * FROM (
  (SELECT h.id, h.kind, h.queue, h.state::text AS state, h.priority, h.attempt, h.max_attempts,
       h.run_at, h.created_at, h.finalized_at, h.tags, h.dead_lettered,
       left(h.args::text, 160) AS args_preview, h.errors -> -1 ->> 'error' AS last_error
     FROM awa.jobs_hot h
    WHERE (%(state)s::text IS NULL OR %(state)s::text IN ('available', 'running'))
      AND (h.state = 'available' OR h.state = 'running')
      AND (%(before)s::bigint IS NULL OR h.id < %(before)s::bigint)
      AND (%(state)s::text IS NULL OR h.state = %(state)s::awa.job_state)
      AND (%(queue)s::text IS NULL OR h.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR h.kind = %(kind)s::text)
      AND (%(tag)s::text IS NULL OR h.tags @> ARRAY[%(tag)s::text])
      AND (%(older_than_s)s::double precision IS NULL
           OR h.created_at < now() - make_interval(secs => %(older_than_s)s::double precision))
      AND (%(newer_than_s)s::double precision IS NULL
           OR h.created_at >= now() - make_interval(secs => %(newer_than_s)s::double precision))
      AND (%(id_below)s::bigint IS NULL OR h.id < %(id_below)s::bigint)
      AND (%(id_from)s::bigint IS NULL OR h.id >= %(id_from)s::bigint)
    ORDER BY h.id DESC
    LIMIT %(limit)s)
  UNION ALL
  (SELECT d.id, d.kind, d.queue, d.state::text AS state, d.priority, d.attempt, d.max_attempts,
       d.run_at, d.created_at, d.finalized_at, d.tags, d.dead_lettered,
       left(d.args::text, 160) AS args_preview, d.errors -> -1 ->> 'error' AS last_error
     FROM awa.jobs_deferred d
    WHERE (%(state)s::text IS NULL OR %(state)s::text IN ('scheduled', 'retryable', 'waiting_external'))
      AND (%(before)s::bigint IS NULL OR d.id < %(before)s::bigint)
      AND (%(state)s::text IS NULL OR d.state = %(state)s::awa.job_state)
      AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR d.kind = %(kind)s::text)
      AND (%(tag)s::text IS NULL OR d.tags @> ARRAY[%(tag)s::text])
      AND (%(older_than_s)s::double precision IS NULL
           OR d.created_at < now() - make_interval(secs => %(older_than_s)s::double precision))
      AND (%(newer_than_s)s::double precision IS NULL
           OR d.created_at >= now() - make_interval(secs => %(newer_than_s)s::double precision))
      AND (%(id_below)s::bigint IS NULL OR d.id < %(id_below)s::bigint)
      AND (%(id_from)s::bigint IS NULL OR d.id >= %(id_from)s::bigint)
    ORDER BY d.id DESC
    LIMIT %(limit)s)
  UNION ALL
  (SELECT x.id, x.kind, x.queue, x.state::text AS state, x.priority, x.attempt, x.max_attempts,
       x.run_at, x.created_at, x.finalized_at, x.tags, x.dead_lettered,
       left(x.args::text, 160) AS args_preview, x.errors -> -1 ->> 'error' AS last_error
     FROM awa.jobs_done x
    WHERE (%(state)s::text IS NULL OR %(state)s::text IN ('completed', 'failed', 'cancelled'))
      AND (%(queues)s::text[] IS NULL OR x.queue = ANY(%(queues)s::text[]))
      AND (%(before)s::bigint IS NULL OR x.id < %(before)s::bigint)
      AND (%(state)s::text IS NULL OR x.state = %(state)s::awa.job_state)
      AND (%(queue)s::text IS NULL OR x.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR x.kind = %(kind)s::text)
      AND (%(tag)s::text IS NULL OR x.tags @> ARRAY[%(tag)s::text])
      AND (%(older_than_s)s::double precision IS NULL
           OR x.created_at < now() - make_interval(secs => %(older_than_s)s::double precision))
      AND (%(newer_than_s)s::double precision IS NULL
           OR x.created_at >= now() - make_interval(secs => %(newer_than_s)s::double precision))
      AND (%(id_below)s::bigint IS NULL OR x.id < %(id_below)s::bigint)
      AND (%(id_from)s::bigint IS NULL OR x.id >= %(id_from)s::bigint)
    ORDER BY x.id DESC
    LIMIT %(limit)s)
) page
ORDER BY page.id DESC
LIMIT %(limit)s

-- name: dash_queue_names
-- Queue names for the jobs page: every queue with a settings row or with
-- terminal history (a skip scan of the (queue, state, finalized_at) index,
-- one probe per queue). Cheap, unlike counting the live tables.
WITH RECURSIVE done_names AS (
    (SELECT x.queue FROM awa.jobs_done x ORDER BY x.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT x.queue FROM awa.jobs_done x WHERE x.queue > n.queue ORDER BY x.queue LIMIT 1)
      FROM done_names n
     WHERE n.queue IS NOT NULL
)
SELECT n.queue AS name FROM done_names n WHERE n.queue IS NOT NULL
UNION
SELECT q.name FROM awa.queues q
ORDER BY 1

-- name: dash_first_younger
-- The smallest job id created less than age_s seconds ago, found by binary
-- search over the id indexes (ids follow creation order): about 20 probes
-- of one row each, in one statement. NULL when every job is older.
WITH RECURSIVE search AS (
    SELECT min(j.id) AS low, max(j.id) AS high, NULL::bigint AS found FROM awa.jobs j
    UNION ALL
    SELECT CASE WHEN p.id IS NULL OR p.young THEN s.low ELSE p.id + 1 END,
           CASE WHEN p.id IS NULL OR p.young THEN (s.low + s.high) / 2 - 1 ELSE s.high END,
           CASE WHEN p.young THEN p.id ELSE s.found END
      FROM search s
      LEFT JOIN LATERAL (
          SELECT j.id, j.created_at > now() - make_interval(secs => %(age_s)s::double precision) AS young
            FROM awa.jobs j
           WHERE j.id >= (s.low + s.high) / 2
           ORDER BY j.id
           LIMIT 1) p ON true
     WHERE s.low <= s.high
)
SELECT s.found FROM search s WHERE s.low > s.high

-- name: dash_live_matching
-- The not-yet-terminal jobs a cancel-by-filter selects: how many, and the
-- highest id among them; with `cancel`, also cancels those up to max_id
-- through awa.cancel_job (the path of a single cancel) and counts them.
-- The confirmation page counts without cancelling; the action then stops
-- at the id the operator saw, so jobs enqueued since are left alone.
WITH matching AS (
    SELECT j.id
      FROM (SELECT id, queue, kind, tags, state, created_at FROM awa.jobs_hot
            UNION ALL
            SELECT id, queue, kind, tags, state, created_at FROM awa.jobs_deferred) j
     WHERE (%(max_id)s::bigint IS NULL OR j.id <= %(max_id)s::bigint)
       AND (%(state)s::text IS NULL OR j.state = %(state)s::awa.job_state)
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
       AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
       AND (%(tag)s::text IS NULL OR j.tags @> ARRAY[%(tag)s::text])
       AND (%(older_than_s)s::double precision IS NULL
            OR j.created_at < now() - make_interval(secs => %(older_than_s)s::double precision))
       AND (%(newer_than_s)s::double precision IS NULL
            OR j.created_at >= now() - make_interval(secs => %(newer_than_s)s::double precision))
),
cancelled AS (
    SELECT awa.cancel_job(m.id, %(reason)s) AS state FROM matching m WHERE %(cancel)s
)
SELECT (SELECT count(*) FROM matching) AS n,
       (SELECT max(m.id) FROM matching m) AS max_id,
       (SELECT count(*) FROM cancelled c WHERE c.state = 'cancelled') AS cancelled

-- name: dash_throughput
-- Jobs that reached a terminal state per minute since `since` (epoch
-- seconds, a minute boundary), per queue and state, read from the (queue,
-- state, finalized_at) index. throughput.py keeps the closed minutes, so the
-- overview's refresh usually reads only the current one.
SELECT x.queue, x.state::text AS state,
       extract(epoch FROM date_trunc('minute', x.finalized_at))::double precision AS minute_start,
       count(*) AS n
  FROM awa.jobs_done x
 WHERE x.queue = ANY(%(queues)s::text[])
   AND x.state IN ('completed', 'failed', 'cancelled')
   AND x.finalized_at >= to_timestamp(%(since)s::double precision)
 GROUP BY 1, 2, 3

-- name: dash_job_extra
-- What the job page shows beyond JobRecord: lease, owner, deadline and the
-- callback's state.
SELECT j.lease, j.supervisor_id, j.deadline, j.timeout_s, j.callback_timeout_at,
       j.callback_result, j.lane
  FROM awa.jobs j
 WHERE j.id = %(id)s
 LIMIT 1

-- name: dash_batch
-- A batch: its size, how many members are not terminal yet, its follow-up.
SELECT b.id, b.total, b.remaining, b.then_id, b.created_at, b.done_at
  FROM awa.batches b
 WHERE b.id = %(batch_id)s

-- name: dash_batch_members
-- Finished and deferred members of a batch, by id (both tables have a
-- batch_id index). The hot table has none, and a page view is no reason to
-- slow the claim path with one: available and running members are counted
-- from the batch's total instead.
SELECT m.id, m.state::text AS state, m.kind
  FROM (SELECT d.id, d.state, d.kind FROM awa.jobs_done d WHERE d.batch_id = %(batch_id)s
        UNION ALL
        SELECT f.id, f.state, f.kind FROM awa.jobs_deferred f WHERE f.batch_id = %(batch_id)s) m
 ORDER BY m.id
 LIMIT %(limit)s

-- name: dash_clock
-- The database's clock (slices of time are judged on it, not the host's).
SELECT extract(epoch FROM now())::double precision

-- name: dash_kind_counts
-- Every kind's exact counts per slice of time from `since` (epoch seconds)
-- to now, slices `width_s` long (whole minutes) and aligned to the epoch,
-- from the history's running counts (awa.done_kinds, kept by triggers; no
-- history row is read): one row per kind and slice in which it finished
-- jobs, ordered by kind. The rules are kind_stats' (`awa-pool kinds`):
--   finished   jobs that reached a terminal state (run or not)
--   attempts   their attempts with an outcome (kind_stats' runs), earlier
--              attempts of a retried job counted in the slice it finished in
--   failures, crashes, timeouts   among those attempts
SELECT k.kind,
       extract(epoch FROM date_bin(make_interval(secs => %(width_s)s::double precision), k.minute,
                                   TIMESTAMPTZ 'epoch'))::double precision AS slot_start,
       sum(k.finished)::bigint AS finished, sum(k.runs)::bigint AS attempts,
       sum(k.failures)::bigint AS failures, sum(k.crashes)::bigint AS crashes,
       sum(k.timeouts)::bigint AS timeouts
  FROM awa.done_kinds k
 WHERE k.minute >= to_timestamp(%(since)s::double precision)
 GROUP BY 1, 2
HAVING sum(k.finished) > 0
 ORDER BY 1, 2

-- name: dash_kind_samples
-- The cost figures of one kind's latest `sample` final attempts in each of
-- `slices` slices from `since` (a bounded sample: a slice with a hundred
-- thousand runs costs as much to read as one with a hundred). Attempts
-- that crashed or timed out have no meaningful figures and are left out.
SELECT g AS slice, r.wall_s, r.cpu_s, r.peak_rss
  FROM generate_series(0, %(slices)s::int - 1) AS g
 CROSS JOIN LATERAL (
    SELECT x.wall_s::double precision AS wall_s, x.cpu_s::double precision AS cpu_s,
           x.peak_rss::double precision AS peak_rss
      FROM awa.jobs_done x
     WHERE x.kind = %(kind)s
       AND x.finalized_at >= to_timestamp(%(since)s::double precision + g * %(width_s)s::double precision)
       AND x.finalized_at < to_timestamp(%(since)s::double precision + (g + 1) * %(width_s)s::double precision)
       AND x.wall_s IS NOT NULL
       AND (x.state <> 'failed' OR x.errors -> -1 ->> 'kind' IN ('failed', 'fatal'))
     ORDER BY x.finalized_at DESC
     LIMIT %(sample)s
 ) r

-- name: dash_dlq_page
-- Dead-lettered jobs, newest first, after the keyset cursor.
SELECT d.id, d.kind, d.queue, d.attempt, d.max_attempts, d.created_at, d.finalized_at,
       left(d.args::text, 160) AS args_preview, d.errors -> -1 ->> 'error' AS last_error
  FROM awa.jobs_done d
 WHERE d.dead_lettered
   AND (%(before)s::bigint IS NULL OR d.id < %(before)s::bigint)
   AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
   AND (%(kind)s::text IS NULL OR d.kind = %(kind)s::text)
 ORDER BY d.id DESC
 LIMIT %(limit)s

-- name: dash_session_setup
-- Every dashboard connection: no page may hold the database for long, and
-- no page pays for JIT compilation (these queries are short; compiling the
-- plans of a partitioned history costs more than running them). Every page
-- is written to read through indexes; sequential scans are off so that the
-- planner cannot judge a small history cheaper to read whole and keep that
-- plan as it grows (PostgreSQL 18 did, for the skip scan over kinds).
SET statement_timeout = '10s';
SET jit = off;
SET enable_seqscan = off

-- name: dash_dlq_count
-- How many dead-lettered jobs a retry-all or purge-all would touch.
SELECT count(*) FROM awa.jobs_done d
 WHERE d.dead_lettered
   AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
   AND (%(kind)s::text IS NULL OR d.kind = %(kind)s::text)

-- name: dash_job_state
SELECT j.state::text FROM awa.jobs j WHERE j.id = %(id)s LIMIT 1

-- name: dash_ping
-- A kept connection is checked before a request uses it (the server may
-- have restarted since): a broken one is replaced instead of failing a page.
SELECT 1
