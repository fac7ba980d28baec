-- Operator statistics behind queue_stats(), `awa-pool queues`, `kinds`, `top`
-- and the Prometheus queue gauges. Read-only. Terminal history (awa.jobs_done)
-- is read only through its (queue, state, finalized_at) index: the recent
-- throughput reads the last minute of it, the per-state totals an
-- index-only count of each queue's retained rows.

-- name: queue_stats
-- One row per known queue: a queue with live jobs, with a row in awa.queues
-- (every served or paused queue has one) or with terminal history. Live
-- counts come from the hot and deferred tables, terminal ones from
-- awa.jobs_done through its (queue, state, finalized_at) index;
-- finished_10s / finished_60s are jobs that reached a terminal state in the
-- last 10 and 60 seconds; lag_s is the age of the oldest available job (0
-- when none). With retained_totals false, completed and cancelled are NULL
-- (not counted: that reads every retained row of the queue's history).
WITH RECURSIVE done_names AS (
    (SELECT x.queue FROM awa.jobs_done x ORDER BY x.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT x.queue FROM awa.jobs_done x WHERE x.queue > n.queue ORDER BY x.queue LIMIT 1)
      FROM done_names n
     WHERE n.queue IS NOT NULL
),
live AS (
    SELECT h.queue, h.state::text AS state, count(*) AS n,
           min(h.run_at) FILTER (WHERE h.state = 'available') AS oldest
      FROM awa.jobs_hot h
     GROUP BY 1, 2
    UNION ALL
    SELECT d.queue, d.state::text, count(*), NULL
      FROM awa.jobs_deferred d
     GROUP BY 1, 2
),
names AS (
    SELECT l.queue AS name FROM live l
    UNION
    SELECT q.name FROM awa.queues q
    UNION
    SELECT n.queue FROM done_names n WHERE n.queue IS NOT NULL
)
SELECT n.name AS queue,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'available'), 0)::bigint AS available,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'running'), 0)::bigint AS running,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'scheduled'), 0)::bigint AS scheduled,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'retryable'), 0)::bigint AS retryable,
       coalesce(sum(l.n) FILTER (WHERE l.state = 'waiting_external'), 0)::bigint AS waiting_external,
       CASE WHEN %(retained_totals)s THEN (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state = 'completed') END AS completed,
       (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state = 'failed') AS failed,
       CASE WHEN %(retained_totals)s THEN (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state = 'cancelled') END AS cancelled,
       (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state IN ('completed', 'failed', 'cancelled')
           AND x.finalized_at > now() - interval '10 seconds') AS finished_10s,
       (SELECT count(*) FROM awa.jobs_done x
         WHERE x.queue = n.name AND x.state IN ('completed', 'failed', 'cancelled')
           AND x.finalized_at > now() - interval '60 seconds') AS finished_60s,
       greatest(0, coalesce(extract(epoch FROM now() - min(l.oldest)), 0))::double precision AS lag_s,
       coalesce(bool_or(q.paused), false) AS paused
  FROM names n
  LEFT JOIN live l ON l.queue = n.name
  LEFT JOIN awa.queues q ON q.name = n.name
 GROUP BY n.name
 ORDER BY n.name

-- name: live_supervisors
-- Supervisors that heartbeat recently and have not stopped, with the stats
-- each writes on every heartbeat (children, busy, idle, counters, rss...).
SELECT s.id, s.hostname, s.pid, s.version, s.queues, s.workers, s.started_at,
       s.is_leader, s.stats,
       extract(epoch FROM now() - s.heartbeat_at)::double precision AS heartbeat_age_s
  FROM awa.supervisors s
 WHERE s.stopped_at IS NULL
   AND s.heartbeat_at > now() - make_interval(secs => %(stale_s)s)
 ORDER BY s.hostname, s.pid, s.id

-- name: kind_stats
-- Per kind, over every attempt still on record: the final attempt of each
-- terminal job (its wall_s/cpu_s/peak_rss columns; the outcome of a failed
-- job is the kind of its last error) plus the earlier attempts kept in
-- attempt_log. Percentiles only use attempts whose handler returned or
-- raised: a crashed, timed-out or lost attempt has no meaningful figures.
WITH attempts AS (
    SELECT d.kind,
           CASE WHEN d.state = 'failed' THEN coalesce(d.errors -> -1 ->> 'kind', 'failed')
                WHEN d.state = 'cancelled' THEN 'cancel'
                ELSE d.state::text END AS outcome,
           d.wall_s::double precision AS wall_s, d.cpu_s::double precision AS cpu_s,
           d.peak_rss::double precision AS peak_rss, d.finalized_at AS finished_at
      FROM awa.jobs_done d
     WHERE d.attempted_at IS NOT NULL
       AND (d.wall_s IS NOT NULL OR d.state = 'failed')
    UNION ALL
    SELECT j.kind, e ->> 'outcome',
           (e ->> 'wall_seconds')::double precision, (e ->> 'cpu_seconds')::double precision,
           (e ->> 'peak_rss_bytes')::double precision, (e ->> 'finished_at')::timestamptz
      FROM awa.jobs j
     CROSS JOIN LATERAL jsonb_array_elements(j.attempt_log) AS e
     WHERE j.attempt_log IS NOT NULL AND jsonb_typeof(j.attempt_log) = 'array'
),
chosen AS (
    SELECT a.*,
           a.outcome NOT IN ('crash', 'timeout', 'lost', 'deadline', 'interrupted',
                             'callback_timeout', 'released') AS measured
      FROM attempts a
     WHERE (%(kind)s::text IS NULL OR a.kind = %(kind)s)
       AND (%(since_s)s::double precision IS NULL
            OR a.finished_at > now() - make_interval(secs => %(since_s)s::double precision))
)
SELECT kind,
       count(*) AS runs,
       count(*) FILTER (WHERE outcome = 'completed') AS completed,
       count(*) FILTER (WHERE outcome IN ('failed', 'fatal', 'retry', 'lost', 'deadline',
                                          'callback_timeout')) AS failures,
       count(*) FILTER (WHERE outcome = 'crash') AS crashes,
       count(*) FILTER (WHERE outcome = 'timeout') AS timeouts,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wall_s) FILTER (WHERE measured) AS wall_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wall_s) FILTER (WHERE measured) AS wall_p95,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY cpu_s) FILTER (WHERE measured) AS cpu_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY cpu_s) FILTER (WHERE measured) AS cpu_p95,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY peak_rss) FILTER (WHERE measured) AS rss_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY peak_rss) FILTER (WHERE measured) AS rss_p95,
       max(peak_rss) AS rss_max,
       max(finished_at) AS last_finished_at
  FROM chosen
 GROUP BY kind
 ORDER BY kind

-- name: queue_depth
-- Live jobs per queue and state, read from the hot and deferred tables
-- only (never the terminal history), so an autoscaler or a health check
-- can poll it every second. A NULL list means every queue.
SELECT live.queue, live.state::text, count(*)
  FROM (SELECT h.queue, h.state FROM awa.jobs_hot h
         WHERE %(queues)s::text[] IS NULL OR h.queue = ANY(%(queues)s::text[])
        UNION ALL
        SELECT d.queue, d.state FROM awa.jobs_deferred d
         WHERE %(queues)s::text[] IS NULL OR d.queue = ANY(%(queues)s::text[])) live
 GROUP BY 1, 2
