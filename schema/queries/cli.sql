-- Checks the command line makes before acting.

-- name: queue_known
-- A queue is known when it has a row in awa.queues (every queue a
-- supervisor served, or an operator paused, has one), when a live
-- supervisor serves it, or when any job (live or retained) names it.
SELECT EXISTS (SELECT 1 FROM awa.queues q WHERE q.name = %(name)s)
    OR EXISTS (SELECT 1 FROM awa.supervisors s
                WHERE s.stopped_at IS NULL AND %(name)s = ANY (s.queues))
    OR EXISTS (SELECT 1 FROM awa.jobs_hot h WHERE h.queue = %(name)s)
    OR EXISTS (SELECT 1 FROM awa.jobs_deferred d WHERE d.queue = %(name)s)
    OR EXISTS (SELECT 1 FROM awa.jobs_done x WHERE x.queue = %(name)s)

-- name: metrics_session
-- The short-lived connection that refreshes the queue gauges of /metrics
-- must never hang a scrape. LOCAL: for this transaction only, so that
-- through a transaction-mode pooler the timeout does not stay behind on a
-- server session other clients share.
SET LOCAL statement_timeout = '5s'
