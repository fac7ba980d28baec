-- Leader-only maintenance (the leader's own session).

-- name: maintenance_session
-- The leader lock lives as long as this session. If the leader's host dies
-- or is cut off, the server must notice within seconds (not the kernel's
-- default two hours) so the lock is freed and another supervisor takes over:
-- server-side keepalives and a send timeout on this session only.
-- No JIT: maintenance scans big tables now and then, which the planner
-- costs past jit_above_cost, and compiling took longer than the scan itself
-- (124 of 177 ms on a 200,000-row history segment, see migration 0015).
SET synchronous_commit = off; SET lock_timeout = '2s'; SET statement_timeout = '60s'; SET jit = off;
SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3;
SET tcp_user_timeout = 10000

-- name: try_leader_lock
SELECT pg_try_advisory_lock(%(class)s, %(key)s)

-- name: mark_leader
UPDATE awa.supervisors
   SET is_leader = (id = %(id)s),
       leader_pid = CASE WHEN id = %(id)s THEN pg_backend_pid() END
 WHERE is_leader OR id = %(id)s

-- name: depose_frozen_leader
-- A leader frozen (SIGSTOP, a debugger, a paused VM) keeps its session and so
-- the lock, while rescue, promotion and cron stand still. When the leader's
-- supervisor has not heartbeated for stale_s, end its leader session: the
-- lock frees and a live supervisor takes over. Counted from the server's
-- start at the latest: after a restart no supervisor could heartbeat while
-- the server was down (as awa.rescue_lost, migration 0026).
SELECT pg_terminate_backend(s.leader_pid)
  FROM awa.supervisors s
  JOIN pg_locks l ON l.pid = s.leader_pid AND l.locktype = 'advisory' AND l.granted
                 AND l.classid = %(class)s::oid AND l.objid = %(key)s::oid AND l.objsubid = 2
 WHERE s.is_leader AND s.stopped_at IS NULL
   AND greatest(s.heartbeat_at, pg_postmaster_start_time()) < now() - make_interval(secs => %(stale_s)s)

-- name: promote_due
-- awa.promote_due is planned afresh on every call (0009), about 0.2 ms of
-- server CPU four times a second even when nothing is due; one probe of the
-- due index (its own predicate) first, and the function only when it finds a row.
SELECT CASE WHEN EXISTS (SELECT 1 FROM awa.jobs_deferred d
                          WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now())
            THEN awa.promote_due(%(limit)s) ELSE 0 END

-- name: rescue_lost
SELECT job_id, new_state::text FROM awa.rescue_lost(%(stale_s)s, %(limit)s, %(spare)s)

-- name: liveness_states
-- Each live supervisor: how many sessions hold its liveness lock (any
-- session of this database: pg_locks shows the whole server's), and does it
-- run jobs? pg_locks is read once for all of them.
WITH held AS MATERIALIZED (
    SELECT l.objid::bigint AS key, count(*) AS sessions
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %(class)s::oid AND l.objsubid = 2
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     GROUP BY l.objid
)
SELECT s.id,
       coalesce((SELECT h.sessions FROM held h WHERE h.key = s.id %% 2147483648), 0)::int,
       EXISTS (SELECT 1 FROM awa.jobs_hot h WHERE h.state = 'running' AND h.supervisor_id = s.id)
  FROM awa.supervisors s
 WHERE s.stopped_at IS NULL

-- name: rescue_supervisors
SELECT job_id, new_state::text FROM awa.rescue_supervisors(%(ids)s::bigint[], %(limit)s)

-- name: rescue_deadlines
SELECT job_id, new_state::text FROM awa.rescue_deadlines(%(grace_s)s, %(limit)s)

-- name: forget_supervisors
-- Rows of supervisors gone for long, once none of their jobs is running.
DELETE FROM awa.supervisors s
 WHERE (s.stopped_at < now() - make_interval(secs => %(after_s)s)
        OR s.heartbeat_at < now() - make_interval(secs => %(after_s)s))
   AND NOT EXISTS (SELECT 1 FROM awa.jobs_hot h
                    WHERE h.state = 'running' AND h.supervisor_id = s.id)

-- name: expire_callbacks
SELECT job_id, new_state::text FROM awa.expire_callbacks(%(limit)s)

-- name: expire_jobs
-- Jobs past their expiry that never started, cancelled: (queue, kind, jobs).
-- One probe of each partial index first: an idle leader does not call the
-- function (the WHERE is a one-time filter ahead of the function scan).
SELECT e.queue, e.kind, e.jobs
  FROM awa.expire_jobs(%(limit)s) e
 WHERE EXISTS (SELECT 1 FROM awa.jobs_hot h WHERE h.state = 'available' AND h.expires_at <= now())
    OR EXISTS (SELECT 1 FROM awa.jobs_deferred d
                WHERE d.state IN ('scheduled', 'retryable') AND d.expires_at <= now())

-- name: queue_table_dead_tuples
-- The counter itself, not pg_stat_user_tables: that view reads every
-- statistic of every table in the database (partitions included) before
-- filtering, about 0.3 ms of server CPU each second on the leader.
SELECT c.relname::text, pg_stat_get_dead_tuples(c.oid)
  FROM pg_class c
 WHERE c.relnamespace = 'awa'::regnamespace AND c.relname = ANY(%(tables)s)

-- name: take_live_census
-- Recount live jobs per queue and state for the operator reads (migration
-- 0025); returns seconds until the next census is due.
SELECT awa.take_live_census()

-- name: vacuum_jobs_hot
-- SKIP_LOCKED: never wait behind a lock; a table owner's privilege is
-- needed (a role without it gets a warning and autovacuum does the work).
-- PARALLEL 0: no parallel workers for the index pass. The leader vacuums
-- these small, hot tables every few seconds under load, and each parallel
-- vacuum started worker processes whose start-up and CPU came out of the
-- pool's share (a 10,000 jobs/s soak on 2 cores showed the vacuum waiting
-- on its workers in most samples, next to pickup p99 spikes).
VACUUM (SKIP_LOCKED, PARALLEL 0) awa.jobs_hot

-- name: vacuum_jobs_deferred
VACUUM (SKIP_LOCKED, PARALLEL 0) awa.jobs_deferred

-- name: vacuum_queues
VACUUM (SKIP_LOCKED, PARALLEL 0) awa.queues

-- name: forget_waiters
-- Waiters whose session ended without unregistering (killed mid-wait).
DELETE FROM awa.waiters w
 WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)
