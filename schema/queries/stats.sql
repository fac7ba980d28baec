-- Operator statistics behind queue_stats(), `awa-pool queues`, `kinds`, `top`
-- and the Prometheus queue gauges. Read-only. None reads all of terminal
-- history: its totals are kept in awa.done_counts and awa.done_kinds
-- (migration 0019), the recent throughput reads the last minute of the
-- (queue, state, finalized_at) index, and per-kind percentiles read a
-- bounded sample.

-- name: queue_stats
-- One row per known queue (schema: awa.queue_stats, migration 0019):
-- counts per state, finished_10s / finished_60s (jobs that reached a
-- terminal state in the last 10 and 60 seconds), lag_s (age of the oldest
-- available job, 0 when none), paused and counts_age_s (how old the live
-- counts are: 0 when counted now, above a big backlog the age of the
-- leader's census). Terminal counts come from the history's running
-- counts, so the cost grows neither with history nor with the backlog.
-- The queue's policy (awa.queues) comes with it.
SELECT s.*, q.rate_per_s, q.dlq, coalesce(q.shards, 1) AS shards, q.global_max
  FROM awa.queue_stats() s LEFT JOIN awa.queues q ON q.name = s.queue
 ORDER BY s.queue

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
-- Per kind (schema: awa.kind_stats, migration 0019): counts over every
-- attempt on record, percentiles over each kind's latest %(sample)s
-- finished jobs; with since_s, both only what finished in that window.
SELECT * FROM awa.kind_stats(%(kind)s, %(since_s)s, %(sample)s)

-- name: queue_depth
-- Live jobs per queue and state (awa.live_counts, migration 0025): the hot
-- and deferred tables counted now, or the leader's census of them above a
-- backlog of 100,000 live jobs, never the terminal history, so an
-- autoscaler or a health check can poll it every second however deep the
-- backlog. A NULL list means every queue. age_s: how old the counts are.
SELECT c.queue, c.state, c.jobs, c.age_s FROM awa.live_counts(%(queues)s::text[]) c
